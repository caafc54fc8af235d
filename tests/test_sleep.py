"""Swaps by sleep and wake (`sleep:` per model, `hostMemory:` at the top), end to end over HTTP.

Every backend is a `swaplab sim` imitating vLLM's or SGLang's sleep API (`--engine`).
Two models that cannot share the GPU (llama-swap's default group: one at a time) swap
by putting the idle one to sleep and waking the other; the process of each stays the
same. Order is read from events (`/running`, the sims' `/sim/stats`), never from sleeps.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3

import aiohttp
import pytest
from procs import SIM, alive, eventually, wait_until
from routerclient import chat, running, sim_stats, wait_for_state

from swaplab.sim.personality import sleep_ready


def sleepy(model: str, engine: str, *flags: str, host_gib: float = 1, timeout: float = 10, extra: str = "") -> str:
    """A model entry whose sim is `engine`, started as that engine must be to sleep (its contract's flags and env)."""
    needed, env = sleep_ready(engine)
    sim_flags = " ".join(("--engine", engine, *needed, *flags))
    env_line = f"\n    env: [{', '.join(f'{name}={value}' for name, value in env.items())}]" if env else ""
    return f"""
  {model}:
    cmd: {SIM} --port ${{PORT}} --model {model} {sim_flags}{env_line}
    sleep:
      engine: {engine}
      hostMemoryGiB: {host_gib}
      timeout: {timeout}{extra}
"""


def config(*models: str, budget: float = 100) -> str:
    return f"hostMemory:\n  budgetGiB: {budget}\nmodels:" + "".join(models)


async def ask(session: aiohttp.ClientSession, url: str, model: str) -> None:
    status, answer = await chat(session, url, model, max_tokens=2)
    assert status == 200, answer


async def metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(wanted)}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def activity(router) -> list[dict]:
    with sqlite3.connect(router.db) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT model, status, waited_for, metadata FROM activity ORDER BY id")]


async def test_a_b_a_b_swaps_by_sleeps_and_wakes_alone(router_factory):
    router = router_factory(config(sleepy("a", "vllm", "--wake-seconds", "0.2"), sleepy("b", "sglang")))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        pid_a = (await running(session, url))["a"]["pid"]
        await ask(session, url, "b")
        now = await running(session, url)
        assert now["a"]["state"] == "sleeping" and now["a"]["pid"] == pid_a
        assert now["b"]["state"] == "ready"
        pid_b = now["b"]["pid"]
        async with session.get(f"{url}/v1/models") as response:
            listed = {entry["id"]: entry for entry in (await response.json())["data"]}
        assert listed["a"]["status"] == {"value": "loaded", "state": "sleeping"}  # a process, asleep

        await ask(session, url, "a")
        now = await running(session, url)
        assert (now["a"]["state"], now["b"]["state"]) == ("ready", "sleeping")
        assert (now["a"]["pid"], now["b"]["pid"]) == (pid_a, pid_b)  # the same processes: no restart
        await ask(session, url, "b")
        now = await running(session, url)
        assert (now["a"]["state"], now["b"]["state"]) == ("sleeping", "ready")
        assert (now["a"]["pid"], now["b"]["pid"]) == (pid_a, pid_b)
        assert now["a"]["sleep"]["sleeps"] == 2 and now["a"]["sleep"]["wakes"] == 1
        assert now["b"]["sleep"]["sleeps"] == 1 and now["b"]["sleep"]["wakes"] == 1

        stats_a = await sim_stats(session, now["a"]["proxy"])  # straight to it: /upstream/a would wake it
        assert stats_a["sleeps"] == 2 and stats_a["wakes"] == 1 and stats_a["asleep"] is True
        assert stats_a["sleeps_while_busy"] == 0
        assert await metric(session, url, "swaplab:backend_wakes_total", model="a") == 1
        assert await metric(session, url, "swaplab:backend_sleeps_total", model="a") == 2
        assert await metric(session, url, "swaplab:backend_starts_total", model="a", outcome="ok") == 1
        assert await metric(session, url, "swaplab:backend_starts_total", model="b", outcome="ok") == 1

    def recorded() -> list[dict] | None:
        rows = activity(router)
        return rows if len(rows) == 4 else None

    rows = wait_until(recorded, 15, "four activity rows")
    assert [(row["model"], row["waited_for"]) for row in rows] == [
        ("a", "start"), ("b", "start"), ("a", "wake"), ("b", "wake"),
    ]


