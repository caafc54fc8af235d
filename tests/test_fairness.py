"""Steady traffic to some models never starves a request for a model that excludes them; fifo priority.

The fleet runs in the test's own event loop over real `swaplab sim` backends.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from procs import SIM, free_port_block
from swaplab.config.loader import load_config_text
from swaplab.fleet import Fleet, LogHub
from swaplab.fleet import fleet as fleet_module
from swaplab.fleet.lease import BackendUnavailable


async def test_an_exclusive_model_is_served_while_non_exclusive_ones_stay_busy(tmp_path: Path):
    # solo is ungrouped (swap + exclusive): starting it stops the side models. side2 takes
    # a second longer to stop than side1 takes to start again, so each time they are
    # evicted, side1's own queue would start it again before solo's turn came, forever
    # (found by benchmarks/soak.py).
    config = load_config_text(f"""
startPort: {free_port_block()}
healthCheckTimeout: 60
models:
  solo:
    cmd: {SIM} --port ${{PORT}} --model solo
  side1:
    cmd: {SIM} --port ${{PORT}} --model side1
  side2:
    cmd: {SIM} --port ${{PORT}} --model side2
    cmdStop: sh -c "sleep 1.5; kill ${{PID}}"
groups:
  side:
    swap: false
    exclusive: false
    members: [side1, side2]
""", "fair.yaml")
    fleet = Fleet(config, state_dir=tmp_path / "state", logs=LogHub())
    await fleet.open()
    stop = asyncio.Event()
    served = {"side1": 0, "side2": 0}
    served_changed = asyncio.Condition()

    async def steady(model: str) -> None:
        while not stop.is_set():
            try:
                async with fleet.lease(model):
                    served[model] += 1
                    async with served_changed:
                        served_changed.notify_all()
                    # The scenario, not an ordering: a request holds its lease a while on the backend.
                    await asyncio.sleep(0.2)
            except BackendUnavailable:
                pass

    async def served_until(condition) -> None:
        async with served_changed:
            await served_changed.wait_for(condition)

    try:
        clients = [asyncio.ensure_future(steady(m)) for m in ("side1", "side2", "side1", "side2")]
        await asyncio.wait_for(served_until(lambda: served["side1"] and served["side2"]), 60)
        # solo's request arrives while both side models are busy, and traffic to them goes on.
        lease = await asyncio.wait_for(fleet.acquire("solo"), 60)
        assert fleet.state_of("solo") == "ready"
        fleet.release(lease, succeeded=True)
        before = dict(served)
        # ...and the side models are served again afterwards: nobody starves the other way.
        await asyncio.wait_for(served_until(lambda: all(served[m] > before[m] for m in served)), 60)
    finally:
        stop.set()
        await asyncio.gather(*clients, return_exceptions=True)
        await fleet.close()


@pytest.mark.parametrize("batch_window", [fleet_module.BATCH_WINDOW_SECONDS, 0.0])
async def test_waiting_requests_are_served_by_priority_then_arrival(tmp_path: Path, monkeypatch, batch_window):
    """llama-swap's TestFIFO_PriorityQueueOrder with real backends: A 10, B 5, C 5, D 1 (z 0).

    With a batch window of 0 every older request is overdue at once, so this also proves that
    a request never yields to an older one of lower priority: otherwise B, the first to
    arrive, would go first.
    """
    monkeypatch.setattr(fleet_module, "BATCH_WINDOW_SECONDS", batch_window)
    models = "".join(f"  {m}:\n    cmd: {SIM} --port ${{PORT}} --model {m}\n" for m in "zABCD")
    config = load_config_text(f"startPort: {free_port_block()}\nhealthCheckTimeout: 60\nmodels:\n{models}", "fifo.yaml")
    fleet = Fleet(replace(config, priority={"A": 10, "B": 5, "C": 5, "D": 1}), state_dir=tmp_path / "s", logs=LogHub())
    await fleet.open()
    order: list[str] = []

    async def served(model: str) -> None:
        lease = await fleet.acquire(model)
        order.append(model)
        fleet.release(lease, succeeded=True)

    try:
        z = await asyncio.wait_for(fleet.acquire("z"), 60)  # held: every other model must wait for it
        requests = []
        for model in "BDCA":  # out of priority order; B before C: equal priorities keep arrival order
            requests.append(asyncio.ensure_future(served(model)))
            await asyncio.sleep(0)  # one round of the loop: this request is queued before the next arrives
        assert [w.model for w in fleet._waiting] == ["A", "B", "C", "D"]
        fleet.release(z, succeeded=True)
        await asyncio.wait_for(asyncio.gather(*requests), 120)
        assert order == ["A", "B", "C", "D"]
    finally:
        await fleet.close()


async def test_priority_orders_the_queue_and_never_holds_back_a_request_that_can_go(tmp_path: Path):
    """A lower-priority request for a ready model is served while a higher-priority one waits for a busy model."""
    models = "".join(f"  {m}:\n    cmd: {SIM} --port ${{PORT}} --model {m}\n" for m in ("low", "busy", "high"))
    config = load_config_text(f"""startPort: {free_port_block()}
healthCheckTimeout: 60
models:
{models}groups:
  side: {{swap: false, exclusive: false, members: [low]}}
""", "fifo.yaml")
    fleet = Fleet(replace(config, priority={"high": 10}), state_dir=tmp_path / "s", logs=LogHub())
    await fleet.open()
    try:
        busy = await asyncio.wait_for(fleet.acquire("busy"), 60)
        fleet.release(await asyncio.wait_for(fleet.acquire("low"), 60), succeeded=True)  # non-exclusive: beside busy
        high = asyncio.ensure_future(fleet.acquire("high"))  # must stop busy (and low): waits
        await asyncio.sleep(0)  # one round of the loop: it is queued
        assert not high.done()
        lease = await asyncio.wait_for(fleet.acquire("low"), 10)  # ready: served at once, queue or not
        fleet.release(lease, succeeded=True)
        assert not high.done()
        fleet.release(busy, succeeded=True)
        fleet.release(await asyncio.wait_for(high, 60), succeeded=True)
        assert fleet.state_of("low") != "ready" and fleet.state_of("busy") != "ready"
    finally:
        await fleet.close()
