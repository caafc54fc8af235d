"""router/watch/batch.py: when the records of ended requests are made, on a clock the test moves itself."""

from __future__ import annotations

import asyncio

from swaplab.router.watch.batch import Batch

# Timers far beyond the test's life: the test turns the batch itself (`step`), on its own clock.
NEVER = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def batch_on(clock: Clock, arrivals: list[float], handled: list[list[int]], size: int = 32) -> Batch[int]:
    return Batch(
        handled.append, lambda: arrivals[-1] if arrivals else 0.0,
        delay=NEVER, quiet=0.010, patience=0.500, size=size, clock=clock,
    )


async def test_a_burst_still_ending_is_not_quiet_though_nothing_arrives():
    """All 64 of a burst arrive at once and end over the next 15 ms: 10 ms after the last
    arrival the burst is still running, and its records must wait until it is over."""
    clock, arrivals, handled = Clock(), [], []
    batch = batch_on(clock, arrivals, handled)
    arrivals.append(clock.now)  # the burst arrives
    for number in range(15):  # and ends, one a millisecond
        clock.now += 0.001
        batch.add(number)
    assert batch.step() is not None and handled == []  # 15 ms after the arrivals, 0 after the last end
    clock.now += 0.006
    assert batch.step() is not None and handled == []  # 6 ms of quiet
    clock.now += 0.005
    assert batch.step() is None
    assert handled == [list(range(15))]


async def test_a_slice_per_turn_and_quiet_awaited_again_between_slices():
    clock, arrivals, handled = Clock(), [], []
    batch = batch_on(clock, arrivals, handled, size=4)
    for number in range(10):
        batch.add(number)
    clock.now += 0.020
    assert batch.step() == 0.0 and handled == [[0, 1, 2, 3]]  # more left: at the loop's next turn
    arrivals.append(clock.now)  # a request came between two slices
    assert batch.step() is not None and len(handled) == 1  # the rest waits for quiet again
    clock.now += 0.011
    assert batch.step() == 0.0 and batch.step() is None
    assert handled == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(batch) == 0


async def test_a_router_never_quiet_still_records_after_patience():
    clock, arrivals, handled = Clock(), [], []
    batch = batch_on(clock, arrivals, handled, size=2)
    batch.add(0)
    for _ in range(60):  # a request every 9 ms for 540 ms
        clock.now += 0.009
        arrivals.append(clock.now)
        batch.step()
    assert handled == [[0]]  # once it had waited 0.5 s
    batch.add(1)
    batch.add(2)
    clock.now += 0.001
    arrivals.append(clock.now)
    assert batch.step() is not None and handled == [[0]]  # the new ones wait their own patience


async def test_drain_takes_everything_and_the_timer_runs_the_batch_by_itself():
    clock, arrivals, handled = Clock(), [], []
    batch = batch_on(clock, arrivals, handled)
    for number in range(3):
        batch.add(number)
    batch.drain()
    assert handled == [[0, 1, 2]] and len(batch) == 0
    batch.drain()
    assert handled == [[0, 1, 2]]  # nothing is handled twice

    done = asyncio.Event()
    real = Batch(lambda items: (handled.append(items), done.set()), lambda: 0.0, delay=0.0, quiet=0.0,
                 patience=0.0, size=1)
    for number in (7, 8):
        real.add(number)
    await done.wait()
    while len(real):  # one slice per turn of the loop
        await asyncio.sleep(0)
    assert handled[1:] == [[7], [8]]
