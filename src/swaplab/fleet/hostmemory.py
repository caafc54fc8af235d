"""How much host RAM sleeping models may hold: which sleepers must stop so that another may sleep.

Pure arithmetic over GiB. A declared `hostMemory.budgetGiB` bounds what the sleepers hold
together (declared or measured per sleeper); without one, sleepers may hold RAM while the
system's available memory stays above `headroomGiB`. Sleepers are given least recently
used first: they are the first to stop.
"""

from __future__ import annotations

from collections.abc import Sequence

import psutil

from swaplab.config.model import HostMemory

GIB = 1024**3

Sleeper = tuple[str, float]
"""A sleeping model's id and the GiB of RAM it holds."""


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
