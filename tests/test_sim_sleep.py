"""`swaplab sim --engine vllm|sglang`: the engines' sleep APIs, their delays and faults, spoken to
over real HTTP on loopback; and the sleep state machine's rules as a table."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from procs import Sim, eventually, run_swaplab

from swaplab.sim.request import BadRequest
from swaplab.sim.sleep import (
    DISCARDED,
    GOING_TO_SLEEP,
    KV_CACHE,
    PARTS,
    SLEEPING,
    WEIGHTS,
    SleepState,
    fault_changes,
    memory_tags,
    sleep_level,
    wake_tags,
)

CHAT = "/v1/chat/completions"
CHAT_BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


# -- the rules, without processes ------------------------------------------------------

def sleep(level: int, parts: frozenset[str] = PARTS):
    return lambda state: state.fall_asleep(level, parts)


def wake(parts: frozenset[str] = PARTS):
    return lambda state: state.wake(parts)


def reload(state: SleepState) -> None:
    state.reload_weights()


@pytest.mark.parametrize(
    ("steps", "refusal", "level"),
    [
        ([], None, None),
        ([sleep(1)], SLEEPING, 1),
        ([sleep(1), wake()], None, None),
        ([sleep(2)], SLEEPING, 2),
        ([sleep(2), wake()], DISCARDED, None),
        ([sleep(2), wake(), reload], None, None),
        # Half awake is still asleep, and keeps the level of the sleep.
        ([sleep(2), wake(frozenset({KV_CACHE}))], SLEEPING, 2),
        ([sleep(1), wake(frozenset({WEIGHTS}))], SLEEPING, 1),
        ([sleep(1, frozenset({KV_CACHE})), wake(frozenset({KV_CACHE}))], None, None),
        # A level-1 sleep keeps garbage weights garbage: only a reload makes them valid.
        ([sleep(2), wake(), sleep(1), wake()], DISCARDED, None),
        ([sleep(2), wake(), reload, sleep(1), wake()], None, None),
    ],
)
def test_sleep_state_table(steps, refusal, level):
    state = SleepState()
    for step in steps:
        step(state)
    assert (state.refusal(), state.level) == (refusal, level)


def test_reloading_asleep_weights_is_refused_and_draining_refuses_generation():
    state = SleepState()
    state.fall_asleep(2, PARTS)
    with pytest.raises(BadRequest, match="wake them"):
        state.reload_weights()
    assert state.weights_discarded

    draining = SleepState(draining=True)
    assert draining.refusal() == GOING_TO_SLEEP
    draining.fall_asleep(1, PARTS)
    assert (draining.draining, draining.refusal()) == (False, SLEEPING)


@pytest.mark.parametrize(
    ("read", "value", "expected"),
    [
        (sleep_level, None, 1),
        (sleep_level, "2", 2),
        (sleep_level, "3", BadRequest),
        (sleep_level, "one", BadRequest),
        (wake_tags, [], PARTS),
        (wake_tags, [WEIGHTS], frozenset({WEIGHTS})),
        (wake_tags, [WEIGHTS, KV_CACHE], PARTS),
        (wake_tags, ["cuda_graph"], BadRequest),
        (memory_tags, {}, PARTS),
        (memory_tags, {"tags": None}, PARTS),
        (memory_tags, {"tags": [KV_CACHE]}, frozenset({KV_CACHE})),
        (memory_tags, {"tags": []}, BadRequest),
        (memory_tags, {"tags": "weights"}, BadRequest),
        (memory_tags, [], BadRequest),
        (fault_changes, {"wake": "hang"}, {"wake": "hang"}),
        (fault_changes, {"sleep": "boom"}, BadRequest),
        (fault_changes, {"nap": "error"}, BadRequest),
    ],
)
def test_requests_are_read_or_refused(read, value, expected):
    if expected is BadRequest:
        with pytest.raises(BadRequest):
            read(value)
    else:
        assert read(value) == expected


# -- real processes ---------------------------------------------------------------------

@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as client:
        yield client


async def call(session: aiohttp.ClientSession, method: str, url: str, **kwargs) -> tuple[int, Any]:
    """One request; its status and its JSON body (None when empty or not JSON)."""
    async with session.request(method, url, **kwargs) as response:
        text = await response.text()
        try:
            return response.status, await response.json(content_type=None) if text else None
        except ValueError:
            return response.status, None


async def is_sleeping(session, sim: Sim) -> bool:
    status, body = await call(session, "GET", f"{sim.url}/is_sleeping")
    assert status == 200
    return body["is_sleeping"]


async def stats(session, sim: Sim) -> dict:
    return (await call(session, "GET", f"{sim.url}/sim/stats"))[1]


async def generation_refusal(session, sim: Sim) -> str | None:
    """None when a chat request is served, else the message of its 503 (the other routes are checked alike)."""
    status, body = await call(session, "POST", sim.url + CHAT, json=CHAT_BODY)
    if status == 200:
        return None
    assert status == 503, body
    assert body["error"]["type"] == "unavailable_error"
    return body["error"]["message"]


async def test_vllm_level_1_sleep_refuses_generation_until_woken(start_sim, session):
    sim = start_sim("--engine", "vllm")
    assert await generation_refusal(session, sim) is None
    assert await call(session, "POST", f"{sim.url}/sleep") == (200, {})
    assert await is_sleeping(session, sim)

    assert await generation_refusal(session, sim) == SLEEPING
    status, body = await call(session, "POST", f"{sim.url}/v1/completions", json={"prompt": "hi"})
    assert (status, body["error"]["message"]) == (503, SLEEPING)
    messages = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    status, body = await call(session, "POST", f"{sim.url}/v1/messages", json=messages)
    assert (status, body["type"], body["error"]["message"]) == (503, "error", SLEEPING)
    # Asleep is not down: vLLM's /health and the rest of its API keep answering.
    assert await call(session, "GET", f"{sim.url}/health") == (200, {"status": "ok"})
    assert (await call(session, "GET", f"{sim.url}/v1/models"))[0] == 200
    assert await call(session, "POST", f"{sim.url}/reset_prefix_cache") == (200, None)
    assert await stats(session, sim) == {
        "requests": 1, "active": 0, "completed": 1, "cancelled": 0,
        "sleeps": 1, "wakes": 0, "asleep": True, "sleep_level": 1, "sleeps_while_busy": 0,
    }

    assert await call(session, "POST", f"{sim.url}/wake_up") == (200, {})
    assert not await is_sleeping(session, sim)
    assert await generation_refusal(session, sim) is None
    assert await stats(session, sim) == {
        "requests": 2, "active": 0, "completed": 2, "cancelled": 0,
        "sleeps": 1, "wakes": 1, "asleep": False, "sleep_level": None, "sleeps_while_busy": 0,
    }


async def test_vllm_level_2_weights_need_reload_weights_after_the_wake(start_sim, session):
    sim = start_sim("--engine", "vllm")
    assert (await call(session, "POST", f"{sim.url}/sleep?level=3"))[0] == 400
    assert await call(session, "POST", f"{sim.url}/sleep?level=2") == (200, {})
    assert (await stats(session, sim))["sleep_level"] == 2
    status, body = await call(session, "POST", f"{sim.url}/collective_rpc", json={"method": "reload_weights"})
    assert status == 400 and "wake them" in body["error"]["message"]

    assert await call(session, "POST", f"{sim.url}/wake_up") == (200, {})
    assert not await is_sleeping(session, sim)
    assert await generation_refusal(session, sim) == DISCARDED
    status, body = await call(session, "POST", f"{sim.url}/collective_rpc", json={"method": "save_sharded_state"})
    assert status == 400 and "reload_weights" in body["error"]["message"]
    assert await generation_refusal(session, sim) == DISCARDED

    rpc = {"method": "reload_weights", "args": [], "kwargs": {}}
    assert await call(session, "POST", f"{sim.url}/collective_rpc", json=rpc) == (200, {"results": [None]})
    assert await generation_refusal(session, sim) is None


async def test_vllm_wakes_weights_then_kv_cache(start_sim, session):
    sim = start_sim("--engine", "vllm")
    assert await call(session, "POST", f"{sim.url}/sleep?level=1") == (200, {})
    assert (await call(session, "POST", f"{sim.url}/wake_up?tags=cuda_graph"))[0] == 400
    assert await call(session, "POST", f"{sim.url}/wake_up?tags=weights") == (200, {})
    assert await is_sleeping(session, sim)
    assert await generation_refusal(session, sim) == SLEEPING
    assert (await stats(session, sim))["asleep"] is True

    assert await call(session, "POST", f"{sim.url}/wake_up?tags=kv_cache") == (200, {})
    assert not await is_sleeping(session, sim)
    assert await generation_refusal(session, sim) is None
    assert (await stats(session, sim))["wakes"] == 2


async def test_sleep_refuses_at_once_and_answers_after_its_delay(start_sim, session):
    sim = start_sim("--engine", "vllm", "--sleep-seconds", "600")
    sleeping = asyncio.ensure_future(call(session, "POST", f"{sim.url}/sleep"))
    await eventually(lambda: is_sleeping(session, sim), 30, "is_sleeping to say true")
    assert await generation_refusal(session, sim) == SLEEPING
    assert not sleeping.done()
    assert (await stats(session, sim))["sleeps"] == 0  # counted when it answers
    sleeping.cancel()


async def test_a_weights_wake_takes_its_delay_and_a_kv_cache_wake_does_not(start_sim, session):
    sim = start_sim("--engine", "vllm", "--wake-seconds", "600")
    assert await call(session, "POST", f"{sim.url}/sleep") == (200, {})
    # 30 s only bounds the failure: the delay it must not take is 600 s.
    kv_cache_wake = await call(
        session, "POST", f"{sim.url}/wake_up?tags=kv_cache", timeout=aiohttp.ClientTimeout(total=30)
    )
    assert kv_cache_wake == (200, {})
    assert (await stats(session, sim))["wakes"] == 1

    waking = asyncio.ensure_future(call(session, "POST", f"{sim.url}/wake_up?tags=weights"))
    await eventually(lambda: "sim: waking: restoring weights\n" in sim.output(), 30, "the sim to start waking")
    # Still asleep while the weights come back: nothing is served, and the call has not answered.
    assert await is_sleeping(session, sim)
    assert await generation_refusal(session, sim) == SLEEPING
    assert not waking.done()
    waking.cancel()


async def test_sglang_releases_and_resumes_memory(start_sim, session):
    sim = start_sim("--engine", "sglang")
    for path in ("/sleep", "/wake_up", "/is_sleeping", "/collective_rpc"):
        assert (await call(session, "POST" if path != "/is_sleeping" else "GET", sim.url + path))[0] == 404
    release, resume = f"{sim.url}/release_memory_occupation", f"{sim.url}/resume_memory_occupation"
    assert (await call(session, "POST", release, json={"tags": ["cuda_graph"]}))[0] == 400
    assert (await call(session, "POST", release, data="not json"))[0] == 400

    status, body = await call(session, "POST", release, json={})
    assert (status, body["success"]) == (200, True)
    assert await generation_refusal(session, sim) == SLEEPING
    assert (await stats(session, sim))["sleep_level"] == 1

    assert (await call(session, "POST", resume, json={"tags": ["weights"]}))[0] == 200
    assert await generation_refusal(session, sim) == SLEEPING
    status, body = await call(session, "POST", resume, json={"tags": ["kv_cache"]})
    assert (status, body["success"]) == (200, True)
    # The weights came back from the host RAM backup: valid, no reload to ask for.
    assert await generation_refusal(session, sim) is None

    # Only the KV cache released: still asleep for generation.
    assert (await call(session, "POST", release, json={"tags": ["kv_cache"]}))[0] == 200
    assert await generation_refusal(session, sim) == SLEEPING
    assert await call(session, "POST", f"{sim.url}/sim/faults", json={"wake": "error"}) == (
        200, {"sleep": "none", "wake": "error"},
    )
    assert (await call(session, "POST", resume, json={}))[0] == 500
    assert await generation_refusal(session, sim) == SLEEPING
    stats_now = await stats(session, sim)
    assert (stats_now["sleeps"], stats_now["wakes"], stats_now["asleep"]) == (2, 2, True)


async def test_generic_engine_has_no_sleep_api(start_sim, session):
    sim = start_sim()
    for method, path in [
        ("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"), ("POST", "/collective_rpc"),
        ("POST", "/release_memory_occupation"), ("POST", "/resume_memory_occupation"), ("GET", "/sim/faults"),
    ]:
        assert (await call(session, method, sim.url + path))[0] == 404, path
    assert await stats(session, sim) == {"requests": 0, "active": 0, "completed": 0, "cancelled": 0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sleep-seconds", "1"], "--sleep-seconds needs --engine vllm or --engine sglang"),
        (["--wake-seconds", "1", "--sleep-fault", "hang"], "--wake-seconds, --sleep-fault need --engine vllm"),
        (["--engine", "vllm", "--wake-seconds", "-1"], "--wake-seconds must not be negative"),
        (["--engine", "tgi"], "--engine must be one of generic, vllm, sglang"),
        (["--engine", "sglang", "--sleep-fault", "slow"], "--sleep-fault must be one of none, error, hang, crash"),
    ],
)
def test_bad_sleep_options_are_user_errors(args, message):
    done = run_swaplab("sim", "--port", "0", "--model", "m", *args, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


async def sleep_then(session, sim: Sim, operation: str, **kwargs) -> tuple[int, Any]:
    """The operation's call; a wake is preceded by a sleep so it has something to wake."""
    if operation == "wake":
        assert await call(session, "POST", f"{sim.url}/sleep") == (200, {})
        return await call(session, "POST", f"{sim.url}/wake_up", **kwargs)
    return await call(session, "POST", f"{sim.url}/sleep", **kwargs)


