"""`swaplab launch up`: bring a recipe's gang up on a cluster, and with `foreground` stay with it.

`up` checks every node (reachable, no other gang of the recipe, the port free), runs the
plan's local and prepare steps, starts the ranks detached in the engine's order, then
waits through the readiness stages: every rank alive, a ready marker in a rank's output
or `readiness.path` answering on the head, and a one-token completion on the head. A
fatal marker in any rank's output, or any rank exiting, fails the gang at once with that
rank's last lines; failing stops every rank. With `foreground` it then stays and
supervises until a rank exits (all are stopped, the run failed), `down` stops the gang,
or a signal asks it to (the run stopped).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import time
from collections.abc import Mapping

from swaplab.errors import SwaplabError
from swaplab.launch import doctor, remote, state
from swaplab.launch.cluster import Cluster
from swaplab.launch.down import STOPPED_BY_DOWN
from swaplab.launch.members import Member, find_gang, members_of, rank_env, stop_gang
from swaplab.launch.output import Observer
from swaplab.launch.plan import Plan, default_run_id, expand_home, make_plan
from swaplab.launch.prepare import node_home, prepare
from swaplab.launch.readiness import wait_ready
from swaplab.launch.remote import SshTarget
from swaplab.launch.settings import UpSettings
from swaplab.launch.spec import Recipe
from swaplab.launch.supervise import (
    POLL_SECONDS,
    GangFailed,
    StopRequested,
    Supervisor,
    until,
)


def up(recipe: Recipe, cluster: Cluster, settings: UpSettings, observer: Observer) -> state.RunRecord:
    """Bring the recipe's gang up on the cluster; returns the run's record once it is ready
    (or, with `settings.foreground`, once it ended): its outcome is ready, stopped or failed."""
    return asyncio.run(_up(recipe, cluster, settings, observer))


async def _up(recipe: Recipe, cluster: Cluster, settings: UpSettings, observer: Observer) -> state.RunRecord:
    plan = make_plan(recipe, cluster, run_id=default_run_id(recipe, cluster))
    # Read before anything starts, so a missing variable fails here; only ever held in
    # memory and sent through ssh's stdin (never an argv, a log line or the state file).
    secrets = recipe.resolve_secrets(os.environ)
    start_id = state.new_start_id()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        await until(_preflight(plan, observer), None, stop)
        folder = state.create_run(recipe.slug, start_id)
        record = state.RunRecord(
            start_id=start_id, run_id=plan.run_id, recipe=recipe.slug, recipe_path=str(recipe.path),
            cluster=cluster.name, engine=recipe.engine, head_url=plan.head_url, started_at=time.time(),
            foreground=settings.foreground, supervisor_pid=os.getpid(),
        )
        folder.save(record)
        observer.message(
            f"run {start_id} of {recipe.slug} on {cluster.name}: {len(plan.nodes)} node(s), serving at {plan.head_url}"
        )
        run = _Run(plan, folder, record, Supervisor(recipe, folder, observer), observer, secrets)
        try:
            await until(prepare(plan, observer, secrets), None, stop)
            timeout = recipe.readiness.timeout
            await until(
                run.start_ranks(), run.supervisor, stop,
                timeout=timeout, timeout_message=f"the ranks did not all start within {timeout:.0f} s",
            )
            await until(
                wait_ready(plan, run.supervisor, observer), run.supervisor, stop, timeout=timeout,
                timeout_message=(
                    f"not ready after {timeout:.0f} s ([readiness] timeout in the recipe); "
                    f"see `swaplab launch logs {shlex.quote(str(recipe.path))} --cluster {cluster.name}`"
                ),
            )
        except StopRequested:
            return await run.end("stopped", "stopped on request while starting")
        except GangFailed as failure:
            return await run.end("failed", str(failure))
        except BaseException:
            await run.end("failed", "up was interrupted")
            raise
        record.outcome = "ready"
        folder.save(record)
        observer.message(f"ready: {plan.head_url} (run {start_id})")
        if not settings.foreground:
            await run.supervisor.detach()
            return record
        return await run.supervise(stop)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


class _Run:
    """One `up` once its run exists: starting the ranks, staying with them, ending them."""

    def __init__(
        self, plan: Plan, folder: state.RunFolder, record: state.RunRecord, supervisor: Supervisor, observer: Observer,
        secrets: Mapping[str, str],
    ):
        self.plan = plan
        self.secrets = secrets
        self.folder = folder
        self.record = record
        self.supervisor = supervisor
        self.observer = observer

    async def start_ranks(self) -> None:
        """Start each rank detached, in the engine's order, waiting where a rank must be listening first."""
        plan, record = self.plan, self.record
        members = members_of(plan, record.start_id)
        homes: dict[str, str] = {}
        for index, member in enumerate(members):
            env = rank_env(plan, record.start_id, member.node)
            host = member.node.host.name
            if homes.get(host, "~") == "~":
                homes[host] = await node_home(member.target, [*member.step.argv, *env.values()])
            # A value that starts with ~/ (a process rank's HF_HOME) is the node's home, as in a command.
            argv = expand_home(member.step.argv, homes[host])
            env = dict(zip(env, expand_home(tuple(env.values()), homes[host]), strict=True))
            self.observer.message(f"starting {member.title}: {shlex.join(argv)}")
            pid = await remote.start_detached(
                member.target, member.directory, argv, env, {key: self.secrets[key] for key in member.step.secrets},
            )
            record.ranks.append(state.RankRecord(
                name=member.name, rank=member.rank, host=member.node.host.name, step=member.step.name,
                directory=member.directory, pid=pid,
            ))
            self.folder.save(record)
            self.supervisor.follow(member)
            if member.step.wait_for_port and index + 1 < len(members):
                await self._wait_listening(member, members[index + 1].target)
        self.observer.message(f"every rank started ({', '.join(f'{rank.name} pid {rank.pid}' for rank in record.ranks)})")

    async def _wait_listening(self, member: Member, seen_from: SshTarget) -> None:
        address, port = member.node.host.fabric_ip, member.step.wait_for_port
        self.observer.message(f"waiting for {address}:{port} ({member.title}) to accept connections")
        while not await remote.accepts(seen_from, address, port or 0):
            await asyncio.sleep(POLL_SECONDS)

    async def supervise(self, stop: asyncio.Event) -> state.RunRecord:
        """Stay with a ready gang until a rank ends it, `down` does, or a signal asks to stop."""
        stopped = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(self.supervisor.failed.wait())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        failed.cancel()
        if stop.is_set():
            return await self.end("stopped", "stopped on request")
        if self.folder.down_requested:
            return await self.end("stopped", STOPPED_BY_DOWN)
        return await self.end("failed", self.supervisor.cause)

    async def end(self, outcome: str, cause: str) -> state.RunRecord:
        """Stop every rank of the gang, record how the run ended, report it."""
        self.supervisor.stopping = True
        if outcome == "failed":
            self.observer.message(f"the gang failed: {cause}")
        self.observer.message("stopping every rank")
        try:
            await stop_gang(self.plan.recipe, self.plan.cluster)
        finally:
            await self.supervisor.detach()
            self.record.outcome, self.record.cause = outcome, cause
            self.folder.save(self.record)
        self.observer.message(f"run {self.record.start_id} {outcome}" + ("" if outcome == "failed" else f": {cause}"))
        return self.record


