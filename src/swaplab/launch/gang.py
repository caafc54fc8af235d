"""A recipe's ranks across a cluster's nodes, run as one gang: up, down, status, logs.

`up` checks every node (reachable, no other gang of the recipe, the port free), runs the
plan's local and prepare steps, starts the ranks detached in the engine's order, then
waits through the readiness stages: every rank alive, a ready marker in a rank's output
or `readiness.path` answering on the head, and a one-token completion on the head. A
fatal marker in any rank's output, or any rank exiting, fails the gang at once with that
rank's last lines; failing stops every rank. With `--foreground` it then stays and
supervises until a rank exits (all are stopped, exit 1 with the cause), `down` stops the
gang, or a signal asks it to (exit 0).

Every rank process carries the launcher's variables in its environment (for container
engines the docker client does, and the container carries labels): `SWAPLAB_RECIPE`,
`SWAPLAB_RUN`, `SWAPLAB_START`, `SWAPLAB_RANK`... `down` and `status` find the gang by
them on every node, with no state file needed, so orphans are found as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

import psutil

from swaplab.client import OpenAIClient, ServerUnreachableError
from swaplab.errors import SwaplabError
from swaplab.launch import doctor, remote, state
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.plan import (
    NodePlan,
    Plan,
    default_run_id,
    expand_home,
    make_plan,
)
from swaplab.launch.remote import RemoteError, SshTarget
from swaplab.launch.spec import Recipe, Step

STOP_GRACE_SECONDS = 10
TAIL_LINES = 20
POLL_SECONDS = 1.0
# A probe of the head must not hang on a server that accepted and went quiet.
PROBE_TIMEOUT_SECONDS = 30.0
ENDED = ("failed", "stopped")


class GangFailed(Exception):
    """The gang could not start or stopped serving; the message says which rank and why."""


class StopRequested(Exception):
    """A signal asked `up` to stop the gang."""


def say(text: str) -> None:
    """A launcher message (rank output goes to stdout; these go to stderr)."""
    print(f"swaplab launch: {text}", file=sys.stderr, flush=True)


def recipe_label(recipe: Recipe) -> str:
    """NAME=VALUE in the environment of every process of the recipe's gangs."""
    return f"SWAPLAB_RECIPE={recipe.slug}"


def docker_filter(recipe: Recipe) -> str:
    """`docker ps --filter` value for the recipe's containers (the plan labels them)."""
    return f"label=swaplab.recipe={recipe.slug}"


def rank_env(plan: Plan, start_id: str, node: NodePlan) -> dict[str, str]:
    """The environment added to a rank process on its node.

    For engine "process" that is the plan's env (recipe, cluster NCCL table, launcher
    variables); container engines have theirs in `docker run -e` already, so the docker
    client gets only the labels.
    """
    labels = {
        "SWAPLAB_RECIPE": plan.recipe.slug,
        "SWAPLAB_RECIPE_HASH": plan.recipe.digest(),
        "SWAPLAB_RUN": plan.run_id,
        "SWAPLAB_START": start_id,
        "SWAPLAB_RANK": str(node.rank),
    }
    if plan.recipe.engine == "process":
        return {**node.env, **labels}
    return labels


@dataclass(frozen=True)
class Member:
    """One long-running process of the gang: a rank step on its node."""

    node: NodePlan
    step: Step
    name: str  # rank-N, or rank-N-STEP for a second long-running step on the same rank
    directory: str
    target: SshTarget

    @property
    def rank(self) -> int:
        return self.node.rank

    @property
    def title(self) -> str:
        extra = "" if self.name == f"rank-{self.rank}" else f" ({self.step.name})"
        return f"rank {self.rank}{extra} on {self.node.host.name}"

    @property
    def prefix(self) -> str:
        return line_prefix(self.rank, self.name, self.step.name)


def line_prefix(rank: int, name: str, step: str) -> str:
    """What each output line of a rank process starts with: `[rank N] ` (`[rank N STEP] ` for a second one)."""
    extra = "" if name == f"rank-{rank}" else f" {step}"
    return f"[rank {rank}{extra}] "