async def test_send_loading_state_says_waking_not_loading(router_factory):
    router = router_factory("sendLoadingState: true\n" + config(
        sleepy("a", "vllm", "--wake-seconds", "1.5"), sleepy("b", "vllm"),
    ))
    url = router.url
    body = {"model": "a", "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        await ask(session, url, "b")
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            raw = (await response.read()).decode()
    events = [block.removeprefix("data: ") for block in raw.split("\n\n") if block.startswith("data: ")]
    chunks = [json.loads(event) for event in events[:-1]]
    progress = [c["choices"][0]["delta"].get("reasoning_content") for c in chunks if c["choices"]]
    progress = [text for text in progress if text]
    assert any("waking a" in text for text in progress), progress
    assert not any("loading a" in text for text in progress), progress


async def test_the_host_budget_stops_the_least_recently_used_sleeper(router_factory):
    router = router_factory(config(
        sleepy("a", "vllm", host_gib=10), sleepy("b", "vllm", host_gib=10), sleepy("c", "vllm", host_gib=10),
        budget=15,
    ))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        await ask(session, url, "b")  # a asleep: 10 of 15 GiB
        assert (await running(session, url))["a"]["state"] == "sleeping"
        await ask(session, url, "c")  # b asleep too would make 20: a, the oldest sleeper, stops
        await wait_for_state(session, url, "a", "stopped")
        now = await running(session, url)
        assert (now["b"]["state"], now["c"]["state"]) == ("sleeping", "ready")
        assert await metric(session, url, "swaplab:sleepers_stopped_total", model="a") == 1


async def test_a_sleeper_that_cannot_fit_the_budget_is_stopped(router_factory):
    router = router_factory(config(sleepy("a", "vllm", host_gib=20), sleepy("b", "vllm"), budget=15))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        await ask(session, url, "b")
        await wait_for_state(session, url, "a", "stopped")
        assert await metric(session, url, "swaplab:backend_sleeps_total", model="a") == 0


async def test_a_failing_wake_falls_back_to_a_cold_start_that_serves(router_factory):
    router = router_factory(config(sleepy("a", "vllm", "--wake-fault", "error"), sleepy("b", "vllm")))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        first_pid = (await running(session, url))["a"]["pid"]
        await ask(session, url, "b")
        await ask(session, url, "a")  # the wake fails: a is stopped and started cold, and answers
        now = await running(session, url)
        assert now["a"]["state"] == "ready" and now["a"]["pid"] != first_pid
        assert not alive(first_pid)
        assert "wake failed" in now["a"]["sleep"]["last_fallback"]
        assert now["a"]["sleep"]["enabled"] is True  # once is not yet twice
        assert await metric(session, url, "swaplab:sleep_fallbacks_total", model="a", during="wake") == 1

        def fallback_recorded() -> dict | None:
            rows = activity(router)
            return rows[2] if len(rows) >= 3 else None

        row = wait_until(fallback_recorded, 15, "the third request's activity row")
        assert row["waited_for"] == "start" and "its wake failed" in json.loads(row["metadata"])["fallback"]

        await ask(session, url, "b")
        await ask(session, url, "a")  # the second failure in a row
        now = await running(session, url)
        assert now["a"]["sleep"]["enabled"] is False
        await ask(session, url, "b")  # a is no longer put to sleep: it is stopped
        await wait_for_state(session, url, "a", "stopped")
        assert await metric(session, url, "swaplab:sleep_fallbacks_total", model="a", during="wake") == 2
    assert "its wake failed" in router.output()


@pytest.mark.parametrize("fault", ["hang", "crash"])
async def test_a_wake_that_hangs_past_its_timeout_or_crashes_falls_back_too(router_factory, fault):
    router = router_factory(config(sleepy("a", "sglang", "--wake-fault", fault, timeout=1), sleepy("b", "sglang")))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        first_pid = (await running(session, url))["a"]["pid"]
        await ask(session, url, "b")
        await ask(session, url, "a")
        now = await running(session, url)
        assert now["a"]["state"] == "ready" and now["a"]["pid"] != first_pid
        # a crash is seen as the connection's end or as the exit, whichever the router hears first
        expected = ("no answer within 1 s",) if fault == "hang" else ("Server disconnected", "the process exited")
        assert any(words in now["a"]["sleep"]["last_fallback"] for words in expected), now["a"]["sleep"]
        assert await metric(session, url, "swaplab:sleep_fallbacks_total", model="a", during="wake") == 1


async def test_a_failing_sleep_stops_the_model_instead(router_factory):
    router = router_factory(config(sleepy("a", "sglang", "--sleep-fault", "error"), sleepy("b", "sglang")))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        await ask(session, url, "b")
        await wait_for_state(session, url, "a", "stopped")
        assert await metric(session, url, "swaplab:sleep_fallbacks_total", model="a", during="sleep") == 1
        assert (await running(session, url))["a"]["sleep"]["last_fallback"].startswith("its sleep failed")


async def test_a_busy_model_is_never_put_to_sleep(router_factory):
    router = router_factory(config(sleepy("a", "vllm", "--tokens-per-second", "20"), sleepy("b", "vllm")))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        body = {"model": "a", "stream": True, "max_tokens": 30, "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(f"{url}/v1/chat/completions", json=body) as stream:
            assert stream.status == 200
            await stream.content.readline()  # a is streaming
            other = asyncio.ensure_future(chat(session, url, "b", max_tokens=1))

            async def b_queued() -> bool:
                return (await running(session, url)).get("b", {}).get("queued") == 1

            await eventually(b_queued, 15, "b to queue behind a's stream")
            assert (await running(session, url))["a"]["state"] == "ready"  # busy: not asleep
            await stream.read()
        status, _ = await other
        assert status == 200
        now = await running(session, url)
        assert now["a"]["state"] == "sleeping"
        stats = await sim_stats(session, now["a"]["proxy"])
        assert stats["sleeps_while_busy"] == 0 and stats["completed"] == 2


async def test_unload_while_falling_asleep_leaves_no_process(router_factory):
    router = router_factory(config(sleepy("a", "vllm", "--sleep-seconds", "30"), sleepy("b", "vllm")))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        pid = (await running(session, url))["a"]["pid"]
        waiting = asyncio.ensure_future(chat(session, url, "b", max_tokens=1))
        await wait_for_state(session, url, "a", "falling_asleep")
        async with session.post(f"{url}/unload?model=a") as response:
            assert response.status == 200, await response.text()
        await wait_for_state(session, url, "a", "stopped")
        assert not alive(pid)
        status, _ = await waiting
        assert status == 200


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_no_process_outlives_the_router_sleeping_ones_included(router_factory, how):
    router = router_factory(config(sleepy("a", "vllm"), sleepy("b", "sglang")))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        await ask(session, url, "b")
        now = await running(session, url)
    assert now["a"]["state"] == "sleeping"
    pids = [now["a"]["pid"], now["b"]["pid"]]
    router.signal(how)
    router.wait(30)
    for pid in pids:
        wait_until(lambda pid=pid: not alive(pid), 15, f"backend {pid} to exit after the router got {how.name}")


async def test_a_reload_that_changes_a_sleeping_model_stops_it_and_the_next_request_starts_the_new_entry(
    router_factory, tmp_path
):
    text = config(sleepy("a", "vllm"), sleepy("b", "vllm"))
    router = router_factory(text)
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        await ask(session, url, "b")
        old = (await running(session, url))["a"]
        assert old["state"] == "sleeping"
        path = tmp_path / "config.yaml"
        path.write_text(path.read_text().replace("--model a", "--model a --ttft-ms 1"))
        router.signal(signal.SIGHUP)
        await wait_for_state(session, url, "a", "stopped")  # not woken, not left asleep: stopped
        assert not alive(old["pid"])
        assert (await running(session, url))["b"]["state"] == "ready"  # unchanged: untouched
        await ask(session, url, "a")
        assert (await running(session, url))["a"]["pid"] != old["pid"]


async def test_the_sleep_button_puts_an_idle_model_to_sleep_and_says_why_not_otherwise(router_factory):
    router = router_factory(config(sleepy("a", "vllm"), f"""
  plain:
    cmd: {SIM} --port ${{PORT}} --model plain
"""))
    url = router.url
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/api/models/sleep/a") as response:
            assert response.status == 409 and "not ready" in (await response.json())["error"]["message"]
        await ask(session, url, "a")
        async with session.post(f"{url}/api/models/sleep/a") as response:
            assert (response.status, await response.json()) == (200, {"msg": "ok"})
        await wait_for_state(session, url, "a", "sleeping")
        await ask(session, url, "a")  # woken by the next request
        await ask(session, url, "plain")
        async with session.post(f"{url}/api/models/sleep/plain") as response:
            assert response.status == 409 and "no sleep:" in (await response.json())["error"]["message"]
        async with session.post(f"{url}/api/models/sleep/nope") as response:
            assert response.status == 404


async def test_a_sleepers_device_claim_is_listed_apart_and_frees_the_device(router_factory):
    """With declared devices, memory decides who must leave; a sleeper's claim is shown asleep, not held."""
    on_device = "\n    devices: [0]\n    vramGiB: 12"
    router = router_factory("devices:\n  0: {name: fake, vramGiB: 16}\n" + config(
        sleepy("a", "vllm") + on_device, sleepy("b", "vllm") + on_device,
    ))
    url = router.url
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "a")
        await ask(session, url, "b")  # 12 + 12 > 16: a must leave, and sleeps
        async with session.get(f"{url}/running") as response:
            listed = await response.json()
    (device,) = listed["devices"]
    assert (device["models"], device["asleep"], device["claimed_gib"]) == ({"b": 12.0}, {"a": 12.0}, 12.0)


async def test_wakes_are_timed_into_the_store_and_the_next_wake_has_an_eta(router_factory):
    router = router_factory("sendLoadingState: true\n" + config(
        sleepy("a", "vllm", "--wake-seconds", "1.5"), sleepy("b", "vllm"),
    ))
    body = {"model": "a", "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    said = []
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a")
        for _ in range(2):  # b puts a to sleep; a wakes
            await ask(session, router.url, "b")
            async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
                said.append((await response.read()).decode())
    assert "no earlier load" in said[0] and "earlier load" in said[1] and "left" in said[1]
    with sqlite3.connect(router.db) as db:
        rows = db.execute("SELECT model, kind, stages FROM loads ORDER BY id").fetchall()
    wakes = [json.loads(stages) for model, kind, stages in rows if model == "a" and kind == "wake"]
    assert len(wakes) == 2 and all([name for name, _ in stages] == ["waking"] for stages in wakes)
    assert {model for model, kind, _ in rows if kind == "start"} == {"a", "b"}
