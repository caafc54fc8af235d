"""The one owner of every backend's lifecycle: who runs, who waits, who must stop.

Requests call `lease(model)`; the fleet holds them until the model is ready, starts
and stops backends by the group rules, and never evicts a model with requests in
flight. Every decision is taken in `_schedule`, a synchronous method: on one event
loop nothing can change between reading a state and acting on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from swaplab.config.model import Config
from swaplab.errors import BackendStartError, SwaplabError
from swaplab.fleet.logs import LogHub
from swaplab.fleet.process import Backend, State
from swaplab.fleet.reaper import PidFiles
from swaplab.fleet.swap import must_stop

log = logging.getLogger("swaplab.fleet")

# Requests for a running model keep joining its batch while another model waits for
# the swap, so A B A B is served A A B B; after this long the waiting model's turn
# comes first, so steady traffic to A cannot starve B.
BATCH_WINDOW_SECONDS = 5.0


class BackendUnavailable(SwaplabError):
    """The model is crash-looping and in its back-off window."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(eq=False)
class Lease:
    backend: Backend
    completed: bool = False


@dataclass(eq=False)
class _Waiter:
    model: str
    future: asyncio.Future[None]
    since: float = field(default_factory=time.monotonic)


class Fleet:
    """Starts, holds and stops the backends of one config."""

    def __init__(self, config: Config, *, state_dir: Path, logs: LogHub):
        self.config = config
        self.logs = logs
        self.pid_files = PidFiles(state_dir)
        self._backends: dict[str, Backend] = {}
        self._in_flight: Counter[str] = Counter()
        self._last_used: dict[str, float] = {}
        self._waiting: list[_Waiter] = []
        self._transitions: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self.swaps = 0

    async def open(self) -> None:
        """Reap what a previous router left behind; call once before serving."""
        reaped = await asyncio.to_thread(self.pid_files.reap_leftovers)
        if reaped:
            log.warning("reaped leftovers of a previous run: %s", ", ".join(reaped))
        self._http = aiohttp.ClientSession()

    def backend(self, model_id: str) -> Backend:
        backend = self._backends.get(model_id)
        if backend is None:
            assert self._http is not None, "Fleet.open() first"
            backend = Backend(
                self.config.models[model_id],
                health_check_timeout=self.config.health_check_timeout,
                logs=self.logs,
                pid_files=self.pid_files,
                http=self._http,
                on_exit=self._backend_exited,
            )
            self._backends[model_id] = backend
        return backend

    # -- requests --------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, model_id: str) -> AsyncIterator[Lease]:
        """Hold a request slot on a ready backend; the model is never evicted while leased.

        The holder sets `completed` when the upstream answered in full: that, and only
        that, resets the backend's crash-loop counter.
        """
        await self.acquire(model_id)
        lease = Lease(self._backends[model_id])
        try:
            yield lease
        finally:
            self.release(model_id, succeeded=lease.completed)

    async def acquire(self, model_id: str) -> None:
        if self._closed:
            raise BackendStartError("the router is shutting down")
        backend = self._backends.get(model_id)
        if not self._waiting and backend is not None and backend.state is State.READY:
            # The hot path: nothing queued, so nothing to be fair to. Admit at once.
            self._in_flight[model_id] += 1
            return
        waiter = _Waiter(model_id, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._schedule()
        try:
            await waiter.future
        except asyncio.CancelledError:
            # The client went away while queued: drop it from the queue, and give
            # back the slot if it was admitted in the same instant.
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.release(model_id, succeeded=False)
            self._schedule()
            raise

    def release(self, model_id: str, *, succeeded: bool) -> None:
        self._in_flight[model_id] -= 1
        if self._in_flight[model_id] <= 0:
            del self._in_flight[model_id]
        self._last_used[model_id] = time.monotonic()
        backend = self._backends.get(model_id)
        if succeeded and backend is not None and backend.state is State.READY:
            backend.note_success()
        self._schedule()

    def in_flight(self, model_id: str) -> int:
        return self._in_flight[model_id]

    # -- the decisions -----------------------------------------------------------

    def _schedule(self) -> None:
        now = time.monotonic()
        for waiter in list(self._waiting):
            if waiter.future.done():
                self._waiting.remove(waiter)
                continue
            backend = self.backend(waiter.model)
            if backend.state is State.READY:
                if not self._overdue_conflict(waiter.model, now):
                    self._admit(waiter)
                continue
            if backend.state is not State.STOPPED:
                continue  # starting or stopping: its transition reschedules
            if backend.backoff_until > now:
                wait = backend.backoff_until - now
                self._waiting.remove(waiter)
                waiter.future.set_exception(
                    BackendUnavailable(
                        f"model {waiter.model!r} failed {backend.consecutive_failures} times in a row "
                        f"({backend.last_error}); next start allowed in {wait:.0f} s",
                        retry_after=wait,
                    )
                )
                continue
            self._make_room_or_start(backend)

    def _make_room_or_start(self, backend: Backend) -> None:
        active = sorted(
            (b.id for b in self._backends.values() if b.state is not State.STOPPED and b.id != backend.id),
            key=lambda model_id: self._last_used.get(model_id, 0.0),
        )
        victims = must_stop(self.config, backend.id, active)
        if any(self._in_flight[v] or self._has_waiters_admissible(v) for v in victims):
            return  # never evict a busy model: wait for it to go idle
        if any(self._backends[v].state in (State.STARTING, State.STOPPING) for v in victims):
            return
        ready_victims = [v for v in victims if self._backends[v].state is State.READY]
        if ready_victims:
            self.swaps += 1
            for victim in ready_victims:
                log.info("stopping %s to make room for %s", victim, backend.id)
                self._track(self._backends[victim].stop())
            return
        self._track(self._await_start(backend, backend.start()))

    def _has_waiters_admissible(self, model_id: str) -> bool:
        """A ready model with queued requests still inside their batch window counts as busy."""
        if self._backends[model_id].state is not State.READY:
            return False
        now = time.monotonic()
        return any(w.model == model_id for w in self._waiting) and not self._overdue_conflict(model_id, now)

    def _overdue_conflict(self, model_id: str, now: float) -> bool:
        """Has a request for a model that `model_id` blocks waited past the batch window?"""
        for waiter in self._waiting:
            if waiter.model == model_id or now - waiter.since < BATCH_WINDOW_SECONDS:
                continue
            if self._backends.get(waiter.model) and self._backends[waiter.model].state is State.READY:
                continue
            if model_id in must_stop(self.config, waiter.model, [model_id]):
                return True
        return False

    def _admit(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        self._in_flight[waiter.model] += 1
        waiter.future.set_result(None)

    async def _await_start(self, backend: Backend, start: asyncio.Task[None]) -> None:
        try:
            await start
        except BaseException as error:
            failure = error if isinstance(error, SwaplabError) else BackendStartError(
                f"model {backend.id!r} failed to start: {error!r}"
            )
            log.error("%s", failure)
            for waiter in [w for w in self._waiting if w.model == backend.id]:
                self._waiting.remove(waiter)
                if not waiter.future.done():
                    waiter.future.set_exception(failure)
            if isinstance(error, asyncio.CancelledError):
                raise

    def _track(self, transition: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await transition
            finally:
                self._schedule()

        wrapper = asyncio.get_running_loop().create_task(run())
        self._transitions.add(wrapper)
        wrapper.add_done_callback(self._transitions.discard)

    def _backend_exited(self, backend: Backend, expected: bool) -> None:
        self._schedule()

    # -- administration ----------------------------------------------------------

    async def unload(self, model_id: str | None = None) -> list[str]:
        """Stop one model, or every model; returns the ids stopped."""
        targets = [b for b in self._backends.values() if b.state is not State.STOPPED]
        if model_id is not None:
            targets = [b for b in targets if b.id == model_id]
        await asyncio.gather(*(b.stop() for b in targets))
        self._schedule()
        return [b.id for b in targets]

    async def close(self) -> None:
        """Refuse new requests, fail queued ones, stop every backend."""
        self._closed = True
        for waiter in self._waiting:
            if not waiter.future.done():
                waiter.future.set_exception(BackendStartError("the router is shutting down"))
        self._waiting.clear()
        await asyncio.gather(*(b.stop() for b in self._backends.values()), return_exceptions=True)
        if self._transitions:
            await asyncio.gather(*self._transitions, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    def status(self) -> list[dict[str, Any]]:
        """One entry per model that is not stopped, or that has a failure to report."""
        entries = []
        for backend in self._backends.values():
            if backend.state is State.STOPPED and not backend.consecutive_failures:
                continue
            entry: dict[str, Any] = {
                "model": backend.id,
                "state": str(backend.state),
                "pid": backend.pid,
                "proxy": backend.model.proxy,
                "in_flight": self._in_flight[backend.id],
                "queued": sum(1 for w in self._waiting if w.model == backend.id),
            }
            if backend.start_seconds is not None:
                entry["start_seconds"] = round(backend.start_seconds, 3)
            if backend.consecutive_failures:
                entry["consecutive_failures"] = backend.consecutive_failures
                entry["last_error"] = backend.last_error
                backoff = backend.backoff_until - time.monotonic()
                if backoff > 0:
                    entry["backoff_seconds"] = round(backoff, 1)
            entries.append(entry)
        return entries

    def state_of(self, model_id: str) -> State:
        backend = self._backends.get(model_id)
        return backend.state if backend else State.STOPPED