@pytest.mark.parametrize("operation", ["sleep", "wake"])
async def test_an_error_fault_answers_500_and_changes_nothing(start_sim, session, operation):
    sim = start_sim("--engine", "vllm", f"--{operation}-fault", "error")
    before = await is_sleeping(session, sim) if operation == "sleep" else True
    status, body = await sleep_then(session, sim, operation)
    assert status == 500
    assert body["error"]["code"] == 500 and operation in body["error"]["message"]
    assert await is_sleeping(session, sim) == before
    counts = await stats(session, sim)
    assert (counts["sleeps"], counts["wakes"]) == ((0, 0) if operation == "sleep" else (1, 0))


@pytest.mark.parametrize("operation", ["sleep", "wake"])
async def test_a_hang_fault_never_answers_and_the_sim_serves_on(start_sim, session, operation):
    sim = start_sim("--engine", "vllm", f"--{operation}-fault", "hang")
    with pytest.raises(asyncio.TimeoutError):
        await sleep_then(session, sim, operation, timeout=aiohttp.ClientTimeout(total=1))
    assert f"sim: {operation} call: injecting fault 'hang'" in sim.output()
    counts = await stats(session, sim)
    assert (counts["sleeps"], counts["wakes"]) == ((0, 0) if operation == "sleep" else (1, 0))
    # The hung call held nothing: with the fault lifted the same call goes through.
    assert await call(session, "POST", f"{sim.url}/sim/faults", json={operation: "none"}) == (
        200, {"sleep": "none", "wake": "none"},
    )
    path = "/sleep" if operation == "sleep" else "/wake_up"
    assert await call(session, "POST", sim.url + path) == (200, {})


