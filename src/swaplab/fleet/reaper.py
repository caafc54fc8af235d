"""Zero orphans: pid files for the next start, process-group kills and descendant sweeps.

A pid file makes the next router kill a process group, so it is trusted only so far: it is read
from the router's own state folder (`ownfolder`), and a process is killed only when it is what the
file says: the group's leader, if it lives, started when the file says, and every process killed
carries the token its router put in its backends' environment (which only that user can read).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

from swaplab.ownfolder import own_folder, read_own, write_private

log = logging.getLogger("swaplab.fleet")

TOKEN_VARIABLE = "SWAPLAB_BACKEND_TOKEN"
"""In each backend's environment: the token its router wrote in its pid files."""
# psutil's start times are read against the boot time, which a clock step moves.
START_TIME_SLACK = 1.0

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
            if os.getpgid(process.pid) == pgid and process.info["create_time"] >= not_before - START_TIME_SLACK:
                members.append(process)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


@dataclass(frozen=True)
class PidEntry:
    """What a pid file says: a model's server, the group it leads, when it started, whose it is."""

    model: str
    pgid: int
    create_time: float
    router_pid: int
    token: str

    @classmethod
    def parse(cls, data: bytes) -> PidEntry:
        """The entry a pid file holds; ValueError when it is not one a router wrote."""
        document = json.loads(data)
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        fields = {"model": str, "pgid": int, "create_time": (int, float), "router_pid": int, "token": str}
        for name, kind in fields.items():
            value = document.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"no {name}")
        if document["pgid"] <= 1 or not document["token"]:
            raise ValueError("no process group or token")
        return cls(**{name: document[name] for name in fields})


def started_by(entry: PidEntry) -> list[psutil.Process]:
    """The processes of the entry's group that are what the entry says; [] with a warning when the
    leader lives but is another process. Others in the group (not carrying the entry's token) are
    left alone, with a warning."""
    try:
        leader_started = psutil.Process(entry.pgid).create_time()
    except psutil.NoSuchProcess:
        leader_started = None  # gone: what it spawned may still be there
    except psutil.Error:
        return []
    if leader_started is not None and abs(leader_started - entry.create_time) > START_TIME_SLACK:
        log.warning("pid file of %s ignored: process %d did not start when it says (another process, or the file "
                    "was not written by swaplab)", entry.model, entry.pgid)
        return []
    ours, strangers = [], 0
    for process in _group_members(entry.pgid, entry.create_time):
        try:
            token = process.environ().get(TOKEN_VARIABLE)
        except psutil.Error:
            token = None
        if token == entry.token:
            ours.append(process)
        else:
            strangers += 1
    if strangers:
        log.warning("pid file of %s: %d process(es) in group %d were not started by its router; left alone",
                    entry.model, strangers, entry.pgid)
    return ours


class PidFiles:
    """One file per running backend, so the next router can reap what a hard crash left."""

    def __init__(self, directory: Path):
        self.directory = own_folder(directory, "the state folder (--state-dir)")
        self.token = secrets.token_hex(16)
        """This router's: in every backend's environment and every pid file, so the next router kills only those."""

    @property
    def environment(self) -> dict[str, str]:
        """What a backend's environment carries for the reaper."""
        return {TOKEN_VARIABLE: self.token}

    def _path(self, model_id: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
        return self.directory / f"backend-{safe}.json"

    def record(self, model_id: str, pid: int) -> None:
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        entry = {"model": model_id, "pid": pid, "pgid": pid, "create_time": create_time, "router_pid": os.getpid(),
                 "token": self.token}
        write_private(self._path(model_id), json.dumps(entry).encode())

    def remove(self, model_id: str) -> None:
        self._path(model_id).unlink(missing_ok=True)

    def reap_leftovers(self, grace_seconds: float = 5.0) -> list[str]:
        """Kill the process groups that a previous, now dead, router left; returns their model ids."""
        reaped = []
        for path in sorted(self.directory.glob("backend-*.json")):
            try:
                entry = PidEntry.parse(read_own(path))
            except (OSError, ValueError) as error:
                log.warning("pid file %s ignored and removed: %s", path, error)
                path.unlink(missing_ok=True)
                continue
            if entry.router_pid != os.getpid() and psutil.pid_exists(entry.router_pid):
                continue  # its router still runs: not ours to touch
            members = started_by(entry)
            if members:
                log.warning("reaping %d leftover process(es) of %s from a previous run", len(members), entry.model)
                for member in members:
                    try:
                        member.terminate()
                    except psutil.Error:
                        pass
                _, alive = psutil.wait_procs(members, timeout=grace_seconds)
                kill_all(alive)
                psutil.wait_procs(alive, timeout=grace_seconds)
                reaped.append(entry.model)
            path.unlink(missing_ok=True)
        return reaped

