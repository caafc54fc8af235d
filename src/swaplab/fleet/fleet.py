"""The one owner of every backend's lifecycle: who runs, who waits, who must stop.

Requests call `lease(model)`; the fleet holds them until the model is ready, starts
and stops backends as `placement.place` decides (llama-swap's group rules, or device
claims when the config declares devices), and never evicts a model with requests in
flight. Every decision is taken in `_schedule`, a synchronous method: on one event
loop nothing can change between reading a state and acting on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from swaplab.config.model import Config
from swaplab.errors import BackendStartError, SwaplabError
from swaplab.fleet.devices import DeviceProbe, free_gib
from swaplab.fleet.logs import LogHub
from swaplab.metrics import Metrics
from swaplab.fleet.placement import Placement, Resident, claims, place
from swaplab.fleet.process import Backend, State
from swaplab.fleet.reaper import PidFiles

log = logging.getLogger("swaplab.fleet")

# Requests for a running model keep joining its batch while another model waits for
# the swap, so A B A B is served A A B B; after this long the waiting model's turn
# comes first, so steady traffic to A cannot starve B.
BATCH_WINDOW_SECONDS = 5.0

# The driver hands a stopped backend's GPU memory back shortly after its processes
# exit (a TP worker killed with the group may take a moment longer): for this long
# after a backend left a device, a shortfall NVML reports there is polled again
# rather than refused.
MEMORY_SETTLE_SECONDS = 10.0
MEMORY_POLL_SECONDS = 0.2


class PlacementRefused(BackendStartError):
    """The model can never start as things stand: a claim too big, a persistent model in the way, memory taken."""


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

    def __init__(
        self,
        config: Config,
        *,
        state_dir: Path,
        logs: LogHub,
        device_probe: DeviceProbe | None = None,
        metrics: Metrics | None = None,
    ):
        self.config = config
        self.logs = logs
        self.metrics = metrics or Metrics()
        self.pid_files = PidFiles(state_dir)
        self.device_probe = device_probe if device_probe is not None else DeviceProbe()
        self._backends: dict[str, Backend] = {}
        self._in_flight: Counter[str] = Counter()
        self._last_used: dict[str, float] = {}
        self._waiting: list[_Waiter] = []
        self._waiting_reason: dict[str, str] = {}
        self._device_left_at: dict[int, float] = {}
        self._memory_poll: asyncio.TimerHandle | None = None
        self._outdated: set[str] = set()
        self._ttl_timers: dict[str, asyncio.TimerHandle] = {}
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
        if backend is None or (model_id in self._outdated and backend.state is State.STOPPED):
            # A reload changed this model: once its old server is gone, the next start
            # runs the new entry.
            self._outdated.discard(model_id)
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
        if not self._waiting and backend is not None and backend.state is State.READY and model_id not in self._outdated:
            # The hot path: nothing queued, so nothing to be fair to. Admit at once.
            self._in_flight[model_id] += 1
            self.metrics.queue_wait(model_id, 0.0)
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
        if not self._in_flight[model_id] and backend is not None and backend.model.ttl > 0:
            self._arm_ttl(backend)
        self._schedule()

    def _arm_ttl(self, backend: Backend) -> None:
        """`ttl`: unload the model that many seconds after its last request ended."""
        previous = self._ttl_timers.pop(backend.id, None)
        if previous is not None:
            previous.cancel()
        self._ttl_timers[backend.id] = asyncio.get_running_loop().call_later(
            backend.model.ttl, self._ttl_expired, backend
        )

    def _ttl_expired(self, backend: Backend) -> None:
        self._ttl_timers.pop(backend.id, None)
        idle = not self._in_flight[backend.id] and not any(w.model == backend.id for w in self._waiting)
        # The same server it was armed for, still ready and untouched since.
        if idle and self._backends.get(backend.id) is backend and backend.state is State.READY:
            log.info("%s unloaded: idle for its ttl of %d s", backend.id, backend.model.ttl)
            self._track(backend.stop())

    def in_flight(self, model_id: str) -> int:
        return self._in_flight[model_id]

    # -- the decisions -----------------------------------------------------------

    def _schedule(self) -> None:
        now = time.monotonic()
        self._retire_outdated()
        for waiter in list(self._waiting):
            if waiter.future.done():
                self._waiting.remove(waiter)
                continue
            backend = self.backend(waiter.model)
            if backend.state is State.READY:
                if waiter.model in self._outdated:
                    continue  # a reload changed it: it finishes what it has, then the new entry starts
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

    def _retire_outdated(self) -> None:
        """Stop each server a reload changed or removed, as soon as its requests in flight are done."""
        removed = [m for m in self._backends if m not in self.config.models]
        for model_id in list(self._outdated) + removed:
            backend = self._backends.get(model_id)
            if backend is None or self._in_flight[model_id]:
                continue
            if backend.state is State.READY:
                log.info("%s: stopping the server of its previous config entry", model_id)
                self._track(backend.stop())
            elif backend.state is State.STOPPED and model_id in removed:
                del self._backends[model_id]

    def _make_room_or_start(self, backend: Backend) -> None:
        now = time.monotonic()
        residents = self._residents(busy=lambda m: bool(self._in_flight[m]) or self._has_waiters_admissible(m))
        free = None
        settling: list[int] = []
        if self.config.devices:
            free = free_gib(self.device_probe.read())
            settling = [d for d, left in self._device_left_at.items() if now - left < MEMORY_SETTLE_SECONDS]
        placement = place(self.config, backend.id, residents, free, settling)
        if placement.action == "start":
            self._waiting_reason.pop(backend.id, None)
            self._track(self._await_start(backend, backend.start()))
        elif placement.action == "evict":
            self.swaps += 1
            self.metrics.swap()
            for victim in placement.evict:
                log.info("stopping %s to make room for %s", victim, backend.id)
                self._track(self._backends[victim].stop())
        elif placement.action == "wait":
            if self._waiting_reason.get(backend.id) != placement.reason:
                # Waiting for the models just evicted to finish stopping is routine.
                routine = all(self._backends[m].state is State.STOPPING for m in placement.blocking)
                log.log(logging.DEBUG if routine else logging.INFO, "%s", placement.reason)
            self._waiting_reason[backend.id] = placement.reason
            if placement.short_devices:
                self._poll_memory_later()
        else:
            self._refuse(backend.id, placement)

    def _residents(self, busy: Callable[[str], bool]) -> list[Resident]:
        """Every model whose backend is not stopped, as the placement decision reads them."""
        return [
            Resident(b.id, str(b.state), busy=busy(b.id), last_used=self._last_used.get(b.id, 0.0))
            for b in self._backends.values()
            if b.state is not State.STOPPED
        ]

    def _refuse(self, model_id: str, placement: Placement) -> None:
        self._waiting_reason.pop(model_id, None)
        failure = PlacementRefused(placement.reason)
        log.error("%s", failure)
        for waiter in [w for w in self._waiting if w.model == model_id]:
            self._waiting.remove(waiter)
            if not waiter.future.done():
                waiter.future.set_exception(failure)

    def _poll_memory_later(self) -> None:
        """No event says when the driver has handed memory back: look again shortly."""
        if self._memory_poll is None:
            def poll() -> None:
                self._memory_poll = None
                self._schedule()

            self._memory_poll = asyncio.get_running_loop().call_later(MEMORY_POLL_SECONDS, poll)

    def _has_waiters_admissible(self, model_id: str) -> bool:
        """A ready model with queued requests still inside their batch window counts as busy."""
        if self._backends[model_id].state is not State.READY:
            return False
        now = time.monotonic()
        return any(w.model == model_id for w in self._waiting) and not self._overdue_conflict(model_id, now)

    def _overdue_conflict(self, model_id: str, now: float) -> bool:
        """Has a request for a model that needs `model_id` gone waited past the batch window?"""
        overdue = {
            waiter.model
            for waiter in self._waiting
            if waiter.model != model_id
            and now - waiter.since >= BATCH_WINDOW_SECONDS
            and self.state_of(waiter.model) is not State.READY
        }
        if not overdue:
            return False
        residents = self._residents(busy=lambda m: bool(self._in_flight[m]))
        for target in overdue:
            placement = place(self.config, target, residents)
            if model_id in placement.evict or model_id in placement.blocking:
                return True
        return False

    def _admit(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        self._in_flight[waiter.model] += 1
        self.metrics.queue_wait(waiter.model, time.monotonic() - waiter.since)
        waiter.future.set_result(None)

    async def _await_start(self, backend: Backend, start: asyncio.Task[None]) -> None:
        begun = time.monotonic()
        try:
            await start
            self.metrics.backend_started(backend.id, backend.start_seconds or 0.0, ok=True)
            self.metrics.backend_state(backend.id, True)
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError):
                self.metrics.backend_started(backend.id, time.monotonic() - begun, ok=False)
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
        self.metrics.backend_state(backend.id, False)
        now = time.monotonic()
        for device in claims(self.config, backend.id):
            self._device_left_at[device] = now
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

    async def reconfigure(self, config: Config, changed: Iterable[str]) -> None:
        """Put `config` in force; models in `changed` (edited or removed) stop as `unload` stops them.

        The others keep running untouched. A changed model's old server keeps its place
        (and its claim on the devices) until it has stopped; its queued requests then
        start the new entry. Requests queued for a removed model fail.
        """
        self.config = config
        changed = set(changed)
        self._outdated |= {m for m in changed if m in config.models}
        for waiter in [w for w in self._waiting if w.model not in config.models]:
            self._waiting.remove(waiter)
            if not waiter.future.done():
                waiter.future.set_exception(BackendStartError(f"model {waiter.model!r} was removed from the config"))
        # Servers still starting for the old entry are stopped now; ready ones finish
        # the requests they have first (graceful), then `_schedule` stops them.
        starting = [b.stop() for b in self._backends.values() if b.id in changed and b.state is State.STARTING]
        self._schedule()
        await asyncio.gather(*starting, return_exceptions=True)
        for model_id in changed - set(config.models):
            backend = self._backends.get(model_id)
            if backend is not None and backend.state is State.STOPPED and not self._in_flight[model_id]:
                del self._backends[model_id]

    async def close(self) -> None:
        """Refuse new requests, fail queued ones, stop every backend."""
        self._closed = True
        for timer in self._ttl_timers.values():
            timer.cancel()
        for waiter in self._waiting:
            if not waiter.future.done():
                waiter.future.set_exception(BackendStartError("the router is shutting down"))
        self._waiting.clear()
        if self._memory_poll is not None:
            self._memory_poll.cancel()
        await asyncio.gather(*(b.stop() for b in self._backends.values()), return_exceptions=True)
        if self._transitions:
            await asyncio.gather(*self._transitions, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
        self.device_probe.close()

    def status(self) -> list[dict[str, Any]]:
        """One entry per model that is not stopped, is waiting to start, or has a failure to report."""
        entries = []
        for backend in self._backends.values():
            queued = sum(1 for w in self._waiting if w.model == backend.id)
            if backend.state is State.STOPPED and not backend.consecutive_failures and not queued:
                continue
            entry: dict[str, Any] = {
                "model": backend.id,
                "state": str(backend.state),
                "pid": backend.pid,
                "proxy": backend.model.proxy,
                "in_flight": self._in_flight[backend.id],
                "queued": queued,
                "devices": _claim_json(claims(self.config, backend.id)),
            }
            if backend.state is State.STOPPED and queued and backend.id in self._waiting_reason:
                entry["waiting"] = self._waiting_reason[backend.id]
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

    def devices_status(self) -> list[dict[str, Any]]:
        """One entry per declared device (and per device NVML sees): size, claims, real memory.

        `vram_gib` is the declared size (None when not declared), `claimed_gib` the sum
        of the claims of models not stopped, `models` each one's claim (None = the whole
        of a device of undeclared size); `total_gib`, `used_gib`, `free_gib` and
        `nvml_name` are NVML's reading, present only when NVML answers.
        """
        readings = self.device_probe.read() or {}
        held: dict[int, dict[str, float | None]] = {}
        for backend in self._backends.values():
            if backend.state is not State.STOPPED:
                for device, amount in claims(self.config, backend.id).items():
                    held.setdefault(device, {})[backend.id] = amount
        entries = []
        for device in sorted(set(self.config.devices) | set(readings)):
            declared = self.config.devices.get(device)
            reading = readings.get(device)
            models = held.get(device, {})
            entry: dict[str, Any] = {
                "id": device,
                "name": (declared.name if declared else "") or (reading.name if reading else ""),
                "vram_gib": declared.vram_gib if declared and declared.vram_gib else None,
                "claimed_gib": round(sum(a for a in models.values() if a is not None), 3),
                "models": {m: (None if a is None else round(a, 3)) for m, a in models.items()},
            }
            if reading is not None:
                entry.update(
                    nvml_name=reading.name,
                    total_gib=round(reading.total_gib, 3),
                    used_gib=round(reading.used_gib, 3),
                    free_gib=round(reading.free_gib, 3),
                )
            entries.append(entry)
        return entries

    def state_of(self, model_id: str) -> State:
        backend = self._backends.get(model_id)
        return backend.state if backend else State.STOPPED


def _claim_json(claim: dict[int, float | None]) -> dict[str, float | None]:
    """JSON object keys are strings: `{"0": 8.5, "1": 8.5}`; None = the whole device."""
    return {str(device): amount for device, amount in claim.items()}
