"""Loads you can watch, end to end: a sim that starts like vLLM (its real startup lines,
tests/fixtures/startup/vllm.log, replayed at a pace) behind a real router. Its stages and
fractions reach `/api/events` (modelStatus's `progress`), `/running` and sendLoadingState's
messages as they happen, and the second start's ETA rests on the first one's duration. A
load that goes silent still moves on the page (its time, each second) and says when it is
probably stuck."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
from procs import SIM
from routerclient import running
from swaplab.router.path.loading import stage_text
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


async def test_a_silent_load_advances_on_the_page_and_shows_it_is_probably_stuck(router_factory, tmp_path):
    # One command that starts at once the first time and hangs, silent, the second (as an engine stuck
    # on a lock or a dead mount would): the first start is the history the second is measured against.
    pause = tmp_path / "pause"
    pause.write_text("0")
    router = router_factory(f"""
healthCheckTimeout: 300
models:
  s:
    cmd: sh -c 'sleep "$(cat {pause})" && exec {SIM} --port ${{PORT}} --model s'
""")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/load?model=s") as response:
            assert response.status == 200
        async with session.post(f"{router.url}/api/models/unload/s") as response:
            assert response.status == 200
        pause.write_text("600")
        async with session.get(f"{router.url}/api/events") as response:
            events = EventStream(response)
            await events.until("modelStatus")
            async def load_s() -> int:
                async with session.post(f"{router.url}/load?model=s") as answer:
                    return answer.status

            load = asyncio.create_task(load_s())
            seen: list[dict] = []

            def stuck(payload) -> bool:
                entry = next(entry for entry in payload if entry["id"] == "s")
                if entry.get("progress"):
                    seen.append(entry["progress"])
                return bool(entry.get("progress", {}).get("stuck"))

            try:
                # At least 10 s of silence past twice the first start's time: the modelStatus the page reads says so.
                last = await asyncio.wait_for(events.until("modelStatus", stuck), 60)
                assert (await running(session, router.url))["s"]["progress"]["stuck"]  # and /running, read now
            finally:
                async with session.post(f"{router.url}/api/models/unload/s") as unloaded:
                    assert unloaded.status == 200
                assert await load == 503  # stopped while starting
    progress = next(entry for entry in last if entry["id"] == "s")["progress"]
    assert progress["history"] == 1 and progress["silent_seconds"] >= 10 and progress["stage"] == "starting"
    # Not one line from the server, yet the time went on: the clock, not the engine, moved these.
    elapsed = [view["elapsed_seconds"] for view in seen]
    assert elapsed == sorted(elapsed) and len(set(elapsed)) >= 10, elapsed
    assert all(view["silent_seconds"] == view["elapsed_seconds"] for view in seen), seen
    assert not any(view["stuck"] for view in seen[:-1]) and seen[-1]["stuck"]


def test_a_stuck_load_says_so_with_or_without_a_usual_time():
    first = {"stage": "starting", "fraction": None, "percent": None, "elapsed_seconds": 130.0, "silent_seconds": 125.0,
             "eta_seconds": None, "usual_seconds": None, "history": 0, "stuck": True}
    assert stage_text(first) == "starting · 130 s · probably stuck: no output for 125 s, on a first load"
    later = {**first, "usual_seconds": 4.0, "history": 2, "eta_seconds": 0.0, "percent": 100}
    assert stage_text(later) == "starting · 100% done · 130 s · probably stuck: no output for 125 s, past twice its usual 4 s"
