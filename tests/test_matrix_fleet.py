"""The matrix router in the fleet: real `swaplab sim` backends, the fleet in the test's own event loop.

llama-swap's router tests for the matrix (internal/router/matrix_test.go) with real
processes: a set that excludes a model stops it, a set that holds both runs them side by
side (their starts in parallel), an incompatible request waits for the first to be served,
and a costly embedder stays resident while two LLMs swap.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from fleets import opened_fleets
from procs import SIM, alive, free_port_block
from swaplab.config.loader import load_config_text
from swaplab.config.matrix import matrix_from_data
from swaplab.fleet import Fleet, State


def sims(*models: str, load_seconds: float = 0) -> str:
    entries = "".join(
        f"  {m}:\n    cmd: {SIM} --port ${{PORT}} --model {m} --load-seconds {load_seconds}\n" for m in models
    )
    return f"startPort: {free_port_block()}\nhealthCheckTimeout: 60\nmodels:\n{entries}"


@pytest.fixture
async def matrix_fleet(tmp_path: Path):
    """`matrix_fleet(models, sets, ...)`: an opened fleet of sims under that matrix; all closed at the end."""
    async with opened_fleets(tmp_path) as open_fleet:

        async def make(models: str, sets: dict[str, str], evict_costs: dict[str, int] | None = None,
                       load_seconds: float = 0) -> Fleet:
            config = load_config_text(sims(*models.split(), load_seconds=load_seconds), "matrix.yaml")
            matrix = matrix_from_data({"sets": sets, "evict_costs": evict_costs or {}}, list(config.models))
            return await open_fleet(replace(config, router="matrix", matrix=matrix))

        yield make


async def served(fleet: Fleet, model: str) -> int:
    """One request to `model`, start included; the pid that served it."""
    lease = await asyncio.wait_for(fleet.acquire(model), 60)
    fleet.release(lease, succeeded=True)
    assert lease.backend.pid is not None
    return lease.backend.pid


def running(fleet: Fleet) -> set[str]:
    return {m for m in fleet.config.models if fleet.state_of(m) is not State.STOPPED}


async def test_a_set_that_excludes_a_model_stops_it(matrix_fleet):
    fleet = await matrix_fleet("a b", {"s_a": "a", "s_b": "b"})
    a = await served(fleet, "a")
    await served(fleet, "b")
    assert running(fleet) == {"b"} and not alive(a)


async def test_models_of_one_set_run_side_by_side_and_start_in_parallel(matrix_fleet):
    fleet = await matrix_fleet("a b", {"s_ab": "a & b"}, load_seconds=1)
    both = [asyncio.ensure_future(fleet.acquire(m)) for m in ("a", "b")]
    await asyncio.sleep(0)  # one round of the loop: both requests have asked for their start
    assert fleet.state_of("a") is State.STARTING and fleet.state_of("b") is State.STARTING
    for lease in await asyncio.wait_for(asyncio.gather(*both), 60):
        fleet.release(lease, succeeded=True)
    assert running(fleet) == {"a", "b"}
    assert fleet.swaps == 0


async def test_an_incompatible_request_waits_until_the_first_is_served_then_evicts_it(matrix_fleet):
    fleet = await matrix_fleet("a b", {"s_a": "a", "s_b": "b"})
    first = asyncio.ensure_future(fleet.acquire("a"))
    second = asyncio.ensure_future(fleet.acquire("b"))
    lease_a = await asyncio.wait_for(first, 60)
    assert fleet.state_of("b") is State.STOPPED and not second.done()  # a is starting, then busy: b waits
    waiting = {entry["model"]: entry.get("waiting") for entry in fleet.status()}
    assert waiting["b"] == "model 'b' waits for 'a' (busy) before it can start"
    fleet.release(lease_a, succeeded=True)
    lease_b = await asyncio.wait_for(second, 60)
    fleet.release(lease_b, succeeded=True)
    assert running(fleet) == {"b"}


async def test_the_costly_embedder_stays_resident_while_two_llms_swap(matrix_fleet, caplog):
    # Without the cost the tie between the two sets would go to `llms`, evicting the embedder.
    fleet = await matrix_fleet("llm-a llm-b embed", {"llms": "llm-a & llm-b", "rag": "(llm-a | llm-b) & embed"},
                               evict_costs={"embed": 10})
    embed = await served(fleet, "embed")
    first = await served(fleet, "llm-a")
    assert running(fleet) == {"embed", "llm-a"}
    caplog.set_level("INFO", logger="swaplab.fleet")
    await served(fleet, "llm-b")
    assert running(fleet) == {"embed", "llm-b"} and not alive(first)
    assert "stopping llm-a to make room for llm-b (matrix set 'rag' runs 'llm-b' without 'llm-a')" in caplog.text
    await served(fleet, "llm-a")
    assert running(fleet) == {"embed", "llm-a"}
    assert await served(fleet, "embed") == embed and fleet.swaps == 2