@pytest.mark.parametrize("operation", ["sleep", "wake"])
async def test_a_crash_fault_exits_1(start_sim, session, operation):
    sim = start_sim("--engine", "vllm", f"--{operation}-fault", "crash")
    with pytest.raises(aiohttp.ClientError):
        await sleep_then(session, sim, operation)
    assert sim.wait(30) == 1


async def test_faults_change_at_runtime(start_sim, session):
    sim = start_sim("--engine", "vllm", "--wake-fault", "hang")
    faults = f"{sim.url}/sim/faults"
    assert await call(session, "GET", faults) == (200, {"sleep": "none", "wake": "hang"})
    assert await call(session, "POST", faults, json={"sleep": "error"}) == (200, {"sleep": "error", "wake": "hang"})
    for bad in ({"sleep": "boom"}, {"nap": "error"}, ["error"]):
        assert (await call(session, "POST", faults, json=bad))[0] == 400
    assert await call(session, "GET", faults) == (200, {"sleep": "error", "wake": "hang"})
    assert (await call(session, "POST", f"{sim.url}/sleep"))[0] == 500

    assert await call(session, "POST", faults, json={"sleep": "none", "wake": "error"}) == (
        200, {"sleep": "none", "wake": "error"},
    )
    assert await call(session, "POST", f"{sim.url}/sleep") == (200, {})
    assert (await call(session, "POST", f"{sim.url}/wake_up"))[0] == 500
    assert await is_sleeping(session, sim)


