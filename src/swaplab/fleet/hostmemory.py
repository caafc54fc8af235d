"""How much host RAM sleeping models may hold: which sleepers must stop so that another may sleep.

The arithmetic is pure, over GiB (`make_room`, `over_budget`). A declared `hostMemory.budgetGiB`
bounds what the sleepers hold together (declared or measured per sleeper); without one, sleepers
may hold RAM while the system's available memory stays above `headroomGiB`. Sleepers are given
least recently used first: they are the first to stop.

`Sleepers` applies it to the fleet's backends: how a model leaves the GPU (asleep while the
budget has room, else stopped), what each holds asleep, and which sleepers stop to make room for
another or for a start short of device memory. Placement decides *who* leaves; the fleet asks
this *how*, so the budget's rules read in one place and the fleet keeps only its decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import psutil

from swaplab.config.model import Config, HostMemory
from swaplab.fleet.backend import Backend, State
from swaplab.fleet.engineapi import tree_gib
from swaplab.fleet.placement import claims
from swaplab.metrics import Metrics

log = logging.getLogger("swaplab.fleet")

GIB = 1024**3

Sleeper = tuple[str, float]
"""A sleeping model's id and the GiB of RAM it holds."""

STOP_HOST_MEMORY = "the host memory budget needs its RAM for a newer sleeper"


def available_gib() -> float:
    """The system's available RAM now (what new allocations can take without swapping)."""
    return psutil.virtual_memory().available / GIB


def make_room(
    cost: float, sleepers: Sequence[Sleeper], falling: float, memory: HostMemory, available: float | None
) -> list[str] | None:
    """The sleepers to stop so that one more model, holding `cost` GiB asleep, fits; None when it cannot
    fit even with every sleeper stopped. `falling`: GiB of the models falling asleep now (they cannot
    be stopped to make room). `available`: the system's available GiB (needed without a budget)."""
    stop: list[str] = []
    if memory.budget_gib is not None:
        held = falling + sum(gib for _, gib in sleepers)
        if falling + cost > memory.budget_gib:
            return None
        for model, gib in sleepers:
            if held + cost <= memory.budget_gib:
                break
            stop.append(model)
            held -= gib
        return stop
    assert available is not None
    if available + sum(gib for _, gib in sleepers) - cost < memory.headroom_gib:
        return None
    for model, gib in sleepers:
        if available - cost >= memory.headroom_gib:
            break
        stop.append(model)
        available += gib
    return stop


def over_budget(sleepers: Sequence[Sleeper], memory: HostMemory, available: float | None) -> list[str]:
    """The sleepers to stop now that one more fell asleep (its RAM measured): while they hold more than
    the budget, or (without one) while available RAM is below the headroom."""
    stop: list[str] = []
    if memory.budget_gib is not None:
        held = sum(gib for _, gib in sleepers)
        for model, gib in sleepers:
            if held <= memory.budget_gib:
                break
            stop.append(model)
            held -= gib
        return stop
    assert available is not None
    for model, gib in sleepers:
        if available >= memory.headroom_gib:
            break
        stop.append(model)
        available += gib
    return stop


class Sleepers:
    """The host memory budget over the fleet's backends: who may sleep, and which sleepers stop.

    Reads the fleet's backends and when each was last used (the same mappings the fleet
    changes) and the config in force (`config()`); stops what must stop itself.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        last_used: Mapping[str, float],
        config: Callable[[], Config],
        metrics: Metrics,
    ):
        self._backends = backends
        self._last_used = last_used
        self._config = config
        self._metrics = metrics

    def leave(self, victim: Backend, reason: str, *, can_sleep: bool) -> None:
        """`victim` must leave the GPU: asleep when it can sleep and the host has room, else stopped."""
        if can_sleep and self.room_for(victim):
            log.info("putting %s to sleep %s", victim.id, reason)
            victim.sleep()
            return
        budget = ": the host memory budget has no room for it asleep" if can_sleep else ""
        log.info("stopping %s %s%s", victim.id, reason, budget)
        victim.stop(reason)

    def why_not(self, backend: Backend | None, model_id: str, state: State, *, busy: bool) -> str | None:
        """Why the Sleep button cannot put `model_id` to sleep now (`state`: as the fleet reads it), or
        None: then it may, and the sleepers that had to stop to make room for it have been stopped."""
        if backend is None or backend.state is not State.READY:
            return f"model {model_id!r} is not ready (it is {state})"
        if backend.model.sleep is None:
            return f"model {model_id!r} has no sleep: in its config"
        if not backend.may_sleep:
            return f"model {model_id!r} failed to sleep or wake {backend.sleep_faults} times in a row"
        if busy:
            return f"model {model_id!r} is busy: a model with requests is never put to sleep"
        if not self.room_for(backend):
            return f"model {model_id!r} does not fit the host memory budget asleep"
        return None

    def asleep(self) -> list[Backend]:
        """Sleeping backends, least recently used first."""
        return sorted(
            (b for b in self._backends.values() if b.state is State.SLEEPING),
            key=lambda b: self._last_used.get(b.id, 0.0),
        )

    def cost(self, backend: Backend) -> float:
        """GiB of RAM the backend holds (or will hold) asleep: declared, else measured when it last
        slept, else estimated (its weights, as its device claims bound them, where the engine keeps
        them in RAM; otherwise its processes' RAM now)."""
        sleep = backend.model.sleep
        if sleep is not None and sleep.host_memory_gib is not None:
            return sleep.host_memory_gib
        if backend.host_gib is not None:
            return backend.host_gib
        keeps_weights = sleep is not None and (sleep.engine == "sglang" or sleep.level == 1)
        claimed = [amount for amount in claims(self._config(), backend.id).values() if amount is not None]
        if keeps_weights and claimed:
            return sum(claimed)
        return tree_gib(backend.pid) or 0.0

    def room_for(self, backend: Backend) -> bool:
        """Whether `backend` may sleep within the host memory budget; stops the least recently
        used sleepers when that makes room (`make_room`)."""
        memory = self._config().host_memory
        falling = sum(self.cost(b) for b in self._backends.values() if b.state is State.FALLING_ASLEEP)
        sleepers = [(b.id, self.cost(b)) for b in self.asleep()]
        available = available_gib() if memory.budget_gib is None else None
        stop = make_room(self.cost(backend), sleepers, falling, memory, available)
        if stop is None:
            return False
        for model_id in stop:
            self._stop(self._backends[model_id])
        return True

    def enforce_budget(self) -> None:
        """A model fell asleep (its RAM now measured): stop sleepers beyond the budget (`over_budget`)."""
        memory = self._config().host_memory
        available = available_gib() if memory.budget_gib is None else None
        for model_id in over_budget([(b.id, self.cost(b)) for b in self.asleep()], memory, available):
            self._stop(self._backends[model_id])

    def stop_one_on(self, devices: tuple[int, ...]) -> bool:
        """A start is short of memory on `devices` (NVML): stop the least recently used sleeper that
        claims one of them (what the engine keeps asleep is freed when it exits). False when none does."""
        for sleeper in self.asleep():
            if set(claims(self._config(), sleeper.id)) & set(devices):
                log.info("stopping %s, asleep: what it keeps on device(s) %s is needed", sleeper.id,
                         ", ".join(map(str, devices)))
                sleeper.stop("its device memory is needed")
                return True
        return False

    def _stop(self, victim: Backend) -> None:
        log.info("stopping %s, asleep and least recently used: %s", victim.id, STOP_HOST_MEMORY)
        self._metrics.sleeper_stopped(victim.id)
        victim.stop(STOP_HOST_MEMORY)
