"""How long an idle model stays loaded: its `ttl`, or the limit its last request gave (Ollama's
`keep_alive`), and the timer that runs it out.

A request's own limit, in seconds, is in force over the model's `ttl` from the end of that
request until a request without one ends: 0 unloads the model once idle, a negative one keeps
it loaded. Ollama's `/api/ps` shows when each timer fires, so each armed timer's moment is
kept. When one runs out, the fleet decides whether the model is still idle and stops it: this
only keeps the time, the fleet keeps who runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from swaplab.config.model import Config
from swaplab.fleet.backend import Backend

FOREVER = None
"""An idle limit that never runs out: `ttl: 0`, or a request's negative `keep_alive`."""


class IdleLimits:
    """Each model's idle limit and its armed timer; `ran_out(backend, seconds)` is the fleet's to decide."""

    def __init__(self, config: Callable[[], Config], ran_out: Callable[[Backend, float], None]):
        self._config = config
        self._ran_out = ran_out
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._expires_at: dict[str, float] = {}
        """When each armed idle timer fires (wall clock), for Ollama's `/api/ps`."""
        self.requested: dict[str, float] = {}
        """A request's own idle limit (Ollama's `keep_alive`, seconds; negative: forever), set by the
        last request to end that gave one, in force over the model's `ttl` until a request without one ends."""

    def request_ended(self, model_id: str, keep_alive: float | None) -> None:
        """A request ended with its own `keep_alive` (None: it gave none, the model's `ttl` is back)."""
        if keep_alive is not None:
            self.requested[model_id] = keep_alive
        elif self.requested:
            self.requested.pop(model_id, None)

    def limit(self, model_id: str) -> float | None:
        """Seconds the model stays loaded once idle: its last request's `keep_alive`, else its `ttl`; None: forever."""
        seconds = self.requested.get(model_id)
        if seconds is None:
            config = self._config()
            ttl = config.models[model_id].ttl if model_id in config.models else 0
            return float(ttl) if ttl > 0 else FOREVER
        return seconds if seconds >= 0 else FOREVER

    def expires_at(self, model_id: str, *, busy: bool) -> float | None:
        """When (wall clock) an idle model's timer unloads it; for a busy one, its limit from now; None: never."""
        if busy or model_id not in self._expires_at:
            limit = self.limit(model_id)
            return None if limit is None else time.time() + limit
        return self._expires_at[model_id]

    def arm(self, backend: Backend) -> None:
        """The model is idle now: its timer runs its limit from now (none runs for a limit of forever)."""
        previous = self._timers.pop(backend.id, None)
        if previous is not None:
            previous.cancel()
        seconds = self.limit(backend.id)
        if seconds is None:
            self._expires_at.pop(backend.id, None)
            return
        self._expires_at[backend.id] = time.time() + seconds
        self._timers[backend.id] = asyncio.get_running_loop().call_later(seconds, self._fired, backend, seconds)

    def forget(self, model_id: str) -> str:
        """The model is unloaded for its limit: which one it was ("keep_alive" or "ttl"); the next start
        begins with the model's own `ttl`."""
        return "keep_alive" if self.requested.pop(model_id, None) is not None else "ttl"

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()

    def _fired(self, backend: Backend, seconds: float) -> None:
        self._timers.pop(backend.id, None)
        self._expires_at.pop(backend.id, None)
        self._ran_out(backend, seconds)
