"""One start of a backend: its process from spawn to exit, and the requests made of it (stop, sleep, wake)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path


class Run:
    """One start of a backend: its process, from spawn to exit. A backend has at most one at a time."""

    def __init__(self, number: int, loop: asyncio.AbstractEventLoop):
        self.number = number
        self.begun = time.monotonic()
        self.transport: asyncio.SubprocessTransport | None = None
        self.exited = asyncio.Event()
        """Set as soon as the server's own process has exited (whoever still holds its output)."""
        self.exit_code: int | None = None
        self.output_closed = asyncio.Event()
        self.stop_wanted = asyncio.Event()
        self.stop_reason = ""
        self.context_dir: Path | None = None
        """The folder its llama-server was started to save slots in (`--slot-save-path`); None: not kept."""
        self.save_context = True
        """Whether a stop saves the server's KV cache first (`kvCache`); a reload's stop does not."""
        self.sleep_wanted = asyncio.Event()
        self.wake_wanted = asyncio.Event()
        self.fallback = ""
        """Why a sleep or wake failed and the process was stopped instead ("" when none did)."""
        self.crashed = False
        """The process exited on its own (nobody had asked it to stop)."""
        self.restored: dict[int, int] = {}
        """Tokens restored into each slot (`kvCache`) before this run was ready."""
        self._unclaimed = 0
        self.ready: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        """Done once no process of this run is left and the backend is stopped."""

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self.transport.get_pid() if self.transport is not None and not self.exited.is_set() else None

    def restored_into(self, slot_id: int, tokens: int) -> None:
        self.restored[slot_id] = tokens
        self._unclaimed += 1

    def claim_restored(self, cached_tokens: int | None) -> bool:
        """A request on this run read `cached_tokens` from the server's cache: while restored slots are
        unclaimed, it is (one of) the first served from them. One claim per restored slot: later
        cache hits are the run's own."""
        if not cached_tokens or self._unclaimed <= 0:
            return False
        self._unclaimed -= 1
        return True
