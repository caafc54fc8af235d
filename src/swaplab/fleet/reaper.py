"""Zero orphans: pid files for the next start, process-group kills and descendant sweeps."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
from pathlib import Path

import psutil

log = logging.getLogger("swaplab.fleet")

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the pid file sweep still covers a hard crash
    _prctl = None


def die_with_parent() -> None:
    """preexec_fn for backends: SIGTERM the child when the router dies, even by SIGKILL.

    SIGTERM rather than SIGKILL so that a server with workers of its own (vLLM,
    SGLang) can take them down with it. Linux delivers it when the *thread* that
    forked exits; the router forks from its event loop's thread, which lives as long
    as the process. What still escapes is reaped through the pid file at next start.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group is already empty."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("not allowed to signal process group %d", pgid)
        return False


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_all(processes: list[psutil.Process]) -> None:
    """SIGKILL whichever of `processes` still run (psutil checks they are the same processes)."""
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass


def _group_members(pgid: int, not_before: float) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter(["create_time"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["create_time"] >= not_before - 1:
                members.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


class PidFiles:
    """One file per running backend, so the next router can reap what a hard crash left."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, model_id: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
        return self.directory / f"backend-{safe}.json"

    def record(self, model_id: str, pid: int) -> None:
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        entry = {"model": model_id, "pid": pid, "pgid": pid, "create_time": create_time, "router_pid": os.getpid()}
        path = self._path(model_id)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entry))
        temporary.replace(path)

    def remove(self, model_id: str) -> None:
        self._path(model_id).unlink(missing_ok=True)

    def reap_leftovers(self, grace_seconds: float = 5.0) -> list[str]:
        """Kill the process groups that a previous, now dead, router left; returns their model ids."""
        reaped = []
        for path in sorted(self.directory.glob("backend-*.json")):
            try:
                entry = json.loads(path.read_text())
                router_pid, pgid, created = entry["router_pid"], entry["pgid"], entry["create_time"]
            except (OSError, ValueError, KeyError):
                path.unlink(missing_ok=True)
                continue
            if router_pid != os.getpid() and psutil.pid_exists(router_pid):
                continue  # its router still runs: not ours to touch
            members = _group_members(pgid, created)
            if members:
                log.warning("reaping %d leftover process(es) of %s from a previous run", len(members), entry["model"])
                for member in members:
                    try:
                        member.terminate()
                    except psutil.Error:
                        pass
                _, alive = psutil.wait_procs(members, timeout=grace_seconds)
                kill_all(alive)
                psutil.wait_procs(alive, timeout=grace_seconds)
                reaped.append(entry["model"])
            path.unlink(missing_ok=True)
        return reaped

