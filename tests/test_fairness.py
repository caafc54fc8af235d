"""Steady traffic to some models never starves a request for a model that excludes them.

The fleet runs in the test's own event loop over real `swaplab sim` backends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from procs import SIM, free_port_block
from swaplab.config.loader import load_config_text
from swaplab.fleet import Fleet, LogHub
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
