"""The one owner of every backend's lifecycle: who runs, who waits, who must stop.

Requests (and `/load`, and preloads) call `acquire(model)`: the fleet admits them against
the model's `concurrencyLimit`, holds them until the model is ready, starts and stops
backends as `placement.place` decides (llama-swap's group rules or its matrix solver,
refined by device claims when the config declares devices), and never evicts a model
with requests in flight. Placement decides *who* must leave the GPU; a model with `sleep:`
leaves it asleep while the host memory budget allows (`hostmemory.Sleepers`), any other is
stopped. A sleeping model holds no GPU, so placement does not see it; asked for, it is woken
where another would be started. Requests that must wait are queued in llama-swap's fifo order:
ahead of every waiting request of a strictly lower `priority`, else in arrival order. It
owns the config in force. Every decision is taken in `_schedule`, a synchronous method: on
one event loop nothing can change between reading a state and acting on it. Backends
report each change of state through one callback, which only asks for a decision soon
after, so no decision ever runs inside another.

Admission, the queue, the swap decisions, reloads and the stop of an idle model stay in this
one module because they are one concept, one state machine over the same few fields: split,
each part would read and change another's state. What is a concern of its own lives with its
concept and is handed what it needs: what a request is handed and refused with in `lease`,
one backend's own lifecycle in `backend`, the sleepers and their host RAM in `hostmemory`,
idle limits and their timers in `idle`, measured claims in `measured`, placement's questions
in `placement` (and devices still settling in `devices`), the listeners in `feed`, the saved
contexts in `kvstore`, and how the state reads on `/running` in `status`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from swaplab.config.model import Config
from swaplab.errors import BackendStartError
from swaplab.fleet import status as running
from swaplab.fleet.backend import Backend, Run, State
from swaplab.fleet.devices import DeviceProbe, Settling, free_gib
from swaplab.fleet.feed import Feed
from swaplab.fleet.hostmemory import Sleepers
from swaplab.fleet.idle import IdleLimits
from swaplab.fleet.kvstore import fleet_store, restores
from swaplab.fleet.lease import BackendUnavailable, Lease, OverCapacity, PlacementRefused
from swaplab.fleet.loadclock import LoadClock
from swaplab.fleet.logs import LogHub
from swaplab.fleet.measured import MeasuredClaims
from swaplab.fleet.placement import Placement, Resident, claims, place, stands_in_way
from swaplab.fleet.reaper import PidFiles
from swaplab.metrics import Metrics

log = logging.getLogger("swaplab.fleet")

# Requests for a running model keep joining its batch while another model waits for
# the swap, so A B A B is served A A B B; after this long the waiting model's turn
# comes first, so steady traffic to A cannot starve B.
BATCH_WINDOW_SECONDS = 5.0

# llama-swap's default when a model sets no concurrencyLimit.
DEFAULT_CONCURRENCY_LIMIT = 10

# Why a run was asked to stop, as clients read it ("was stopped (unloaded) while ...").
# A start cut short by a reload keeps its queued requests (the new entry serves them).
STOP_RELOAD = "its config entry changed"
STOP_UNLOAD = "unloaded"
STOP_SHUTDOWN = "the router is shutting down"
STOP_TTL = "idle for its ttl"


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
        self._settling = Settling()
        """The devices a backend just left, whose memory may still be on its way back (fleet/devices.py)."""
        self.measured = MeasuredClaims(logs, lambda: self.device_probe)
        """What a model placed by an estimate really took, its claim from then on (fleet/measured.py)."""
        self._outdated: set[str] = set()
        self._retiring = False
        """A reload left servers of changed or removed entries that must stop once idle."""
        self.idle = IdleLimits(lambda: self.config, self._idle_ran_out)
        """Each model's `ttl` or a request's `keep_alive`, and the timer that runs it out (fleet/idle.py)."""
        self._schedule_pending = False
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self.kv_store = fleet_store(config, self.metrics)
        """Where llama.cpp's saved contexts are kept, within the disk budget (fleet/kvstore.py)."""
        self.swaps = 0
        self.sleepers = Sleepers(self._backends, self._last_used, lambda: self.config, self.metrics)
        """How a model leaves the GPU, and the host memory budget of those asleep (fleet/hostmemory.py)."""
        self.feed = Feed(self._backends, self.metrics)
        """Who hears of each change as it happens (the listeners, the metrics), and of a load's progress (fleet/feed.py)."""
        self.listeners = self.feed.listeners
        """Called after every change of any backend's state, as it happens (the live feed's `modelStatus`)."""

    async def open(self) -> None:
        """Reap what a previous router left behind; call once before serving."""
        reaped = await asyncio.to_thread(self.pid_files.reap_leftovers)
        if reaped:
            log.warning("reaped leftovers of a previous run: %s", ", ".join(reaped))
        await self.kv_store.open_for(self.config)
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
                on_progress=self.feed.tell,
                gpu_held=self.measured.gpu_held,
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
        idle = self.idle  # its questions asked inline: every request ends here
        if keep_alive is not None or idle.requested:
            idle.request_ended(model_id, keep_alive)
        if not self._in_flight[model_id] and self._backends.get(model_id) is backend and (
                backend.model.ttl > 0 or idle.requested):
            idle.arm(backend)
        self._schedule()

    def keep_alive(self, model_id: str, seconds: float) -> None:
        """A request's `keep_alive` for a model it only loaded (Ollama's empty prompt): in force as if it had
        ended a request, idle timer included."""
        self.idle.request_ended(model_id, seconds)
        backend = self._backends.get(model_id)
        if backend is not None and not self._in_flight[model_id] and backend.state is State.READY:
            self.idle.arm(backend)

    def idle_limit(self, model_id: str) -> float | None:
        """Seconds the model stays loaded once idle: its last request's `keep_alive`, else its `ttl`; None: forever."""
        return self.idle.limit(model_id)

    def expires_at(self, model_id: str) -> float | None:
        """When (wall clock) an idle model's timer unloads it; for a busy one, its limit from now; None: never."""
        return self.idle.expires_at(model_id, busy=bool(self._in_flight[model_id]))

    def _idle_ran_out(self, backend: Backend, seconds: float) -> None:
        """An idle timer ran out (`idle`): the model stops if it is still idle."""
        idle = not self._in_flight[backend.id] and not any(w.model == backend.id for w in self._waiting)
        # The same server it was armed for, still ready (or asleep) and untouched since.
        if idle and self._backends.get(backend.id) is backend and backend.state in (State.READY, State.SLEEPING):
            limit = self.idle.forget(backend.id)  # the next start begins with the model's own ttl
            log.info("%s unloaded: idle for its %s of %g s", backend.id, limit, seconds)
            backend.stop(STOP_TTL)

    def _grant(self, backend: Backend) -> Lease:
        assert backend.run is not None and backend.state is State.READY
        self._in_flight[backend.id] += 1
        return Lease(backend, backend.run)

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
                backend.stop(STOP_RELOAD, save_context=restores(backend.model, self.config.models.get(model_id)))
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
            settling = self._settling.devices(now)
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
                leaving = self._backends[victim]
                self.sleepers.leave(leaving, f"to make room for {backend.id}{why}",
                                    can_sleep=leaving.may_sleep and victim not in self._outdated)
        elif placement.action == "wait":
            if self._waiting_reason.get(backend.id) != placement.reason:
                # Waiting for the models just evicted to finish stopping is routine.
                routine = all(self._backends[m].state.leaving for m in placement.blocking)
                log.log(logging.DEBUG if routine else logging.INFO, "%s", placement.reason)
            self._waiting_reason[backend.id] = placement.reason
            if placement.short_devices:
                self._settling.look_again(self._schedule)
        elif self.sleepers.stop_one_on(placement.short_devices):
            # What a sleeper kept on those devices comes back once it exits.
            self._settling.look_again(self._schedule)
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

    def _refuse(self, model_id: str, placement: Placement) -> None:
        self._waiting_reason.pop(model_id, None)
        failure = PlacementRefused(placement.reason)
        log.error("%s", failure)
        for waiter in [w for w in self._waiting if w.model == model_id]:
            self._fail(waiter, failure)

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
        return bool(overdue) and stands_in_way(
            self.config, model_id, overdue, self._residents(busy=lambda m: bool(self._in_flight[m])))

    def _admit(self, waiter: _Waiter, backend: Backend) -> None:
        self._waiting.remove(waiter)
        self.metrics.queue_wait(waiter.model, time.monotonic() - waiter.since)
        lease = self._grant(backend)
        if backend.became_ready >= waiter.since:  # it got ready while this request waited
            lease.waited_for = backend.ready_by
            if backend.fell_back_at >= waiter.since:  # a wake failed meanwhile: this start is its fallback
                lease.fallback = backend.last_fallback
        waiter.future.set_result(lease)

    def _backend_changed(self, backend: Backend, run: Run) -> None:
        """Every state change of every backend comes through here, as it happens."""
        self.feed.changed(backend, run)  # the listeners and the metrics
        if backend.state is State.READY and backend.ready_by != "wake":
            self.config = self.measured.measure(self.config, backend, run)
        elif backend.state is State.SLEEPING:
            self._settling.left(claims(self.config, backend.id), time.monotonic())
            self.sleepers.enforce_budget()
        elif backend.state is State.STOPPED:
            self._settling.left(claims(self.config, backend.id), time.monotonic())
            if not run.ready.cancelled() and run.ready.exception() is not None:
                self._start_failed(backend, run, run.ready.exception())
        self._schedule_soon()

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
        busy = bool(self._in_flight[model_id]) or any(w.model == model_id for w in self._waiting)
        why_not = self.sleepers.why_not(self._backends.get(model_id), model_id, self.state_of(model_id), busy=busy)
        if why_not is None:
            log.info("putting %s to sleep (asked for)", model_id)
            self._backends[model_id].sleep()
        return why_not

    async def reconfigure(self, config: Config, changed: Iterable[str]) -> None:
        """Put `config` in force; models in `changed` (edited or removed) stop as `unload` stops them.

        The others keep running untouched. A changed model's old server keeps its place
        (and its claim on the devices) until it has stopped; its queued requests then
        start the new entry, also when the old one was still starting. Requests queued
        for a removed model fail.
        """
        self.config = self.measured.applied(config)
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
        self.idle.close()
        for waiter in list(self._waiting):
            self._fail(waiter, BackendStartError("the router is shutting down"))
        self._settling.close()
        self.feed.close()
        await asyncio.gather(*(b.stop(STOP_SHUTDOWN) for b in self._backends.values()))
        if self._http is not None:
            await self._http.close()
        self.device_probe.close()

    def status(self) -> list[dict[str, Any]]:
        """One entry per model that is not stopped, is waiting to start, or has a failure to report."""
        return running.backend_entries(
            self.config, self._backends, in_flight=self._in_flight, queued=Counter(w.model for w in self._waiting),
            waiting=self._waiting_reason, host_gib=self.sleepers.cost, store=self.kv_store,
        )

    def context_status(self, model_id: str, backend: Backend | None = None) -> dict[str, Any] | None:
        """The model's `kv_cache` object (`status.context_entry`); None without `kvCache`."""
        return running.context_status(self.config, self.kv_store, model_id, backend or self._backends.get(model_id))

    def contexts_status(self) -> dict[str, Any]:
        """`/running`'s `kv_cache`: the store's folder, budget and use, and each model's saved context."""
        return running.contexts_status(self.config, self.kv_store, self._backends)

    def devices_status(self) -> list[dict[str, Any]]:
        """One entry per declared device (and per device NVML sees): size, claims, real memory (`status.device_entries`)."""
        return running.devices_status(self.config, self._backends.values(), self.device_probe.read() or {})

    def state_of(self, model_id: str) -> State:
        backend = self._backends.get(model_id)
        return backend.state if backend else State.STOPPED