def members_of(plan: Plan, start_id: str) -> list[Member]:
    """The gang's long-running processes in the engine's start order."""
    members = []
    seen: set[int] = set()
    for node, step in plan.rank_steps():
        name = f"rank-{node.rank}"
        if node.rank in seen:
            name += "-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", step.name)
        seen.add(node.rank)
        members.append(Member(
            node=node, step=step, name=name, directory=state.node_directory(plan.recipe.slug, start_id, name),
            target=remote.target_for(plan.cluster, node.host),
        ))
    return members


class Supervisor:
    """Follows every member's output and exit; the one owner of the gang's outcome while `up` runs.

    Output is mirrored into the run's folder, echoed with its rank prefix, and matched
    against the readiness markers. The first fatal marker or exit is the failure.
    """

    def __init__(self, recipe: Recipe, folder: state.RunFolder, *, echo: bool = True):
        self.folder = folder
        self.echo = echo
        self.label = recipe_label(recipe)
        self.ready_patterns = [re.compile(pattern) for pattern in recipe.readiness.ready]
        self.fatal_patterns = [re.compile(pattern) for pattern in recipe.readiness.fatal]
        self.ready_marker = asyncio.Event()
        self.ready_line = ""
        self.failed = asyncio.Event()
        self.cause = ""
        self.stopping = False
        self._tails: dict[str, deque[str]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def follow(self, member: Member) -> None:
        self._tails[member.name] = deque(maxlen=TAIL_LINES)
        self._tasks.append(asyncio.get_running_loop().create_task(self._follow(member), name=f"follow {member.name}"))

    async def detach(self) -> None:
        """Stop following (the ranks keep running on their nodes)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def tail(self, member_name: str) -> str:
        return "\n".join(f"    {line}" for line in self._tails.get(member_name, ()))

    def fail(self, member: Member | None, cause: str) -> None:
        """Record the gang's failure, unless one is already recorded or the gang is being stopped."""
        if self.cause or self.stopping:
            return
        if member is not None:
            tail = self.tail(member.name)
            cause += f"; its last lines:\n{tail}" if tail else "; it printed nothing"
        self.cause = cause
        self.failed.set()

    def _line(self, member: Member, line: str) -> None:
        self._tails[member.name].append(line)
        if self.echo:
            print(f"{member.prefix}{line}", flush=True)
        for pattern in self.fatal_patterns:
            if pattern.search(line):
                self.fail(member, f"{member.title} printed the fatal marker {pattern.pattern!r}")
                return
        if not self.ready_marker.is_set():
            for pattern in self.ready_patterns:
                if pattern.search(line):
                    self.ready_line = f"{member.title}: {line.strip()}"
                    self.ready_marker.set()
                    return

    async def _follow(self, member: Member) -> None:
        splitter = state.LineSplitter()
        while True:
            offset = self.folder.mirrored_bytes(member.name)
            process = await remote.follow_output(member.target, member.directory, offset, label=self.label)
            assert process.stdout is not None
            async with remote.owned(process):
                while chunk := await process.stdout.read(65536):
                    self.folder.append_output(member.name, chunk)
                    for line in splitter.feed(chunk):
                        self._line(member, line)
            try:
                condition, value = await remote.rank_state(member.target, member.directory)
            except RemoteError as error:
                self.fail(member, f"lost contact with {member.title}: {error}")
                return
            if condition != "running":
                break
            # The stream broke (a dropped connection), not the rank: follow on from where it stopped.
            await asyncio.sleep(POLL_SECONDS)
        for line in splitter.flush():
            self._line(member, line)
        if condition == "exited":
            self.fail(member, f"{member.title} exited with code {value}")
        else:
            self.fail(member, f"{member.title} was killed (no exit status recorded)")


async def _until(
    work: Awaitable[object], supervisor: Supervisor | None, stop: asyncio.Event, *, timeout: float | None = None,
    timeout_message: str = "",
) -> object:
    """Run `work` unless the gang fails, a stop is asked for, or `timeout` passes first."""
    task = asyncio.ensure_future(work)
    watchers = {asyncio.ensure_future(stop.wait())}
    if supervisor is not None:
        watchers.add(asyncio.ensure_future(supervisor.failed.wait()))
    try:
        done, _ = await asyncio.wait({task, *watchers}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for watcher in watchers:
            watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    if stop.is_set():
        raise StopRequested()
    if supervisor is not None and supervisor.cause:
        raise GangFailed(supervisor.cause)
    raise GangFailed(timeout_message)


# -- up ---------------------------------------------------------------------------------


def up(recipe: Recipe, cluster: Cluster, *, foreground: bool) -> int:
    """Bring the recipe's gang up on the cluster; 0 once ready (or, `foreground`, once asked to stop)."""
    return asyncio.run(_up(recipe, cluster, foreground=foreground))


async def _up(recipe: Recipe, cluster: Cluster, *, foreground: bool) -> int:
    plan = make_plan(recipe, cluster, run_id=default_run_id(recipe, cluster))
    start_id = state.new_start_id()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        await _until(_preflight(plan), None, stop)
        folder = state.create_run(recipe.slug, start_id)
        record = state.RunRecord(
            start_id=start_id, run_id=plan.run_id, recipe=recipe.slug, recipe_path=str(recipe.path),
            cluster=cluster.name, engine=recipe.engine, head_url=plan.head_url, started_at=time.time(),
            foreground=foreground, supervisor_pid=os.getpid(),
        )
        folder.save(record)
        say(f"run {start_id} of {recipe.slug} on {cluster.name}: {len(plan.nodes)} node(s), serving at {plan.head_url}")
        supervisor = Supervisor(recipe, folder)
        try:
            await _until(_prepare(plan), None, stop)
            timeout = recipe.readiness.timeout
            await _until(
                _start_ranks(plan, start_id, record, folder, supervisor), supervisor, stop,
                timeout=timeout, timeout_message=f"the ranks did not all start within {timeout:.0f} s",
            )
            await _until(
                _ready(plan, supervisor), supervisor, stop, timeout=timeout,
                timeout_message=(
                    f"not ready after {timeout:.0f} s ([readiness] timeout in the recipe); "
                    f"see `swaplab launch logs {shlex.quote(str(recipe.path))} --cluster {cluster.name}`"
                ),
            )
        except StopRequested:
            return await _end(plan, folder, record, supervisor, "stopped", "stopped on request while starting", code=0)
        except GangFailed as failure:
            return await _end(plan, folder, record, supervisor, "failed", str(failure), code=1)
        except BaseException:
            await _end(plan, folder, record, supervisor, "failed", "up was interrupted", code=1)
            raise
        record.outcome = "ready"
        folder.save(record)
        say(f"ready: {plan.head_url} (run {start_id})")
        if not foreground:
            await supervisor.detach()
            return 0
        return await _supervise(plan, folder, record, supervisor, stop)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


async def _supervise(
    plan: Plan, folder: state.RunFolder, record: state.RunRecord, supervisor: Supervisor, stop: asyncio.Event
) -> int:
    """Stay with a ready gang until a rank ends it, `down` does, or a signal asks to stop."""
    stopped = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(supervisor.failed.wait())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    failed.cancel()
    if stop.is_set():
        return await _end(plan, folder, record, supervisor, "stopped", "stopped on request", code=0)
    if folder.down_requested:
        return await _end(plan, folder, record, supervisor, "stopped", "stopped by `swaplab launch down`", code=0)
    return await _end(plan, folder, record, supervisor, "failed", supervisor.cause, code=1)


async def _end(
    plan: Plan, folder: state.RunFolder, record: state.RunRecord, supervisor: Supervisor, outcome: str, cause: str,
    *, code: int,
) -> int:
    """Stop every rank of the gang, record how the run ended, report it; returns `code`."""
    supervisor.stopping = True
    if outcome == "failed":
        say(f"the gang failed: {cause}")
    say("stopping every rank")
    try:
        await _stop_gang(plan.recipe, plan.cluster)
    finally:
        await supervisor.detach()
        record.outcome, record.cause = outcome, cause
        folder.save(record)
    say(f"run {record.start_id} {outcome}" + ("" if outcome == "failed" else f": {cause}"))
    return code


async def _preflight(plan: Plan) -> None:
    """Every node reachable, no live gang of the recipe (orphans are reaped), what `up` needs free."""
    targets = [remote.target_for(plan.cluster, host) for host in plan.cluster.hosts]
    await asyncio.gather(*(remote.connect(target) for target in targets))
    await _reap_or_refuse(plan)
    problems = await doctor.preflight(plan)
    if problems:
        raise SwaplabError("preflight failed:\n" + "\n".join(f"  {problem}" for problem in problems))


async def _reap_or_refuse(plan: Plan) -> None:
    """Stop what is left of earlier runs whose supervisor is gone; refuse to start beside a live one."""
    recipe, cluster = plan.recipe, plan.cluster
    found = await _find_gang(recipe, cluster.hosts, plan.cluster)
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
    say(f"stopping what is left of run(s) {', '.join(sorted(starts))}: no swaplab supervises them any more")
    await _stop_gang(recipe, cluster)


def _orphaned(recipe: Recipe, start_id: str) -> bool:
    """A run nobody looks after: it ended (yet something survived), or its foreground `up` is gone.

    A detached run started here, or a run started from another machine, is never an orphan.
    """
    folder = state.find_run(recipe.slug, start_id)
    record = folder.load() if folder else None
    if record is None:
        return False
    return record.outcome in ENDED or (record.foreground and not _supervisor_alive(record))


async def _prepare(plan: Plan) -> None:
    """The local steps (once, here), then every node's prepare steps (nodes side by side)."""
    for node in plan.nodes:
        for step in node.steps:
            if step.kind == "local":
                await _run_local(step)
    await asyncio.gather(*(_prepare_node(plan, node) for node in plan.nodes))


async def _run_local(step: Step) -> None:
    say(f"{step.name} (here): {shlex.join(step.argv)}")
    try:
        process = await asyncio.create_subprocess_exec(
            *step.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as error:
        raise GangFailed(f"{step.name} could not start here: {error}") from None
    tail = await _echo_lines(process, "[local] ")
    if await process.wait() != 0:
        raise GangFailed(f"{step.name} failed here with code {process.returncode}; its last lines:\n{tail}")


async def _echo_lines(process: asyncio.subprocess.Process, prefix: str) -> str:
    """Print a process's output with `prefix` as it comes; returns its last lines."""
    assert process.stdout is not None
    splitter = state.LineSplitter()
    last: deque[str] = deque(maxlen=TAIL_LINES)
    while chunk := await process.stdout.read(65536):
        for line in splitter.feed(chunk):
            last.append(line)
            print(f"{prefix}{line}", flush=True)
    for line in splitter.flush():
        last.append(line)
        print(f"{prefix}{line}", flush=True)
    return "\n".join(f"    {line}" for line in last)


async def _prepare_node(plan: Plan, node: NodePlan) -> None:
    target = remote.target_for(plan.cluster, node.host)
    home = await _home(target, node.steps)
    for step in node.steps:
        if step.kind != "prepare":
            continue
        argv = expand_home(step.argv, home)
        if step.skip_if and (await remote.run(target, expand_home(step.skip_if, home))).ok:
            say(f"{step.name} on {node.host.name}: already done")
            continue
        if step.skip_if_same and await _same_here_and_there(target, step.skip_if_same):
            say(f"{step.name} on {node.host.name}: already done (same as here)")
            continue
        say(f"{step.name} on {node.host.name}: {shlex.join(argv)}")
        await _run_prepare(target, node, step, argv)


async def _home(target: SshTarget, steps: Sequence[Step]) -> str:
    """The node user's home, asked only when a step has a `~/` to expand."""
    words = [word for step in steps for word in (*step.argv, *step.skip_if)]
    if not any(word == "~" or word.startswith("~/") for word in words):
        return "~"
    return (await remote.check(target, ["printenv", "HOME"], what="reading $HOME")).strip()


async def _same_here_and_there(target: SshTarget, argv: tuple[str, ...]) -> bool:
    here = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    local_output, _ = await here.communicate()
    there = await remote.run(target, argv)
    local_text = local_output.decode(errors="replace").strip()
    return here.returncode == 0 and there.ok and bool(local_text) and local_text == there.stdout.strip()


async def _run_prepare(target: SshTarget, node: NodePlan, step: Step, argv: tuple[str, ...]) -> None:
    """A prepare step to completion, output echoed; its input piped from a local command when it has one."""
    feeder = None
    read_end = None
    if step.stdin_from:
        read_end, write_end = os.pipe()
        try:
            feeder = await asyncio.create_subprocess_exec(
                *step.stdin_from, stdin=asyncio.subprocess.DEVNULL, stdout=write_end, stderr=asyncio.subprocess.PIPE
            )
        finally:
            os.close(write_end)
    try:
        process = await remote.open_stream(target, argv, with_stderr=True, stdin=read_end)
    finally:
        if read_end is not None:
            os.close(read_end)
    tail = await _echo_lines(process, f"[rank {node.rank} {step.name}] ")
    code = await process.wait()
    if feeder is not None:
        _, feeder_errors = await feeder.communicate()
        if feeder.returncode != 0:
            raise GangFailed(
                f"{step.name}: `{shlex.join(step.stdin_from)}` failed here with code {feeder.returncode}: "
                f"{feeder_errors.decode(errors='replace').strip()}"
            )
    if code == remote.SSH_EXIT_CONNECTION_FAILED:
        raise remote.unreachable(target, tail)
    if code != 0:
        raise GangFailed(f"{step.name} failed on {node.host.name} with code {code}; its last lines:\n{tail}")


async def _start_ranks(
    plan: Plan, start_id: str, record: state.RunRecord, folder: state.RunFolder, supervisor: Supervisor
) -> None:
    """Start each rank detached, in the engine's order, waiting where a rank must be listening first."""
    members = members_of(plan, start_id)
    homes: dict[str, str] = {}
    for index, member in enumerate(members):
        if member.node.host.name not in homes:
            homes[member.node.host.name] = await _home(member.target, [member.step])
        argv = expand_home(member.step.argv, homes[member.node.host.name])
        say(f"starting {member.title}: {shlex.join(argv)}")
        pid = await remote.start_detached(member.target, member.directory, argv, rank_env(plan, start_id, member.node))
        record.ranks.append(state.RankRecord(
            name=member.name, rank=member.rank, host=member.node.host.name, step=member.step.name,
            directory=member.directory, pid=pid,
        ))
        folder.save(record)
        supervisor.follow(member)
        if member.step.wait_for_port and index + 1 < len(members):
            await _wait_listening(member, members[index + 1].target)
    say(f"every rank started ({', '.join(f'{rank.name} pid {rank.pid}' for rank in record.ranks)})")


async def _wait_listening(member: Member, seen_from: SshTarget) -> None:
    address, port = member.node.host.fabric_ip, member.step.wait_for_port
    say(f"waiting for {address}:{port} ({member.title}) to accept connections")
    while not await remote.accepts(seen_from, address, port or 0):
        await asyncio.sleep(POLL_SECONDS)


async def _ready(plan: Plan, supervisor: Supervisor) -> None:
    """The readiness stages after every rank is alive: marker or path, then a one-token completion."""
    readiness = plan.recipe.readiness
    async with OpenAIClient(plan.head_url, read_timeout=PROBE_TIMEOUT_SECONDS, connect_timeout=5) as client:
        if readiness.ready or readiness.path:
            waiting_for = [f"a ready marker ({' | '.join(readiness.ready)})"] if readiness.ready else []
            waiting_for += [f"{readiness.path} answering 200 on the head"] if readiness.path else []
            say(f"waiting for {' or '.join(waiting_for)}")
            while not supervisor.ready_marker.is_set():
                if readiness.path and await _answers(client, readiness.path):
                    say(f"{plan.head_url}{readiness.path} answers 200")
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(supervisor.ready_marker.wait(), POLL_SECONDS)
            if supervisor.ready_marker.is_set():
                say(f"ready marker: {supervisor.ready_line}")
        say("waiting for a one-token completion on the head")
        while True:
            answer = await _one_token(client)
            if answer is not None:
                say(f"the head answered a one-token completion ({answer})")
                return
            await asyncio.sleep(POLL_SECONDS)


async def _answers(client: OpenAIClient, path: str) -> bool:
    try:
        status, _ = await client.get_json(path)
    except ServerUnreachableError:
        return False
    return status == 200


async def _one_token(client: OpenAIClient) -> str | None:
    """'model M: "text"' once the head completes one token, else None."""
    try:
        status, document = await client.get_json("/v1/models")
    except ServerUnreachableError:
        return None
    models = (document or {}).get("data") if isinstance(document, dict) else None
    if status != 200 or not models:
        return None
    model = models[0].get("id", "")
    result = await client.complete(model, "Hi", max_tokens=1, stream=False)
    if result.ok and result.status == 200:
        return f"model {model}: {result.text!r}"
    return None


# -- down -------------------------------------------------------------------------------


def down(recipe: Recipe, cluster: Cluster) -> int:
    """Stop every process and container of the recipe's gangs on every node of the cluster."""
    return asyncio.run(_down(recipe, cluster))


async def _down(recipe: Recipe, cluster: Cluster) -> int:
    for folder in state.runs(recipe.slug, cluster.name):
        record = folder.load()
        if record is not None and record.outcome not in ENDED:
            folder.request_down()
    stopped = await _stop_gang(recipe, cluster)
    for host, count in stopped.items():
        say(f"{host.name}: " + (f"stopped {count} process(es) or container(s) of the gang" if count else "nothing of the gang was running"))
    for folder in state.runs(recipe.slug, cluster.name):
        record = folder.load()
        if record is not None and record.outcome not in ENDED and not _supervisor_alive(record):
            record.outcome, record.cause = "stopped", "stopped by `swaplab launch down`"
            folder.save(record)
    return 0


def _supervisor_alive(record: state.RunRecord) -> bool:
    """Whether a foreground `up` still watches this run (it records the outcome itself then)."""
    if not record.foreground:
        return False
    try:
        return psutil.Process(record.supervisor_pid).create_time() <= record.started_at + 1
    except psutil.Error:
        return False


async def _stop_gang(recipe: Recipe, cluster: Cluster) -> dict[Host, int]:
    """SIGTERM, then SIGKILL after the grace, every labelled process (and container) of the
    recipe on every host of the cluster; returns how many each host had."""
    async def stop_on(host: Host) -> int:
        target = remote.target_for(cluster, host)
        count = 0
        if recipe.engine != "process":
            count += await _stop_containers(target, recipe)
        count += len(await remote.stop_labeled(target, recipe_label(recipe), grace_seconds=STOP_GRACE_SECONDS))
        return count

    counts = await asyncio.gather(*(stop_on(host) for host in cluster.hosts))
    return dict(zip(cluster.hosts, counts, strict=True))


async def _stop_containers(target: SshTarget, recipe: Recipe) -> int:
    listed = await remote.run(target, ["docker", "ps", "--all", "--quiet", "--filter", docker_filter(recipe)])
    containers = listed.stdout.split() if listed.ok else []
    if containers:
        await remote.run(target, ["docker", "stop", "--time", str(STOP_GRACE_SECONDS), *containers])
        await remote.run(target, ["docker", "rm", "--force", *containers])
    return len(containers)


# -- status -----------------------------------------------------------------------------


def status(recipe: Recipe, cluster: Cluster) -> int:
    """Print the gang's processes on every node and whether the head serves; 0 when all ranks run."""
    return asyncio.run(_status(recipe, cluster))


async def _find_gang(
    recipe: Recipe, hosts: Sequence[Host], cluster: Cluster
) -> dict[Host, list[remote.LabeledProcess]]:
    found = await asyncio.gather(
        *(remote.find_labeled(remote.target_for(cluster, host), recipe_label(recipe)) for host in hosts)
    )
    return dict(zip(hosts, found, strict=True))


async def _status(recipe: Recipe, cluster: Cluster) -> int:
    hosts = cluster.hosts[: recipe.required_nodes]
    found = await _find_gang(recipe, cluster.hosts, cluster)
    folder = state.latest_run(recipe.slug, cluster.name)
    record = folder.load() if folder else None
    if record is not None:
        print(f"last run here: {record.start_id} ({'foreground' if record.foreground else 'detached'}), {record.outcome}"
              + (f": {record.cause.splitlines()[0]}" if record.cause else ""))
    running_ranks = 0
    for rank, host in enumerate(hosts):
        # Hosts may share a machine (the loopback test cluster): each shows its own rank only.
        processes = [p for p in found[host] if p.labels.get("SWAPLAB_RANK") == str(rank)]
        roots = _rank_roots(processes)
        if not roots:
            print(f"rank {rank}  {host.name}  not running")
            continue
        running_ranks += 1
        for root in roots:
            command = next((p.command for p in processes if p.parent == root.pid), root.command)
            print(
                f"rank {rank}  {host.name}  running  pid {root.pid}  run {root.labels.get('SWAPLAB_START', '?')}  "
                f"{_shorten(command)}"
            )
    if recipe.engine != "process":
        for host in hosts:
            listed = await remote.run(
                remote.target_for(cluster, host),
                ["docker", "ps", "--filter", docker_filter(recipe), "--format", "{{.Names}}\t{{.Status}}"],
            )
            for line in listed.stdout.splitlines():
                print(f"container  {host.name}  {line}")
    head_url = make_plan(recipe, cluster, run_id=default_run_id(recipe, cluster)).head_url
    async with OpenAIClient(head_url, read_timeout=PROBE_TIMEOUT_SECONDS, connect_timeout=5) as client:
        answer = await _one_token(client) if running_ranks else None
    print(f"head {head_url}: " + (f"serving ({answer})" if answer else "not serving"))
    return 0 if running_ranks == len(hosts) and answer else 1


def _rank_roots(processes: list[remote.LabeledProcess]) -> list[remote.LabeledProcess]:
    """The processes whose parent is not itself part of the gang: each rank's wrapper."""
    pids = {process.pid for process in processes}
    return [process for process in processes if process.parent not in pids]


def _shorten(text: str, width: int = 120) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# -- logs -------------------------------------------------------------------------------


def logs(recipe: Recipe, cluster: Cluster, *, rank: int | None, follow: bool) -> int:
    """Print the last run's output, every line prefixed with its rank; `follow` keeps printing."""
    try:
        return asyncio.run(_logs(recipe, cluster, rank=rank, follow=follow))
    except KeyboardInterrupt:
        return 0


async def _logs(recipe: Recipe, cluster: Cluster, *, rank: int | None, follow: bool) -> int:
    folder = state.latest_run(recipe.slug, cluster.name)
    record = folder.load() if folder else None
    if folder is None or record is None:
        raise SwaplabError(
            f"no run of {recipe.slug} on cluster {cluster.name} was started from this machine "
            f"(looked in {state.recipe_folder(recipe.slug)}); start one with `swaplab launch up`"
        )
    ranks = [entry for entry in record.ranks if rank is None or entry.rank == rank]
    if not ranks:
        known = ", ".join(str(entry.rank) for entry in record.ranks) or "none started"
        raise SwaplabError(f"run {record.start_id} has no rank {rank}; its ranks: {known}")
    targets = {entry.name: _target_by_name(cluster, entry.host) for entry in ranks}

    async def fetch(entry: state.RankRecord) -> None:
        try:
            data = await remote.read_output(targets[entry.name], entry.directory, folder.mirrored_bytes(entry.name))
        except RemoteError as error:
            say(f"{entry.host} cannot be read ({error}); showing this machine's copy of rank {entry.rank}")
            return
        folder.append_output(entry.name, data)

    await asyncio.gather(*(fetch(entry) for entry in ranks))
    splitters = {}
    for entry in ranks:
        prefix = _prefix(entry)
        splitters[entry.name] = state.LineSplitter()
        lines = splitters[entry.name].feed(folder.read_output(entry.name))
        if not follow:
            lines += splitters[entry.name].flush()
        for line in lines:
            print(f"{prefix}{line}")
    sys.stdout.flush()
    if not follow:
        return 0
    label = recipe_label(recipe)
    await asyncio.gather(
        *(_follow_rank(folder, entry, targets[entry.name], splitters[entry.name], label) for entry in ranks)
    )
    return 0


async def _follow_rank(
    folder: state.RunFolder, entry: state.RankRecord, target: SshTarget, splitter: state.LineSplitter, label: str
) -> None:
    process = await remote.follow_output(target, entry.directory, folder.mirrored_bytes(entry.name), label=label)
    assert process.stdout is not None
    prefix = _prefix(entry)
    async with remote.owned(process):
        while chunk := await process.stdout.read(65536):
            folder.append_output(entry.name, chunk)
            for line in splitter.feed(chunk):
                print(f"{prefix}{line}", flush=True)
    for line in splitter.flush():
        print(f"{prefix}{line}", flush=True)


def _prefix(entry: state.RankRecord) -> str:
    return line_prefix(entry.rank, entry.name, entry.step)


def _target_by_name(cluster: Cluster, name: str) -> SshTarget:
    host = next((host for host in cluster.hosts if host.name == name), Host(name=name, fabric_ip="0.0.0.0"))
    return remote.target_for(cluster, host)

