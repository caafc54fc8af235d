"""Supervision of a starting or ready gang: the `Supervisor` follows every member's output and
exit, and `until` runs one stage of `up` unless the gang fails, a stop is asked for, or time
runs out first.

A fatal marker in any member's output, or any member exiting, is the gang's failure, with
that member's last lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from collections.abc import Awaitable

from swaplab.fleet.progress import StartupReader
from swaplab.launch import remote, state
from swaplab.launch.members import Member, follow_member_output, recipe_label
from swaplab.launch.output import LineSplitter, Observer
from swaplab.launch.remote import RemoteError
from swaplab.launch.spec import Recipe

TAIL_LINES = 20
POLL_SECONDS = 1.0


class GangFailed(Exception):
    """The gang could not start or stopped serving; the message says which rank and why."""


class StopRequested(Exception):
    """A signal asked `up` to stop the gang."""


def tail_text(lines: deque[str]) -> str:
    """A process's last lines, indented under the message that quotes them."""
    return "\n".join(f"    {line}" for line in lines)


class Supervisor:
    """Follows every member's output and exit; the one owner of the gang's outcome while `up` runs.

    Output is mirrored into the run's folder, shown with its rank prefix, and matched
    against the readiness markers. The first fatal marker or exit is the failure.
    """

    def __init__(self, recipe: Recipe, folder: state.RunFolder, observer: Observer):
        self.folder = folder
        self.observer = observer
        self.label = recipe_label(recipe)
        self.ready_patterns = [re.compile(pattern) for pattern in recipe.readiness.ready]
        self.fatal_patterns = [re.compile(pattern) for pattern in recipe.readiness.fatal]
        self.ready_marker = asyncio.Event()
        self.ready_line = ""
        self.failed = asyncio.Event()
        self.cause = ""
        self.stopping = False
        self._tails: dict[str, deque[str]] = {}
        self._stages: dict[str, StartupReader] = {}
        """Each member's engine stage, read from its output (fleet/progress.py)."""
        self._shown: dict[str, tuple[str, int]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def follow(self, member: Member) -> None:
        self._tails[member.name] = deque(maxlen=TAIL_LINES)
        self._stages[member.name] = StartupReader()
        self._tasks.append(asyncio.get_running_loop().create_task(self._follow(member), name=f"follow {member.name}"))

    async def detach(self) -> None:
        """Stop following (the ranks keep running on their nodes)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def fail(self, member: Member | None, cause: str) -> None:
        """Record the gang's failure, unless one is already recorded or the gang is being stopped."""
        if self.cause or self.stopping:
            return
        if member is not None:
            tail = tail_text(self._tails.get(member.name, deque()))
            cause += f"; its last lines:\n{tail}" if tail else "; it printed nothing"
        self.cause = cause
        self.failed.set()

    def _line(self, member: Member, line: str) -> None:
        self._tails[member.name].append(line)
        self.observer.output(f"{member.prefix}{line}")
        self._stage(member, line)
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

    def _stage(self, member: Member, line: str) -> None:
        """Say each member's stage as its engine moves on (a new stage, or each further quarter of one)."""
        reader = self._stages.get(member.name)
        stage = reader.feed(line) if reader is not None else None
        if stage is None or self.ready_marker.is_set():
            return
        quarter = int((stage.fraction or 0.0) * 4)
        if self._shown.get(member.name) == (stage.name, quarter):
            return
        self._shown[member.name] = (stage.name, quarter)
        share = f" {stage.fraction:.0%}" if stage.fraction is not None else ""
        self.observer.message(f"{member.title}: {stage.name}{share}")

    async def _follow(self, member: Member) -> None:
        splitter = LineSplitter()

        def on_line(line: str) -> None:
            self._line(member, line)

        while True:
            await follow_member_output(
                member.target, member.directory, self.folder, member.name,
                label=self.label, on_line=on_line, splitter=splitter,
            )
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
            on_line(line)
        if condition == "exited":
            self.fail(member, f"{member.title} exited with code {value}")
        else:
            self.fail(member, f"{member.title} was killed (no exit status recorded)")


async def until(
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
