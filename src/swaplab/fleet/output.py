"""A backend process's output, line by line into the log hub, and the moment the process exits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from swaplab.fleet.logs import LogHub
from swaplab.fleet.run import Run

# A line of output longer than this is logged in pieces.
OUTPUT_LINE_LIMIT = 64 * 1024
# The process's last lines may still be in the pipe when its exit is reported: wait this
# long for the pipe's end before quoting them (a child that inherited it may hold it open).
OUTPUT_SETTLE_SECONDS = 0.5


class ProcessOutput(asyncio.SubprocessProtocol):
    """The server's output, line by line into the log hub, and the moment its process exits.

    The exit is noted when the process itself ends, not when its output pipe closes: a
    server's workers inherit that pipe and may outlive it.
    """

    def __init__(self, source: str, logs: LogHub, run: Run, on_line: Callable[[str], None] | None = None):
        self._source = source
        self._logs = logs
        self._run = run
        self._on_line = on_line
        self._transport: asyncio.SubprocessTransport | None = None
        self._partial = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        buffer = self._partial
        buffer += data
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            self._write(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if self._on_line is not None and b"\r" in buffer:
            # A progress bar (tqdm) redraws one line with carriage returns and ends it with a
            # newline only when done: its latest complete redraw is the progress to show now.
            redraws = bytes(buffer).split(b"\r")
            latest = redraws[-2] if len(redraws) > 1 else b""
            if latest.strip():
                self._on_line(latest.decode(errors="replace"))
        if len(buffer) > OUTPUT_LINE_LIMIT:
            self._write(buffer)
            buffer.clear()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if self._partial:
            self._write(self._partial)
            self._partial.clear()
        self._run.output_closed.set()

    def process_exited(self) -> None:
        assert self._transport is not None
        run = self._run
        run.exit_code = self._transport.get_returncode()
        run.crashed = not run.stop_wanted.is_set()
        run.exited.set()

    def _write(self, line: bytes | bytearray) -> None:
        text = bytes(line).decode(errors="replace").rstrip("\r")
        self._logs.write(self._source, text)
        if self._on_line is not None:
            self._on_line(text)


async def settle(run: Run) -> None:
    """Give the pipe a moment to deliver the exited process's last lines."""
    try:
        await asyncio.wait_for(run.output_closed.wait(), OUTPUT_SETTLE_SECONDS)
    except TimeoutError:
        pass