async def _preflight(plan: Plan, observer: Observer) -> None:
    """Every node reachable, no live gang of the recipe (orphans are reaped), what `up` needs free."""
    targets = [remote.target_for(plan.cluster, host) for host in plan.cluster.hosts]
    await asyncio.gather(*(remote.connect(target) for target in targets))
    await _reap_or_refuse(plan, observer)
    problems = await doctor.preflight(plan)
    if problems:
        raise SwaplabError("preflight failed:\n" + "\n".join(f"  {problem}" for problem in problems))


async def _reap_or_refuse(plan: Plan, observer: Observer) -> None:
    """Stop what is left of earlier runs whose supervisor is gone; refuse to start beside a live one."""
    recipe, cluster = plan.recipe, plan.cluster
    found = await find_gang(recipe, cluster, cluster.hosts)
    # Only rank processes carry SWAPLAB_START; the rest (an output loop whose reader left) go with them.
    starts = {
        process.labels["SWAPLAB_START"]
        for processes in found.values() for process in processes if "SWAPLAB_START" in process.labels
    }
    if not starts:
        return
    live = sorted(start for start in starts if not _orphaned(recipe, start))
    if live:
        hosts = ", ".join(
            host.name for host, processes in found.items()
            if any(process.labels.get("SWAPLAB_START") in live for process in processes)
        )
        raise SwaplabError(
            f"{recipe.slug} already runs on {hosts} (run {live[0]}); stop it first with "
            f"`swaplab launch down {shlex.quote(str(recipe.path))} --cluster {cluster.name}` "
            "(`status` shows it)"
        )
    observer.message(f"stopping what is left of run(s) {', '.join(sorted(starts))}: no swaplab supervises them any more")
    await stop_gang(recipe, cluster)


def _orphaned(recipe: Recipe, start_id: str) -> bool:
    """A run nobody looks after: it ended (yet something survived), or its foreground `up` is gone.

    A detached run started here, or a run started from another machine, is never an orphan.
    """
    folder = state.find_run(recipe.slug, start_id)
    record = folder.load() if folder else None
    if record is None:
        return False
    return record.ended or (record.foreground and not state.supervisor_alive(record))
