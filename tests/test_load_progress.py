"""Loads you can watch, end to end: a sim that starts like vLLM (its real startup lines,
tests/fixtures/startup/vllm.log, replayed at a pace) behind a real router. Its stages and
fractions reach `/api/events` (modelStatus's `progress`), `/running` and sendLoadingState's
messages as they happen, and the second start's ETA rests on the first one's duration."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
from procs import SIM
from routerclient import running
from test_llama_swap_api import EventStream

VLLM_LOG = Path(__file__).parent / "fixtures" / "startup" / "vllm.log"


def config(seconds: float) -> str:
    return f"""
healthCheckTimeout: 60
sendLoadingState: true
models:
  v:
    cmd: {SIM} --port ${{PORT}} --model v --startup-log {VLLM_LOG} --startup-seconds {seconds}
"""


async def stream_chat(session: aiohttp.ClientSession, url: str) -> list[str]:
    """The reasoning deltas (the loading state) of one streamed chat, in order."""
    body = {"model": "v", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    deltas = []
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("reasoning_content"):
                deltas.append(delta["reasoning_content"])
    return deltas


async def watched_load(session: aiohttp.ClientSession, url: str) -> tuple[list[dict], list[str]]:
    """One cold start of `v` seen on the live feed (its progress objects, until ready) and in the chat."""
    async with session.get(f"{url}/api/events") as response:
        events = EventStream(response)
        await events.until("modelStatus")
        chat = asyncio.create_task(stream_chat(session, url))
        seen: list[dict] = []

        def v_of(payload):
            return next(entry for entry in payload if entry["id"] == "v")

        while True:
            entry = v_of(await events.until("modelStatus"))
            if entry.get("progress"):
                seen.append(entry["progress"])
            if entry["state"] == "ready":
                assert "progress" not in entry  # a ready model has no load under way
                break
        return seen, await chat


async def test_a_vllm_like_start_shows_its_stages_and_the_next_one_an_eta(router_factory):
    router = router_factory(config(4.0))
    async with aiohttp.ClientSession() as session:
        first, said = await watched_load(session, router.url)
        stages = [p["stage"] for p in first]
        order = [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s]
        # The engine's own stages, in its order, each fraction rising within its stage.
        assert {"loading weights", "capturing CUDA graphs"} <= set(order), order
        assert order.index("loading weights") < order.index("capturing CUDA graphs")
        for stage in ("loading weights", "capturing CUDA graphs"):
            fractions = [p["fraction"] for p in first if p["stage"] == stage and p["fraction"] is not None]
            assert fractions and fractions == sorted(fractions) and len(set(fractions)) > 1, (stage, fractions)
        assert all(p["engine"] == "vLLM" for p in first if p["stage"] in ("loading weights", "capturing CUDA graphs"))
        assert all(p["eta_seconds"] is None and p["history"] == 0 for p in first)  # no earlier load here
        assert said and all(text.startswith("[swaplab] loading v") for text in said)
        assert any("no earlier load" in text for text in said)
        took = (await running(session, router.url))["v"]["start_seconds"]

        async with session.post(f"{router.url}/api/models/unload/v") as response:
            assert response.status == 200
        second, said = await watched_load(session, router.url)
        assert second and all(p["history"] == 1 and p["eta_seconds"] is not None for p in second)
        assert abs(second[0]["usual_seconds"] - took) <= 0.1  # the first start's own duration
        percents = [p["percent"] for p in second]
        assert percents == sorted(percents) and percents[-1] > percents[0]
        assert any("earlier load" in text and "left" in text for text in said)
        done = [int(re.search(r"(\d+)% done", text).group(1)) for text in said if "% done" in text]
        assert done and done == sorted(done), said  # the loading state's share only grows
