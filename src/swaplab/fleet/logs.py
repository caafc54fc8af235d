"""Recent log lines per source (the router and each backend) and live subscribers."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LogLine:
    time: float
    source: str
    text: str


class LogHub:
    """Keeps the last lines of every source in a ring buffer and fans new lines out.

    It belongs to one event loop (the first that uses it) and is only ever changed on it:
    a line written from another thread (the activity writer logs from its own) is handed
    to the loop, so subscribers' queues, which are not thread-safe, are touched nowhere else.
    """

    def __init__(self, lines_per_source: int = 2000, echo: Callable[[LogLine], None] | None = None):
        self._lines_per_source = lines_per_source
        self._echo = echo
        """Also called with every line, on the hub's loop (`logToStdout` prints backends' output with it)."""
        self._buffers: dict[str, deque[LogLine]] = {}
        self._subscribers: set[asyncio.Queue[LogLine]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def write(self, source: str, text: str) -> None:
        """Add a line; callable from any thread."""
        line = LogLine(time.time(), source, text)
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # not on a loop's thread
            running = None
        if running is not None:
            if self._loop is None or self._loop.is_closed():
                self._loop = running
            if running is self._loop:
                self._add(line)
                return
        loop = self._loop
        if loop is not None and loop.is_running():
            try:
                loop.call_soon_threadsafe(self._add, line)
                return
            except RuntimeError:  # the loop closed in between
                pass
        self._add(line)  # no loop of ours runs: nobody else can be touching it

    def _add(self, line: LogLine) -> None:
        buffer = self._buffers.get(line.source)
        if buffer is None:
            buffer = self._buffers[line.source] = deque(maxlen=self._lines_per_source)
        buffer.append(line)
        if self._echo is not None:
            self._echo(line)
        for queue in self._subscribers:
            if queue.full():
                # A slow reader loses its oldest line rather than stalling a backend's drain.
                queue.get_nowait()
            queue.put_nowait(line)

    def recent(self, source: str | None = None, limit: int | None = None) -> list[LogLine]:
        if source is not None:
            lines = list(self._buffers.get(source, ()))
        else:
            lines = sorted((line for buffer in self._buffers.values() for line in buffer), key=lambda l: l.time)
        return lines[-limit:] if limit else lines

    def tail(self, source: str, limit: int = 20, since: float | None = None) -> str:
        """The source's last `limit` lines, only those written at or after `since` when given."""
        lines = self.recent(source)
        if since is not None:
            lines = [line for line in lines if line.time >= since]
        return "\n".join(line.text for line in lines[-limit:])

    def subscribe(self, size: int = 1000) -> asyncio.Queue[LogLine]:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[LogLine] = asyncio.Queue(maxsize=size)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[LogLine]) -> None:
        self._subscribers.discard(queue)
