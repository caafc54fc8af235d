"""Work about ended requests, done later, at a quiet moment, a slice per turn of the loop.

Turning an ended request into its activity record, metrics and capture costs about as
much CPU as relaying it did (some 30 µs here). Done as each request ends it would sit
between the next requests and their first bytes; done in one go after a burst, the
records of 640 requests would hold the loop for 20 ms. So `Batch` queues the items and:

- starts `delay` after the first of them;
- waits for a quiet moment: no request arrived (`last_arrival`) and none ended for
  `quiet` seconds. Arrivals alone do not say a burst is over: its streams go on after
  the last one came, and its records must not land in front of the next burst;
- takes `size` items per turn of the loop, and between two slices waits for quiet again
  when a request came meanwhile;
- never lets an item wait more than `patience` for quiet: a router that is never quiet
  still records, a slice at a time.

`drain()` does all that is queued at once (whatever reads the figures calls it first).
Only the event loop touches a batch.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Batch(Generic[T]):
    def __init__(
        self,
        handle: Callable[[list[T]], None],
        last_arrival: Callable[[], float],
        *,
        delay: float,
        quiet: float,
        patience: float,
        size: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._handle = handle
        self._last_arrival = last_arrival
        self.delay = delay
        self.quiet = quiet
        self.patience = patience
        self.size = size
        self._clock = clock
        self._queue: deque[tuple[float, T]] = deque()  # (when it was added, the item)
        self._last_added = 0.0
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, item: T) -> None:
        """An item to handle later (a request ended)."""
        now = self._last_added = self._clock()
        self._queue.append((now, item))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay, self._run)

    def drain(self) -> None:
        """Handle everything queued now, in one go."""
        self._cancel()
        if self._queue:
            items = [item for _, item in self._queue]
            self._queue.clear()
            self._handle(items)

    def step(self) -> float | None:
        """One turn: handle a slice if the moment is quiet (or the oldest item waited `patience`).

        Returns how long to wait before the next turn (0: at the loop's next turn), None when
        nothing is left.
        """
        if not self._queue:
            return None
        now = self._clock()
        since = now - max(self._last_arrival(), self._last_added)
        if since < self.quiet and now - self._queue[0][0] < self.patience:
            return self.quiet - since
        count = min(self.size, len(self._queue))
        items = [self._queue.popleft()[1] for _ in range(count)]
        self._handle(items)
        return 0.0 if self._queue else None

    def _run(self) -> None:
        self._timer = None
        wait = self.step()
        if wait is None:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_soon(self._run) if wait <= 0 else loop.call_later(wait, self._run)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