async def stats_when(session, sim: Sim, **expected: Any) -> dict | None:
    """The sim's stats once they hold `expected`, else None (for `eventually`)."""
    counts = await stats(session, sim)
    return counts if all(counts[name] == value for name, value in expected.items()) else None


async def slow_stream(session, sim: Sim) -> aiohttp.ClientResponse:
    """A stream in flight: six tokens at 2 a second (start the sim with `--tokens-per-second 2`)
    run 2.5 s after the first, ample time for a sleep call to arrive while it goes on."""
    stream = await session.post(sim.url + CHAT, json={**CHAT_BODY, "max_tokens": 6, "stream": True})
    while b"tok0" not in await stream.content.readline():
        pass
    return stream


async def test_a_sleep_during_a_stream_waits_for_it_and_is_counted(start_sim, session):
    sim = start_sim("--engine", "vllm", "--tokens-per-second", "2")
    stream = await slow_stream(session, sim)
    sleeping = asyncio.ensure_future(call(session, "POST", f"{sim.url}/sleep"))
    await eventually(lambda: stats_when(session, sim, sleeps_while_busy=1), 30, "the sleep to find the stream")
    # Waiting for the stream: not asleep yet, new requests refused, the stream still going.
    assert not await is_sleeping(session, sim)
    assert await generation_refusal(session, sim) == GOING_TO_SLEEP
    assert not sleeping.done()

    async with stream:
        assert (await stream.read()).rstrip().endswith(b"data: [DONE]")
    assert await sleeping == (200, {})
    assert await is_sleeping(session, sim)
    counts = await stats(session, sim)
    assert (counts["completed"], counts["cancelled"], counts["requests"]) == (1, 0, 1)
    assert (counts["sleeps"], counts["sleeps_while_busy"]) == (1, 1)


async def test_a_sleep_whose_client_left_still_happens(start_sim, session):
    sim = start_sim("--engine", "sglang", "--tokens-per-second", "2")
    stream = await slow_stream(session, sim)
    sleeping = asyncio.ensure_future(call(session, "POST", f"{sim.url}/release_memory_occupation", json={}))
    await eventually(lambda: stats_when(session, sim, sleeps_while_busy=1), 30, "the sleep to find the stream")
    sleeping.cancel()  # the caller gives up; the engine goes on
    await eventually(lambda: "sim: sleep call: the client left; the sleep goes on\n" in sim.output(), 30,
                     "the sim to see the sleep's client leave")
    async with stream:
        assert (await stream.read()).rstrip().endswith(b"data: [DONE]")
    counts = await eventually(lambda: stats_when(session, sim, sleeps=1), 30, "the sleep to be done")
    assert counts["asleep"] is True and counts["completed"] == 1
    assert await generation_refusal(session, sim) == SLEEPING
