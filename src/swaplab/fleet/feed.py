"""Who hears of the fleet's changes as they happen: the live feed's `modelStatus`, the page's load
progress, and the metrics of starts, wakes and sleeps.

Listeners are told at every change of any backend's state and at every stage a starting or waking
server reports (`progress`, read from its output). A load's progress moves with the clock too,
not only with the engine's lines: its elapsed and silent seconds, and whether it looks stuck
(`loadclock`), so while any model starts or wakes they are told again every
PROGRESS_TICK_SECONDS, and the page's copy never stands still between lines. Each change is
counted in `metrics` as it happens. The fleet hands its changes here and decides on them
itself; what the listeners then read is the fleet's own state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from swaplab.fleet.backend import Backend, Run, State
from swaplab.metrics import Metrics

PROGRESS_TICK_SECONDS = 1.0


class Feed:
    """The fleet's listeners, the tick that keeps them told while a load is under way, and the metrics."""

    def __init__(self, backends: Mapping[str, Backend], metrics: Metrics):
        self._backends = backends
        self._metrics = metrics
        self.listeners: list[Callable[[], None]] = []
        """Called after every change of any backend's state, as it happens (the live feed's `modelStatus`)."""
        self._tick: asyncio.TimerHandle | None = None
        self._closed = False

    def tell(self, backend: Backend | None = None) -> None:
        """A load's stage moved (the server said so): every listener hears it now."""
        for listener in self.listeners:
            listener()

    def changed(self, backend: Backend, run: Run) -> None:
        """`backend`'s state changed: every listener hears it now (and each second while a load is
        under way), and the metrics count it."""
        self.tell(backend)
        self.tick_while_loading()
        metrics = self._metrics
        if backend.state is State.READY:
            if backend.ready_by == "wake":
                metrics.backend_woke(backend.id, backend.last_wake_seconds or 0.0)
            else:
                metrics.backend_started(backend.id, backend.start_seconds or 0.0, ok=True)
            metrics.backend_state(backend.id, True)
        elif backend.state is State.FALLING_ASLEEP:
            metrics.backend_state(backend.id, False)
        elif backend.state is State.SLEEPING:
            metrics.backend_slept(backend.id)
        elif backend.state is State.STOPPING:
            metrics.backend_state(backend.id, False)
            if run.fallback and backend.model.sleep is not None:
                metrics.sleep_fallback(backend.id, "sleep" if "sleep failed" in run.fallback else "wake")

    def tick_while_loading(self) -> None:
        """While any model starts or wakes, listeners hear of it every PROGRESS_TICK_SECONDS."""
        if self._tick is None and not self._closed and self._loading():
            self._tick = asyncio.get_running_loop().call_later(PROGRESS_TICK_SECONDS, self._ticked)

    def close(self) -> None:
        self._closed = True
        if self._tick is not None:
            self._tick.cancel()

    def _ticked(self) -> None:
        self._tick = None
        if self._loading():
            self.tell()
            self.tick_while_loading()

    def _loading(self) -> bool:
        return any(backend.state in (State.STARTING, State.WAKING) for backend in self._backends.values())
