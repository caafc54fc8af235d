"""The one owner of every backend's lifecycle: who runs, who waits, who must stop.

Requests (and `/load`, and preloads) call `acquire(model)`: the fleet admits them against
the model's `concurrencyLimit`, holds them until the model is ready, starts and stops
backends as `placement.place` decides (llama-swap's group rules or its matrix solver,
refined by device claims when the config declares devices), and never evicts a model
with requests in flight. Placement decides *who* must leave the GPU; the fleet decides
*how*: a model with `sleep:` is put to sleep while the host memory budget allows (the
least recently used sleepers are stopped to make room), any other is stopped. A
sleeping model holds no GPU, so placement does not see it; asked for, it is woken
where another would be started. Requests that must wait are queued in llama-swap's fifo order:
ahead of every waiting request of a strictly lower `priority`, else in arrival order. It
owns the config in force. Every decision is taken in `_schedule`, a synchronous method: on
one event loop nothing can change between reading a state and acting on it. Backends
report each change of state through one callback, which only asks for a decision soon
after, so no decision ever runs inside another.

Admission, the queue, the swap decisions (who leaves the GPU, and whether by sleep or
stop), TTLs and reloads stay in this one module (about 670 lines) because they are
one concept, one state machine over the same few fields:
split, each part would read and change another's state. What a request is handed and
refused with is in `lease`, how the state reads on `/running` in `status`, one backend's
own lifecycle in `backend`, and the host-RAM arithmetic of sleepers in `hostmemory`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from swaplab.config.identity import context_hash
from swaplab.config.model import ClaimEstimate, Config
from swaplab.config.redact import config_secrets
from swaplab.errors import BackendStartError
from swaplab.fleet.backend import Backend, Run, State
from swaplab.fleet.devices import DeviceProbe, free_gib
from swaplab.fleet.engineapi import tree_gib
from swaplab.fleet.hostmemory import available_gib, make_room, over_budget
from swaplab.fleet.kvstore import KvStore, saves_context
from swaplab.fleet.lease import (
    BackendUnavailable,
    Lease,
    OverCapacity,
    PlacementRefused,
)
from swaplab.fleet.logs import LogHub
from swaplab.fleet.loadclock import LoadClock
from swaplab.fleet.placement import Placement, Resident, claims, estimate_detail, place
from swaplab.fleet.reaper import PidFiles, descendants
from swaplab.fleet.status import backend_entry, context_entry, device_entries
from swaplab.memory.reported import engine_said
from swaplab.metrics import Metrics

log = logging.getLogger("swaplab.fleet")

_SAID = "; at its start "
"""Where an estimate's detail goes on with what the engine said it allocated."""

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

# A load's progress moves with the clock too (its elapsed and silent seconds, whether it looks
# stuck), not only with the engine's lines: while a model starts or wakes, listeners hear of it
# this often, so the page's copy never stands still between lines.
PROGRESS_TICK_SECONDS = 1.0


# llama-swap's default when a model sets no concurrencyLimit.
DEFAULT_CONCURRENCY_LIMIT = 10

# Why a run was asked to stop, as clients read it ("was stopped (unloaded) while ...").
# A start cut short by a reload keeps its queued requests (the new entry serves them).
STOP_RELOAD = "its config entry changed"
STOP_UNLOAD = "unloaded"
STOP_SHUTDOWN = "the router is shutting down"
STOP_TTL = "idle for its ttl"
FOREVER = None
"""An idle limit that never runs out: `ttl: 0`, or a request's negative `keep_alive`."""
STOP_HOST_MEMORY = "the host memory budget needs its RAM for a newer sleeper"



@dataclass(eq=False)
class _Waiter:
    model: str
    future: asyncio.Future[Lease]
    since: float = field(default_factory=time.monotonic)


