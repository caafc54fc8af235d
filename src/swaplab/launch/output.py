"""A running action's output: bytes cut into lines, the one loop that reads a stream as lines,
and the `Observer` that receives those lines and the launcher's messages.

The library never prints: `up`, `logs` and the rest tell an Observer, and the command layer
(swaplab.launch.commands) decides where that goes.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

CHUNK_BYTES = 65536
PROGRESS_SECONDS = 5.0
"""The least time between two progress lines shown of one step."""
_LINE_END = re.compile(rb"\r\n|\r|\n")


class Observer:
    """What a running action tells whoever watches it; every method may be left as is (silent)."""

    def message(self, text: str) -> None:
        """A launcher message: what is being done, what was found, why it ended."""

    def output(self, line: str) -> None:
        """A line of a process's output, prefixed with whose it is (`[rank 1] ...`)."""


class LineSplitter:
    """Bytes as they arrive, cut into complete text lines; a partial last line waits for its end."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[str]:
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        return [line.decode(errors="replace").rstrip("\r") for line in lines]

    def flush(self) -> list[str]:
        """The partial last line, if any (the stream ended without a newline)."""
        rest, self._pending = self._pending, b""
        return [rest.decode(errors="replace").rstrip("\r")] if rest else []


class ProgressLines:
    """A step's output where a line ended by a carriage return alone is a progress update
    (rsync's `--info=progress2`, huggingface_hub's bars): every other line is handed on, progress
    at most every PROGRESS_SECONDS and always the last one, so a long copy shows it moves
    without filling the screen."""

    def __init__(self, on_line: Callable[[str], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._on_line = on_line
        self._clock = clock
        self._pending = b""
        self._last_shown = float("-inf")
        self._unshown: str | None = None

    def feed(self, data: bytes) -> None:
        buffer = self._pending + data
        # A carriage return at the end may be the first half of "\r\n": it waits for the next byte.
        held = b"\r" if buffer.endswith(b"\r") else b""
        buffer = buffer[: len(buffer) - len(held)]
        pieces = _LINE_END.split(buffer)
        ends = _LINE_END.findall(buffer)
        self._pending = pieces.pop() + held
        for text, end in zip(pieces, ends, strict=True):
            line = text.decode(errors="replace").strip()
            if not line:
                continue
            if end == b"\r":
                self._progress(line)
            else:
                self._unshown = None
                self._on_line(line)

    def close(self) -> None:
        """The stream ended: its last progress line if it was held back, and a partial last line."""
        if self._unshown is not None:
            self._on_line(self._unshown)
            self._unshown = None
        rest, self._pending = self._pending.decode(errors="replace").strip(), b""
        if rest:
            self._on_line(rest)

    def _progress(self, line: str) -> None:
        now = self._clock()
        if now - self._last_shown >= PROGRESS_SECONDS:
            self._last_shown = now
            self._unshown = None
            self._on_line(line)
        else:
            self._unshown = line


async def read_lines(
    stream: asyncio.StreamReader,
    on_line: Callable[[str], None],
    *,
    on_bytes: Callable[[bytes], None] | None = None,
    splitter: LineSplitter | None = None,
) -> None:
    """Hand each line of `stream` to `on_line` as it comes, until the stream ends.

    `on_bytes` sees every chunk before its lines (a mirror to extend). A partial last line
    is handed over at the end, unless the caller passes its own `splitter`: then it waits
    there for the rest of the line from a next stream, and the caller flushes it.
    """
    own_splitter = splitter is None
    lines = splitter if splitter is not None else LineSplitter()
    while chunk := await stream.read(CHUNK_BYTES):
        if on_bytes is not None:
            on_bytes(chunk)
        for line in lines.feed(chunk):
            on_line(line)
    if own_splitter:
        for line in lines.flush():
            on_line(line)
