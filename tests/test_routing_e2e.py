"""`routing` end to end: a real router on a llama-swap config, real `swaplab sim` backends.

The matrix router keeping a costly embedder resident while two LLMs swap, and the fifo
scheduler's priority serving the higher-priority model's waiting request first.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from procs import SIM, alive, eventually, free_port_block
from routerclient import chat, running


def sim(model: str, extra: str = "") -> str:
    return f"{SIM} --port ${{PORT}} --model {model} {extra}"


async def test_the_matrix_keeps_the_embedder_resident_while_two_llms_swap(router_factory):
    # The sets tie for llm-b beside llm-a and embed (each evicts one model): without the
    # embedder's cost the earlier set, `llms`, would win and stop it.
    router = router_factory(f"""
startPort: {free_port_block()}
models:
  llm-a: {{cmd: "{sim('llm-a')}"}}
  llm-b: {{cmd: "{sim('llm-b')}"}}
  embed: {{cmd: "{sim('embed')}"}}
routing:
  router:
    use: matrix
    settings:
      matrix:
        vars: {{a: llm-a, b: llm-b, e: embed}}
        evict_costs: {{e: 10}}
        sets:
          llms: "a & b"
          rag: "(a | b) & e"
""")
    async with aiohttp.ClientSession() as session:
        for model in ("embed", "llm-a"):
            status, body = await chat(session, router.url, model, max_tokens=2)
            assert status == 200, body
        state = await running(session, router.url)
        assert {m: e["state"] for m, e in state.items()} == {"embed": "ready", "llm-a": "ready"}
        embed, llm_a = state["embed"]["pid"], state["llm-a"]["pid"]

        status, body = await chat(session, router.url, "llm-b", max_tokens=2)
        assert status == 200, body
        state = await running(session, router.url)
        assert {m: e["state"] for m, e in state.items()} == {"embed": "ready", "llm-b": "ready"}
        assert not alive(llm_a) and state["embed"]["pid"] == embed

        status, body = await chat(session, router.url, "llm-a", max_tokens=2)
        assert status == 200, body
        state = await running(session, router.url)
        assert {m: e["state"] for m, e in state.items()} == {"embed": "ready", "llm-a": "ready"}
        assert state["embed"]["pid"] == embed and alive(embed)


async def test_fifo_priority_serves_the_higher_priority_models_waiting_request_first(router_factory):
    # One model at a time (no groups). While `busy` answers a slow request, `low` asks
    # first and `high` second: `high` is served first, and `low` only once `high` is idle.
    router = router_factory(f"""
startPort: {free_port_block()}
models:
  busy: {{cmd: "{sim('busy', '--ttft-ms 1500')}"}}
  low: {{cmd: "{sim('low')}"}}
  high: {{cmd: "{sim('high')}"}}
routing:
  scheduler:
    use: fifo
    settings:
      fifo:
        priority: {{high: 10}}
""")
    finished: dict[str, float] = {}

    async def timed(session: aiohttp.ClientSession, model: str) -> None:
        status, body = await chat(session, router.url, model, max_tokens=2)
        assert status == 200, body
        finished[model] = time.monotonic()

    async def queued(model: str):
        async def check():
            return (await running(session, router.url)).get(model, {}).get("queued") == 1

        await eventually(check, 10, f"a request for {model} to be queued")

    async with aiohttp.ClientSession() as session:
        status, body = await chat(session, router.url, "busy", max_tokens=2)  # started, so the next one only waits
        assert status == 200, body
        slow = asyncio.ensure_future(timed(session, "busy"))
        await eventually(
            lambda: _in_flight(session, router.url, "busy"), 10, "busy to hold its slow request"
        )
        low = asyncio.ensure_future(timed(session, "low"))
        await queued("low")
        high = asyncio.ensure_future(timed(session, "high"))
        await queued("high")
        await asyncio.wait_for(asyncio.gather(slow, low, high), 60)
    assert finished["busy"] < finished["high"] < finished["low"]


async def _in_flight(session: aiohttp.ClientSession, url: str, model: str) -> bool:
    return (await running(session, url)).get(model, {}).get("in_flight") == 1