class Fleet:
    """Starts, holds and stops the backends of one config; owns the config in force.

    Admission lives here too: a request, a `/load` and a preload are each one lease,
    counted once against the model's `concurrencyLimit`, queued or in flight.
    """

    def __init__(
        self,
        config: Config,
        *,
        state_dir: Path,
        logs: LogHub,
        device_probe: DeviceProbe | None = None,
        metrics: Metrics | None = None,
        load_clock: LoadClock | None = None,
    ):
        self.config = config
        self.load_clock = load_clock or LoadClock()
        """Every start's and wake's stages and duration, and the ETA of the next (fleet/loadclock.py)."""
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
        self._measured: dict[str, tuple[tuple[str, ...], ClaimEstimate]] = {}
        """NVML's reading of what a model with an estimated claim took (or what its engine said it
        allocated, beside the estimate), with the cmd it was for."""
        self._memory_poll: asyncio.TimerHandle | None = None
        self._progress_tick: asyncio.TimerHandle | None = None
        self._outdated: set[str] = set()
        self._retiring = False
        """A reload left servers of changed or removed entries that must stop once idle."""
        self._ttl_timers: dict[str, asyncio.TimerHandle] = {}
        self._expires_at: dict[str, float] = {}
        """When each armed idle timer fires (wall clock), for Ollama's `/api/ps`."""
        self._keep_alive: dict[str, float] = {}
        """A request's own idle limit (Ollama's `keep_alive`, seconds; negative: forever), set by the
        last request to end that gave one, in force over the model's `ttl` until a request without one ends."""
        self._schedule_pending = False
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self.kv_store = KvStore(config.kv_cache_store)
        self.kv_store.configure(config)
        self.kv_store.on_evict = lambda cache: self.metrics.context_evicted(cache.model or "?")
        self.metrics.watch_context_disk(self.kv_store.used_bytes)
        self.swaps = 0
        self.listeners: list[Callable[[], None]] = []
        """Called after every change of any backend's state, as it happens (the live feed's `modelStatus`)."""

    async def open(self) -> None:
        """Reap what a previous router left behind; call once before serving."""
        reaped = await asyncio.to_thread(self.pid_files.reap_leftovers)
        if reaped:
            log.warning("reaped leftovers of a previous run: %s", ", ".join(reaped))
        if any(saves_context(model) for model in self.config.models.values()):
            try:
                await self.kv_store.open()  # a folder another user could change refuses the start (its fix said)
            except OSError as error:
                log.warning("kvCache: the saved contexts cannot be read (%s)", error)
        self._http = aiohttp.ClientSession()

    def backend(self, model_id: str) -> Backend | None:
        """The model's backend as it stands (None if it never ran); reading it changes nothing."""
        return self._backends.get(model_id)

    def _backend_to_start(self, model_id: str) -> Backend:
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
                on_change=self._backend_changed,
                kv_store=self.kv_store,
                metrics=self.metrics,
                load_clock=self.load_clock,
                on_progress=self._backend_progressed,
                gpu_held=self._gpu_held,
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
        lease = await self.acquire(model_id)
        try:
            yield lease
        finally:
            self.release(lease, succeeded=lease.completed)

    async def load(self, model_id: str) -> None:
        """Start a model by the same rules as a request (and counted like one); return once it is ready."""
        async with self.lease(model_id) as lease:
            lease.completed = True

    def admit_now(self, model_id: str) -> Lease | None:
        """Admit a request at once if nothing stands in the way (the model ready, nothing queued), else None.

        Raises `OverCapacity` when the model already holds `concurrencyLimit` requests. The
        request path calls this first: the common case costs no coroutine.
        """
        if self._closed:
            raise BackendStartError("the router is shutting down")
        model = self.config.models.get(model_id)
        if model is None:
            raise BackendStartError(f"model {model_id!r} is no longer in the config")
        limit = model.concurrency_limit or DEFAULT_CONCURRENCY_LIMIT
        held = self._in_flight[model_id]
        if self._waiting:
            held += sum(1 for w in self._waiting if w.model == model_id)
        if held >= limit:
            raise OverCapacity(f"model {model_id!r} already has {limit} requests (concurrencyLimit)")
        backend = self._backends.get(model_id)
        if not self._waiting and backend is not None and backend.state is State.READY and model_id not in self._outdated:
            # Nothing queued, so nothing to be fair to.
            self.metrics.queue_wait(model_id, 0.0)
            return self._grant(backend)
        return None

    async def acquire(self, model_id: str) -> Lease:
        """Wait until `model_id` is ready and admit one request to it.

        Raises `OverCapacity` at once when the model already holds `concurrencyLimit`
        requests; `BackendUnavailable`, `PlacementRefused` or `BackendStartError` when it
        cannot be started.
        """
        lease = self.admit_now(model_id)
        if lease is not None:
            return lease
        waiter = _Waiter(model_id, asyncio.get_running_loop().create_future())
        if self.config.priority:
            self._enqueue_by_priority(waiter)
        else:
            self._waiting.append(waiter)
        self._schedule()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client went away while queued: drop it from the queue, and give
            # back the slot if it was admitted in the same instant.
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.release(waiter.future.result(), succeeded=False)
            self._schedule()
            raise

    def _enqueue_by_priority(self, waiter: _Waiter) -> None:
        """llama-swap's fifo: just before the first waiting request of a strictly lower priority."""
        priority = self.config.priority
        rank = priority.get(waiter.model, 0)
        for index, queued in enumerate(self._waiting):
            if priority.get(queued.model, 0) < rank:
                self._waiting.insert(index, waiter)
                return
        self._waiting.append(waiter)

    async def reacquire(self, lease: Lease) -> Lease:
        """The lease's server died under it: once its run has ended, trade the slot for one on a new run.

        Waiting for the end (not only the exit) means the backend no longer shows the dead
        run as ready, so the new lease cannot land on it again.
        """
        await asyncio.shield(lease.run.ended)
        self.release(lease, succeeded=False)
        return await self.acquire(lease.backend.id)

    def release(self, lease: Lease, *, succeeded: bool, keep_alive: float | None = None) -> None:
        """The request holding `lease` ended. `keep_alive` (Ollama's, in seconds) is its own idle limit:
        0 stops the model once idle, a negative one keeps it loaded; None leaves the model's `ttl`."""
        if lease.released:
            return
        lease.released = True
        model_id = lease.backend.id
        self._in_flight[model_id] -= 1
        if self._in_flight[model_id] <= 0:
            del self._in_flight[model_id]
        self._last_used[model_id] = time.monotonic()
        backend = lease.backend
        if succeeded and backend.run is lease.run and backend.state is State.READY:
            backend.note_success()
        if keep_alive is not None:
            self._keep_alive[model_id] = keep_alive
        elif self._keep_alive:
            self._keep_alive.pop(model_id, None)
        if not self._in_flight[model_id] and self._backends.get(model_id) is backend:
            if backend.model.ttl > 0 or self._keep_alive:
                self._arm_idle_limit(backend)
        self._schedule()

    def keep_alive(self, model_id: str, seconds: float) -> None:
        """A request's `keep_alive` for a model it only loaded (Ollama's empty prompt): in force as if it had
        ended a request, idle timer included."""
        self._keep_alive[model_id] = seconds
        backend = self._backends.get(model_id)
        if backend is not None and not self._in_flight[model_id] and backend.state is State.READY:
            self._arm_idle_limit(backend)

    def idle_limit(self, model_id: str) -> float | None:
        """Seconds the model stays loaded once idle: its last request's `keep_alive`, else its `ttl`; None: forever."""
        seconds = self._keep_alive.get(model_id)
        if seconds is None:
            ttl = self.config.models[model_id].ttl if model_id in self.config.models else 0
            return float(ttl) if ttl > 0 else FOREVER
        return seconds if seconds >= 0 else FOREVER

    def expires_at(self, model_id: str) -> float | None:
        """When (wall clock) an idle model's timer unloads it; for a busy one, its limit from now; None: never."""
        if self._in_flight[model_id] or model_id not in self._expires_at:
            limit = self.idle_limit(model_id)
            return None if limit is None else time.time() + limit
        return self._expires_at[model_id]

    def _arm_idle_limit(self, backend: Backend) -> None:
        limit = self.idle_limit(backend.id)
        if limit is None:
            previous = self._ttl_timers.pop(backend.id, None)
            if previous is not None:
                previous.cancel()
            self._expires_at.pop(backend.id, None)
        else:
            self._arm_ttl(backend, limit)

    def _grant(self, backend: Backend) -> Lease:
        assert backend.run is not None and backend.state is State.READY
        self._in_flight[backend.id] += 1
        return Lease(backend, backend.run)

    def _arm_ttl(self, backend: Backend, seconds: float) -> None:
        """`ttl` (or a request's `keep_alive`): unload the model `seconds` after its last request ended."""
        previous = self._ttl_timers.pop(backend.id, None)
        if previous is not None:
            previous.cancel()
        self._expires_at[backend.id] = time.time() + seconds
        self._ttl_timers[backend.id] = asyncio.get_running_loop().call_later(
            seconds, self._ttl_expired, backend, seconds
        )

    def _ttl_expired(self, backend: Backend, seconds: float) -> None:
        self._ttl_timers.pop(backend.id, None)
        self._expires_at.pop(backend.id, None)
        idle = not self._in_flight[backend.id] and not any(w.model == backend.id for w in self._waiting)
        # The same server it was armed for, still ready (or asleep) and untouched since.
        if idle and self._backends.get(backend.id) is backend and backend.state in (State.READY, State.SLEEPING):
            limit = "keep_alive" if backend.id in self._keep_alive else "ttl"
            log.info("%s unloaded: idle for its %s of %g s", backend.id, limit, seconds)
            self._keep_alive.pop(backend.id, None)  # the next start begins with the model's own ttl
            backend.stop(STOP_TTL)

    def in_flight(self, model_id: str) -> int:
        return self._in_flight[model_id]

    # -- the decisions -----------------------------------------------------------

    def _schedule(self) -> None:
        self._schedule_pending = False
        if self._closed or not (self._waiting or self._retiring):
            return  # the hot path: a request ended with nothing queued and no reload pending
        now = time.monotonic()
        self._retire_outdated()
        for waiter in list(self._waiting):
            if waiter.future.done():
                self._waiting.remove(waiter)
                continue
            if waiter.model not in self.config.models:
                self._fail(waiter, BackendStartError(f"model {waiter.model!r} was removed from the config"))
                continue
            backend = self._backend_to_start(waiter.model)
            if backend.state is State.READY:
                if waiter.model in self._outdated:
                    continue  # a reload changed it: it finishes what it has, then the new entry starts
                if not self._overdue_conflict(waiter.model, now, waiter.since):
                    self._admit(waiter, backend)
                continue
            if backend.state.holds_gpu:
                continue  # starting, stopping, falling asleep or waking: its next change reschedules
            if backend.state is State.SLEEPING and waiter.model in self._outdated:
                continue  # a reload changed it: its old process stops, then the new entry starts
            if self._overdue_conflict(waiter.model, now, waiter.since):
                continue  # starting it would stand in the way of a request that has waited longer
            if backend.state is State.STOPPED and backend.backoff_until > now:
                wait = backend.backoff_until - now
                self._fail(
                    waiter,
                    BackendUnavailable(
                        f"model {waiter.model!r} failed {backend.consecutive_failures} times in a row "
                        f"({backend.last_error}); next start allowed in {wait:.0f} s",
                        retry_after=wait,
                    ),
                )
                continue
            self._make_room_or_start(backend)

    def _schedule_soon(self) -> None:
        """Decide again once the current step is done (a backend's change must not re-enter a decision)."""
        if not self._schedule_pending:
            self._schedule_pending = True
            asyncio.get_running_loop().call_soon(self._schedule)

    def _fail(self, waiter: _Waiter, error: BaseException) -> None:
        self._waiting.remove(waiter)
        if not waiter.future.done():
            waiter.future.set_exception(error)

    def _retire_outdated(self) -> None:
        """Stop each server a reload changed or removed, as soon as its requests in flight are done."""
        if not self._retiring:
            return
        removed = [m for m in self._backends if m not in self.config.models]
        pending = False
        for model_id in list(self._outdated) + removed:
            backend = self._backends.get(model_id)
            if backend is None or (backend.state is State.STOPPED and model_id not in removed):
                continue  # nothing of the old entry runs: the next start takes the new one
            pending = True
            if self._in_flight[model_id]:
                continue
            if backend.state in (State.READY, State.SLEEPING):
                log.info("%s: stopping the server of its previous config entry", model_id)
                # Its context is worth saving only if the new entry can restore it (a kvCache-only edit).
                new = self.config.models.get(model_id)
                keeps = new is not None and context_hash(new) == context_hash(backend.model)
                backend.stop(STOP_RELOAD, save_context=keeps)
            elif backend.state is State.STOPPED and model_id in removed:
                del self._backends[model_id]
        self._retiring = pending

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
            if backend.state is State.SLEEPING:
                log.info("waking %s", backend.id)
                backend.wake()
            else:
                backend.start()
        elif placement.action == "evict":
            self.swaps += 1
            self.metrics.swap()
            why = f" ({placement.reason})" if placement.reason else ""
            for victim in placement.evict:
                self._leave(self._backends[victim], f"to make room for {backend.id}{why}")
        elif placement.action == "wait":
            if self._waiting_reason.get(backend.id) != placement.reason:
                # Waiting for the models just evicted to finish stopping is routine.
                routine = all(self._backends[m].state.leaving for m in placement.blocking)
                log.log(logging.DEBUG if routine else logging.INFO, "%s", placement.reason)
            self._waiting_reason[backend.id] = placement.reason
            if placement.short_devices:
                self._poll_memory_later()
        elif self._stop_a_sleeper_on(placement.short_devices):
            self._poll_memory_later()  # what a sleeper kept on those devices comes back once it exits
        else:
            self._refuse(backend.id, placement)

    def _residents(self, busy: Callable[[str], bool]) -> list[Resident]:
        """Every model whose backend holds (or is taking, or still leaving) the GPU, as placement reads them.

        A sleeping model holds none: it is not among them.
        """
        return [
            Resident(b.id, str(b.state.as_placement), busy=busy(b.id),
                     last_used=self._last_used.get(b.id, 0.0))
            for b in self._backends.values()
            if b.state.holds_gpu
        ]

    # -- sleep: how a model leaves the GPU -----------------------------------------

    def _leave(self, victim: Backend, reason: str) -> None:
        """`victim` must leave the GPU: asleep when it can sleep and the host has room, else stopped."""
        can_sleep = victim.may_sleep and victim.id not in self._outdated
        if can_sleep and self._host_room_for(victim):
            log.info("putting %s to sleep %s", victim.id, reason)
            victim.sleep()
            return
        budget = ": the host memory budget has no room for it asleep" if can_sleep else ""
        log.info("stopping %s %s%s", victim.id, reason, budget)
        victim.stop(reason)

    def _sleepers(self) -> list[Backend]:
        """Sleeping backends, least recently used first."""
        return sorted(
            (b for b in self._backends.values() if b.state is State.SLEEPING),
            key=lambda b: self._last_used.get(b.id, 0.0),
        )

    def _host_cost(self, backend: Backend) -> float:
        """GiB of RAM the backend holds (or will hold) asleep: declared, else measured when it last
        slept, else estimated (its weights, as its device claims bound them, where the engine keeps
        them in RAM; otherwise its processes' RAM now)."""
        sleep = backend.model.sleep
        if sleep is not None and sleep.host_memory_gib is not None:
            return sleep.host_memory_gib
        if backend.host_gib is not None:
            return backend.host_gib
        keeps_weights = sleep is not None and (sleep.engine == "sglang" or sleep.level == 1)
        claimed = [amount for amount in claims(self.config, backend.id).values() if amount is not None]
        if keeps_weights and claimed:
            return sum(claimed)
        return tree_gib(backend.pid) or 0.0

    def _host_room_for(self, backend: Backend) -> bool:
        """Whether `backend` may sleep within the host memory budget; stops the least recently
        used sleepers when that makes room (`hostmemory.make_room`)."""
        memory = self.config.host_memory
        falling = sum(self._host_cost(b) for b in self._backends.values() if b.state is State.FALLING_ASLEEP)
        sleepers = [(b.id, self._host_cost(b)) for b in self._sleepers()]
        available = available_gib() if memory.budget_gib is None else None
        stop = make_room(self._host_cost(backend), sleepers, falling, memory, available)
        if stop is None:
            return False
        for model_id in stop:
            self._stop_sleeper(self._backends[model_id])
        return True

    def _enforce_host_budget(self) -> None:
        """A model fell asleep (its RAM now measured): stop sleepers beyond the budget (`hostmemory.over_budget`)."""
        memory = self.config.host_memory
        available = available_gib() if memory.budget_gib is None else None
        for model_id in over_budget([(b.id, self._host_cost(b)) for b in self._sleepers()], memory, available):
            self._stop_sleeper(self._backends[model_id])

    def _stop_sleeper(self, victim: Backend) -> None:
        log.info("stopping %s, asleep and least recently used: %s", victim.id, STOP_HOST_MEMORY)
        self.metrics.sleeper_stopped(victim.id)
        victim.stop(STOP_HOST_MEMORY)

    def _stop_a_sleeper_on(self, devices: tuple[int, ...]) -> bool:
        """A start is short of memory on `devices` (NVML): stop the least recently used sleeper that
        claims one of them (what the engine keeps asleep is freed when it exits). False when none does."""
        for sleeper in self._sleepers():
            if set(claims(self.config, sleeper.id)) & set(devices):
                log.info("stopping %s, asleep: what it keeps on device(s) %s is needed", sleeper.id,
                         ", ".join(map(str, devices)))
                sleeper.stop("its device memory is needed")
                return True
        return False

    def _refuse(self, model_id: str, placement: Placement) -> None:
        self._waiting_reason.pop(model_id, None)
        failure = PlacementRefused(placement.reason)
        log.error("%s", failure)
        for waiter in [w for w in self._waiting if w.model == model_id]:
            self._fail(waiter, failure)

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
        oldest = min((w.since for w in self._waiting if w.model == model_id), default=None)
        return oldest is not None and not self._overdue_conflict(model_id, time.monotonic(), oldest)

    def _overdue_conflict(self, model_id: str, now: float, since: float) -> bool:
        """Must `model_id` yield (not take more requests, not start) to a request that waited longer?

        Yes when a request that arrived before `since` has waited past the batch window
        for a model that needs `model_id` gone, or could not start while `model_id` runs.
        Only older requests count, so of two models that exclude each other the one asked
        for first goes first: steady traffic to one cannot starve the other, in either
        direction. With `priority`, only requests of at least `model_id`'s priority count:
        a higher-priority model never yields to a lower one (the order fifo promises).
        """
        priority = self.config.priority
        rank = priority.get(model_id, 0) if priority else 0
        overdue = {
            waiter.model
            for waiter in self._waiting
            if waiter.model != model_id
            and waiter.since < since
            and now - waiter.since >= BATCH_WINDOW_SECONDS
            and self.state_of(waiter.model) is not State.READY
            and waiter.model in self.config.models
            and (not priority or priority.get(waiter.model, 0) >= rank)
        }
        if not overdue:
            return False
        residents = self._residents(busy=lambda m: bool(self._in_flight[m]))
        if all(r.model_id != model_id for r in residents):
            residents.append(Resident(model_id, str(State.STARTING), busy=True))  # as if it started now
        for target in overdue:
            placement = place(self.config, target, residents)
            if model_id in placement.evict or model_id in placement.blocking:
                return True
        return False

    def _admit(self, waiter: _Waiter, backend: Backend) -> None:
        self._waiting.remove(waiter)
        self.metrics.queue_wait(waiter.model, time.monotonic() - waiter.since)
        lease = self._grant(backend)
        if backend.became_ready >= waiter.since:  # it got ready while this request waited
            lease.waited_for = backend.ready_by
            if backend.fell_back_at >= waiter.since:  # a wake failed meanwhile: this start is its fallback
                lease.fallback = backend.last_fallback
        waiter.future.set_result(lease)

    def _backend_progressed(self, backend: Backend) -> None:
        """A start's or wake's stage moved (the server said so): whoever shows progress hears it."""
        for listener in self.listeners:
            listener()

    def _tick_progress_later(self) -> None:
        """While any model starts or wakes, listeners hear of it every PROGRESS_TICK_SECONDS."""
        if self._progress_tick is None and not self._closed and self._loading():
            self._progress_tick = asyncio.get_running_loop().call_later(PROGRESS_TICK_SECONDS, self._progress_ticked)

    def _progress_ticked(self) -> None:
        self._progress_tick = None
        if self._loading():
            for listener in self.listeners:
                listener()
            self._tick_progress_later()

    def _loading(self) -> bool:
        return any(backend.state in (State.STARTING, State.WAKING) for backend in self._backends.values())

    def _backend_changed(self, backend: Backend, run: Run) -> None:
        """Every state change of every backend comes through here, as it happens."""
        for listener in self.listeners:
            listener()
        self._tick_progress_later()
        if backend.state is State.READY:
            if backend.ready_by == "wake":
                self.metrics.backend_woke(backend.id, backend.last_wake_seconds or 0.0)
            else:
                self.metrics.backend_started(backend.id, backend.start_seconds or 0.0, ok=True)
                self._measure_claim(backend, run)
            self.metrics.backend_state(backend.id, True)
        elif backend.state is State.FALLING_ASLEEP:
            self.metrics.backend_state(backend.id, False)
        elif backend.state is State.SLEEPING:
            self.metrics.backend_slept(backend.id)
            now = time.monotonic()
            for device in claims(self.config, backend.id):
                self._device_left_at[device] = now
            self._enforce_host_budget()
        elif backend.state is State.STOPPING:
            self.metrics.backend_state(backend.id, False)
            if run.fallback and backend.model.sleep is not None:
                self.metrics.sleep_fallback(backend.id, "sleep" if "sleep failed" in run.fallback else "wake")
        elif backend.state is State.STOPPED:
            now = time.monotonic()
            for device in claims(self.config, backend.id):
                self._device_left_at[device] = now
            if not run.ready.cancelled() and run.ready.exception() is not None:
                self._start_failed(backend, run, run.ready.exception())
        self._schedule_soon()

    def _gpu_held(self, pid: int) -> dict[int, float] | None:
        """GiB a server's process tree holds on each GPU (NVML), or None where it cannot say."""
        return self.device_probe.process_memory({pid, *(child.pid for child in descendants(pid))})

    def _measure_claim(self, backend: Backend, run: Run) -> None:
        """With NVML, what a model with an estimated claim really took once ready: logged beside
        the estimate, and its claim from now on (until its entry changes). What a vLLM or SGLang
        start said it allocated (its own log) is recorded beside the estimate either way."""
        estimate = self.config.estimates.get(backend.id)
        if estimate is None or estimate.claim is None or backend.model.vram_gib or run.pid is None:
            return
        said = engine_said(backend.model.cmd, (line.text for line in self.logs.recent(backend.id)
                                               if line.time >= (backend.started_at or 0)))
        if said is not None:
            log.info("%s: %s (estimated: %s)", backend.id, said, estimate.detail)
            before = estimate.detail.split(_SAID, 1)[0]  # an earlier start's figures give way
            estimate = ClaimEstimate(estimate.claim, f"{before}{_SAID}{said}")
            self._measured[backend.id] = (backend.model.cmd, estimate)
            self.config = self._with_measurements(self.config)
        taken = self._gpu_held(run.pid)
        if not taken:
            return
        measured = {device: round(taken.get(device, 0.0), 3) for device in estimate.claim}
        parts = []
        for device, gib in measured.items():
            guess = estimate.claim[device]
            parts.append(f"{gib:.2f} GiB on device {device} (estimated {guess:.2f}, {(guess - gib) / gib:+.1%})"
                         if gib else f"nothing on device {device} (estimated {guess:.2f})")
        log.info("%s took %s", backend.id, "; ".join(parts))
        self._measured[backend.id] = (backend.model.cmd, ClaimEstimate(
            measured, f"measured after its start: {'; '.join(parts)}; {estimate.detail}"))
        self.config = self._with_measurements(self.config)

    def _with_measurements(self, config: Config) -> Config:
        """`config` with each measured claim in place of its estimate, where the entry is unchanged."""
        kept = {
            model_id: measured for model_id, (cmd, measured) in self._measured.items()
            if model_id in config.estimates and config.models[model_id].cmd == cmd and not config.models[model_id].vram_gib
        }
        return replace(config, estimates={**config.estimates, **kept}) if kept else config

    def _start_failed(self, backend: Backend, run: Run, error: BaseException) -> None:
        """A start ended without the server ready (its process is gone): the requests queued for it hear why.

        A start that was asked to stop is not a failure: whoever stopped it (an unload, a
        shutdown) answered the queue then, and a reload's queue waits for the new entry.
        """
        if run.stop_wanted.is_set():
            return
        self.metrics.backend_started(backend.id, time.monotonic() - run.begun, ok=False)
        log.error("%s", error)
        for waiter in [w for w in self._waiting if w.model == backend.id]:
            self._fail(waiter, error)

    # -- administration ----------------------------------------------------------

    async def unload(self, model_id: str | None = None) -> list[str]:
        """Stop one model, or every model; returns the ids stopped."""
        targets = [b for b in self._backends.values() if b.state is not State.STOPPED]
        if model_id is not None:
            targets = [b for b in targets if b.id == model_id]
        # Requests queued for a server that is going away fail now; later ones start it anew.
        for waiter in [w for w in self._waiting if any(w.model == b.id for b in targets)]:
            self._fail(waiter, BackendStartError(f"model {waiter.model!r} was unloaded while this request waited for it"))
        await asyncio.gather(*(b.stop(STOP_UNLOAD) for b in targets))
        return [b.id for b in targets]

    def put_to_sleep(self, model_id: str) -> str | None:
        """Put an idle ready model with `sleep:` to sleep now (the web page's Sleep button); why not, or None."""
        backend = self._backends.get(model_id)
        if backend is None or backend.state is not State.READY:
            return f"model {model_id!r} is not ready (it is {self.state_of(model_id)})"
        if backend.model.sleep is None:
            return f"model {model_id!r} has no sleep: in its config"
        if not backend.may_sleep:
            return f"model {model_id!r} failed to sleep or wake {backend.sleep_faults} times in a row"
        if self._in_flight[model_id] or any(w.model == model_id for w in self._waiting):
            return f"model {model_id!r} is busy: a model with requests is never put to sleep"
        if not self._host_room_for(backend):
            return f"model {model_id!r} does not fit the host memory budget asleep"
        log.info("putting %s to sleep (asked for)", model_id)
        backend.sleep()
        return None

    async def reconfigure(self, config: Config, changed: Iterable[str]) -> None:
        """Put `config` in force; models in `changed` (edited or removed) stop as `unload` stops them.

        The others keep running untouched. A changed model's old server keeps its place
        (and its claim on the devices) until it has stopped; its queued requests then
        start the new entry, also when the old one was still starting. Requests queued
        for a removed model fail.
        """
        self.config = self._with_measurements(config)
        changed = set(changed)
        self._outdated |= {m for m in changed if m in config.models}
        self._retiring = True
        # Servers still starting for the old entry are stopped now; ready ones finish
        # the requests they have first (graceful), then `_schedule` stops them.
        self.kv_store.configure(config)
        starting = [b.stop(STOP_RELOAD, save_context=False) for b in self._backends.values() if b.id in changed and b.state is State.STARTING]
        self._schedule()
        await asyncio.gather(*starting)

    async def close(self) -> None:
        """Refuse new requests, fail queued ones, stop every backend."""
        self._closed = True
        for timer in self._ttl_timers.values():
            timer.cancel()
        for waiter in list(self._waiting):
            self._fail(waiter, BackendStartError("the router is shutting down"))
        if self._memory_poll is not None:
            self._memory_poll.cancel()
        if self._progress_tick is not None:
            self._progress_tick.cancel()
        await asyncio.gather(*(b.stop(STOP_SHUTDOWN) for b in self._backends.values()))
        if self._http is not None:
            await self._http.close()
        self.device_probe.close()

    def status(self) -> list[dict[str, Any]]:
        """One entry per model that is not stopped, is waiting to start, or has a failure to report."""
        entries = []
        secrets = config_secrets(self.config)
        now = time.monotonic()
        for backend in sorted(self._backends.values(), key=lambda b: b.id):  # llama-swap's order
            queued = sum(1 for w in self._waiting if w.model == backend.id)
            if backend.state is State.STOPPED and not backend.consecutive_failures and not queued \
                    and not backend.last_fallback:
                continue
            entries.append(backend_entry(
                backend,
                in_flight=self._in_flight[backend.id],
                queued=queued,
                waiting=self._waiting_reason.get(backend.id),
                claim=claims(self.config, backend.id),
                now=now,
                host_gib=self._host_cost(backend) if backend.model.sleep is not None else None,
                secrets=secrets,
                context=self.context_status(backend.id, backend),
                estimate=estimate_detail(self.config, backend.id),
            ))
        return entries

    def context_status(self, model_id: str, backend: Backend | None = None) -> dict[str, Any] | None:
        """The model's `kv_cache` object (`status.context_entry`); None without `kvCache`."""
        model = self.config.models.get(model_id)
        backend = backend or self._backends.get(model_id)
        if backend is not None and backend.state is not State.STOPPED:
            model = backend.model  # the entry it runs (a reload may have changed the config's)
        if model is None or not saves_context(model):
            return None
        return context_entry(model, backend, self.kv_store.saved(model_id), self.kv_store.identity(model), time.time())

    def contexts_status(self) -> dict[str, Any]:
        """`/running`'s `kv_cache`: the store's folder, budget and use, and each model's saved context."""
        models = {m: entry for m in sorted(self.config.models) if (entry := self.context_status(m)) is not None}
        return {
            "path": self.kv_store.settings.path,
            "budget_gib": self.kv_store.settings.budget_gib,
            "used_bytes": self.kv_store.used_bytes(),
            "models": models,
        }

    def devices_status(self) -> list[dict[str, Any]]:
        """One entry per declared device (and per device NVML sees): size, claims, real memory (`status.device_entries`)."""
        held: dict[int, dict[str, float | None]] = {}
        asleep: dict[int, dict[str, float | None]] = {}
        for backend in self._backends.values():
            if backend.state is not State.STOPPED:
                holders = asleep if backend.state is State.SLEEPING else held  # a sleeper holds no GPU
                for device, amount in claims(self.config, backend.id).items():
                    holders.setdefault(device, {})[backend.id] = amount
        return device_entries(self.config, self.device_probe.read() or {}, held, asleep)

    def state_of(self, model_id: str) -> State:
        backend = self._backends.get(model_id)
        return backend.state if backend else State.STOPPED
