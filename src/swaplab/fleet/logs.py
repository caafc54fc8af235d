"""Recent log lines per source (the router and each backend) and live subscribers."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class LogLine:
    time: float
    source: str
    text: str


class LogHub:
    """Keeps the last lines of every source in a ring buffer and fans new lines out."""

    def __init__(self, lines_per_source: int = 2000):
        self._lines_per_source = lines_per_source
        self._buffers: dict[str, deque[LogLine]] = {}
        self._subscribers: set[asyncio.Queue[LogLine]] = set()

    def write(self, source: str, text: str) -> None:
        line = LogLine(time.time(), source, text)
        buffer = self._buffers.get(source)
        if buffer is None:
            buffer = self._buffers[source] = deque(maxlen=self._lines_per_source)
        buffer.append(line)
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

    def tail(self, source: str, limit: int = 20) -> str:
        return "\n".join(line.text for line in self.recent(source, limit))

    def subscribe(self, size: int = 1000) -> asyncio.Queue[LogLine]:
        queue: asyncio.Queue[LogLine] = asyncio.Queue(maxsize=size)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[LogLine]) -> None:
        self._subscribers.discard(queue)
