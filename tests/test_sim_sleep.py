"""`swaplab sim --engine vllm|sglang|tabby`: each engine's way to sleep as its release has it (the
contracts in swaplab.engines), its delays and faults, spoken to over real HTTP on loopback; and
the readers of the calls' parameters as a table."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import yaml
from procs import Sim, eventually, run_swaplab

from swaplab.sim.request import BadRequest
from swaplab.sim.sglang import sglang_tags
from swaplab.sim.sleep import GARBAGE, fault_changes
from swaplab.sim.vllm import vllm_sleep_query, vllm_wake_tags

CHAT = "/v1/chat/completions"
CHAT_BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}
ALL_VLLM = frozenset({"weights", "kv_cache", "scheduling"})
ALL_SGLANG = frozenset({"weights", "kv_cache", "cuda_graph"})


@pytest.mark.parametrize(
    ("read", "value", "expected"),
    [
        (lambda v: vllm_sleep_query(*v), (None, None), (1, "abort")),  # vllm/entrypoints/serve/dev/sleep/api_router.py:29-31
        (lambda v: vllm_sleep_query(*v), ("2", "wait"), (2, "wait")),
        (lambda v: vllm_sleep_query(*v), ("0", "keep"), (0, "keep")),
        (lambda v: vllm_sleep_query(*v), ("3", None), BadRequest),
        (lambda v: vllm_sleep_query(*v), ("1", "drain"), BadRequest),
        (vllm_wake_tags, [], ALL_VLLM),
        (vllm_wake_tags, ["weights"], frozenset({"weights"})),
        (vllm_wake_tags, ["cuda_graph"], BadRequest),
        (sglang_tags, {}, ALL_SGLANG),
        (sglang_tags, {"tags": None}, ALL_SGLANG),
        (sglang_tags, {"tags": []}, ALL_SGLANG),  # null or [] = all three (sglang/srt/constants.py:2-10)
        (sglang_tags, {"tags": ["cuda_graph"]}, frozenset({"cuda_graph"})),
        (sglang_tags, {"tags": ["lora"]}, BadRequest),
        (sglang_tags, [], BadRequest),
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


async def stats(session, sim: Sim) -> dict:
    return (await call(session, "GET", f"{sim.url}/sim/stats"))[1]


async def stats_when(session, sim: Sim, **expected: Any) -> dict | None:
    """The sim's stats once they hold `expected`, else None (for `eventually`)."""
    counts = await stats(session, sim)
    return counts if all(counts[name] == value for name, value in expected.items()) else None


async def call_status(session, url: str, status: int) -> bool:
    return (await call(session, "GET", url))[0] == status


async def chat_text(session, sim: Sim, **headers: str) -> str:
    status, body = await call(session, "POST", sim.url + CHAT, json=CHAT_BODY, headers=headers)
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


async def slow_stream(session, sim: Sim, **headers: str) -> aiohttp.ClientResponse:
    """A stream in flight: six tokens at 2 a second (start the sim with `--tokens-per-second 2`)
    run 2.5 s after the first, ample time for a sleep call to arrive while it goes on."""
    stream = await session.post(sim.url + CHAT, json={**CHAT_BODY, "max_tokens": 6, "stream": True}, headers=headers)
    while b"tok0" not in await stream.content.readline():
        pass
    return stream


def finish_reason(stream_text: bytes) -> str:
    reasons = [line for line in stream_text.decode().splitlines() if '"finish_reason":"' in line]
    return reasons[-1].split('"finish_reason":"')[1].split('"')[0]


# -- vLLM ------------------------------------------------------------------------------

async def test_vllm_serves_its_sleep_calls_only_in_dev_mode(start_sim, session):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode")
    for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
        assert (await call(session, method, sim.url + path))[0] == 404, path  # vllm/.../api_server/routers.py:46-49


async def test_vllm_asleep_queues_requests_until_the_wake_and_says_what_it_freed(start_sim, session):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", "--memory-gib", "14.82", env=DEV_MODE)
    assert await call(session, "POST", f"{sim.url}/sleep") == (200, {"status": "sleeping", "level": 1})
    assert await call(session, "GET", f"{sim.url}/is_sleeping") == (200, {"is_sleeping": True})
    assert "Sleep mode freed 14.82 GiB memory, 0.0 GiB memory is still in use." in sim.output()
    assert (await stats(session, sim))["gpu_gib"] == 0
    # Asleep is not down: /health answers, and a request is taken and held, not refused.
    assert await call(session, "GET", f"{sim.url}/health") == (200, {"status": "ok"})
    waiting = asyncio.ensure_future(chat_text(session, sim))
    await eventually(lambda: call_status(session, f"{sim.url}/sim/last-request", 200), 30, "the request to arrive")
    assert not waiting.done()
    assert (await stats(session, sim))["requests"] == 0  # held before it is counted
    assert await call(session, "POST", f"{sim.url}/wake_up") == (200, {"status": "awake", "tags": None})
    assert (await waiting).startswith(" tok0")
    counts = await stats(session, sim)
    assert (counts["sleeps"], counts["wakes"], counts["asleep"], counts["gpu_gib"]) == (1, 1, False, 14.82)


async def test_vllm_without_sleep_mode_answers_the_sleep_and_frees_nothing(start_sim, session):
    sim = start_sim("--engine", "vllm", "--memory-gib", "3", env=DEV_MODE)
    assert await call(session, "POST", f"{sim.url}/sleep?level=1") == (200, {"status": "sleeping", "level": 1})
    assert "Sleep mode freed 0.0 GiB memory, 3.0 GiB memory is still in use." in sim.output()
    counts = await stats(session, sim)
    assert (counts["asleep"], counts["gpu_gib"]) == (True, 3)


@pytest.mark.parametrize(("mode", "reason"), [(None, "abort"), ("abort", "abort"), ("wait", "length"), ("keep", "length")])
async def test_vllm_sleep_modes_end_wait_for_or_freeze_the_requests_in_flight(start_sim, session, mode, reason):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", "--tokens-per-second", "2",
                    "--default-max-tokens", "6", env=DEV_MODE)
    stream = await slow_stream(session, sim)
    query = f"?mode={mode}" if mode else ""
    sleeping = asyncio.ensure_future(call(session, "POST", f"{sim.url}/sleep{query}"))
    if mode == "keep":
        # Frozen where it is: the sleep answers while the stream waits for the wake, then it goes on.
        assert (await sleeping)[0] == 200
        assert (await stats(session, sim))["active"] == 1
        assert await call(session, "POST", f"{sim.url}/wake_up") == (200, {"status": "awake", "tags": None})
    async with stream:
        text = await stream.read()
    assert finish_reason(text) == reason
    assert (await sleeping)[0] == 200
    assert (await stats(session, sim))["sleeps_while_busy"] == 1


async def test_vllm_level_2_wakes_with_garbage_until_reload_weights(start_sim, session):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", env=DEV_MODE)
    assert await call(session, "POST", f"{sim.url}/sleep?level=2") == (200, {"status": "sleeping", "level": 2})
    status, body = await call(session, "POST", f"{sim.url}/collective_rpc", json={"method": "reload_weights"})
    assert status == 400 and "wake them" in body["error"]["message"]
    assert await call(session, "POST", f"{sim.url}/wake_up?tags=weights") == (
        200, {"status": "sleeping", "tags": ["weights"]})
    assert await call(session, "POST", f"{sim.url}/collective_rpc", json={"method": "reload_weights"}) == (
        200, {"results": [None]})
    assert await call(session, "POST", f"{sim.url}/wake_up?tags=kv_cache&tags=scheduling") == (
        200, {"status": "awake", "tags": ["kv_cache", "scheduling"]})
    assert (await chat_text(session, sim)).startswith(" tok0")

    assert (await call(session, "POST", f"{sim.url}/sleep?level=2"))[0] == 200
    assert (await call(session, "POST", f"{sim.url}/wake_up"))[0] == 200
    assert GARBAGE in await chat_text(session, sim)  # woken without reload_weights: the weights were discarded


async def test_vllm_wake_while_awake_is_a_warning_not_a_fault(start_sim, session):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", env=DEV_MODE)
    assert await call(session, "POST", f"{sim.url}/wake_up") == (200, {"status": "awake", "tags": None})
    assert "Executor is not sleeping." in sim.output()  # vllm/v1/executor/abstract.py:450-452


# -- SGLang ----------------------------------------------------------------------------

async def test_sglang_release_with_a_busy_scheduler_kills_it(start_sim, session):
    sim = start_sim("--engine", "sglang", "--enable-memory-saver", "--tokens-per-second", "2")
    await slow_stream(session, sim)
    with pytest.raises(aiohttp.ClientError):
        await call(session, "POST", f"{sim.url}/release_memory_occupation", json={})
    assert sim.wait(30) == 1
    assert "release_memory_occupation should be called only when server is idle." in sim.output()


async def test_sglang_paused_with_retract_survives_the_release_and_goes_on_after(start_sim, session):
    sim = start_sim("--engine", "sglang", "--enable-memory-saver", "--enable-weights-cpu-backup",
                    "--tokens-per-second", "2", "--default-max-tokens", "6")
    stream = await slow_stream(session, sim)
    assert await call(session, "POST", f"{sim.url}/pause_generation", json={"mode": "retract"}) == (200, None)
    assert await call(session, "POST", f"{sim.url}/release_memory_occupation", json={}) == (200, None)
    assert "Cache flushed successfully!" in sim.output()
    assert (await stats(session, sim))["gpu_gib"] == 0
    assert await call(session, "POST", f"{sim.url}/resume_memory_occupation", json={}) == (200, None)
    assert await call(session, "POST", f"{sim.url}/continue_generation", json={}) == (200, None)
    async with stream:
        assert finish_reason(await stream.read()) == "length"  # retracted, then run to its end
    assert (await chat_text(session, sim)).startswith(" tok0")  # the weights came back from host RAM


async def test_sglang_resume_of_what_was_not_released_kills_it(start_sim, session):
    sim = start_sim("--engine", "sglang", "--enable-memory-saver")
    assert await call(session, "POST", f"{sim.url}/release_memory_occupation", json={"tags": ["kv_cache"]}) == (
        200, None)
    with pytest.raises(aiohttp.ClientError):
        await call(session, "POST", f"{sim.url}/resume_memory_occupation", json={})
    assert sim.wait(30) == 1
    assert "KeyError" in sim.output()


async def test_sglang_without_its_flags_frees_nothing_or_wakes_with_garbage(start_sim, session):
    keeps = start_sim("--engine", "sglang", "--memory-gib", "5")
    assert (await call(session, "POST", f"{keeps.url}/release_memory_occupation", json={}))[0] == 200
    assert (await stats(session, keeps))["gpu_gib"] == 5  # no memory saver: pause() is a no-op

    garbage = start_sim("--engine", "sglang", "--enable-memory-saver")
    assert (await call(session, "POST", f"{garbage.url}/release_memory_occupation", json={}))[0] == 200
    assert (await call(session, "POST", f"{garbage.url}/resume_memory_occupation", json={}))[0] == 200
    assert GARBAGE in await chat_text(session, garbage)  # no CPU backup: the memory came back, not the weights
    assert (await call(session, "GET", f"{garbage.url}/health"))[0] == 200


# -- TabbyAPI --------------------------------------------------------------------------

async def test_tabby_unloads_and_loads_with_its_admin_key(start_sim, session):
    sim = start_sim("--engine", "tabby", "--sleep-seconds", "0", model="Qwen3-8B-exl3")
    tokens = yaml.safe_load((sim.folder / "api_tokens.yml").read_text())  # written at start, as TabbyAPI does
    admin = {"Authorization": f"Bearer {tokens['admin_key']}"}
    api = {"x-api-key": tokens["api_key"]}
    assert (await chat_text(session, sim, **api)).startswith(" tok0")
    assert await call(session, "POST", f"{sim.url}/v1/model/unload", headers=api) == (
        401, {"detail": "Please provide an admin key"})
    assert await call(session, "POST", f"{sim.url}/v1/model/unload", headers=admin) == (200, None)
    assert await call(session, "POST", sim.url + CHAT, json=CHAT_BODY, headers=api) == (
        503, {"detail": "No models are currently loaded."})
    assert (await call(session, "POST", sim.url + CHAT, json={**CHAT_BODY, "model": "x"}, headers=api))[0] == 500
    async with session.post(f"{sim.url}/v1/model/load", json={"model_name": "Qwen3-8B-exl3"}, headers=admin) as load:
        events = [line for line in (await load.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == 'data: {"model_type": "model", "module": 4, "modules": 4, "status": "finished"}'
    assert (await chat_text(session, sim, **api)).startswith(" tok0")
    assert "Model unloaded." in sim.output() and "Model successfully loaded." in sim.output()


# -- every engine -------------------------------------------------------------------------

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
        (["--sleep-seconds", "1"], "--sleep-seconds needs --engine vllm, sglang or tabby"),
        (["--wake-seconds", "1", "--sleep-fault", "hang"], "--wake-seconds, --sleep-fault need --engine vllm"),
        (["--engine", "llamacpp", "--sleep-seconds", "1"], "the llamacpp engine has no sleep API"),
        (["--engine", "vllm", "--wake-seconds", "-1"], "--wake-seconds must not be negative"),
        (["--engine", "tgi"], "--engine must be one of generic, vllm, sglang, llamacpp, tabby"),
        (["--engine", "sglang", "--sleep-fault", "slow"], "--sleep-fault must be one of none, error, hang, crash"),
        (["--engine", "sglang", "--enable-sleep-mode"], "SGLang 0.5.23 has no --enable-sleep-mode"),
        (["--engine", "tabby", "--api-key", "k"], "TabbyAPI"),
        (["--enable-memory-saver"], "--enable-memory-saver is an engine's flag"),
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
        assert (await call(session, "POST", f"{sim.url}/sleep"))[0] == 200
        return await call(session, "POST", f"{sim.url}/wake_up", **kwargs)
    return await call(session, "POST", f"{sim.url}/sleep", **kwargs)


@pytest.mark.parametrize("operation", ["sleep", "wake"])
async def test_an_error_fault_answers_500_and_changes_nothing(start_sim, session, operation):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", f"--{operation}-fault", "error", env=DEV_MODE)
    status, body = await sleep_then(session, sim, operation)
    assert status == 500
    assert body["error"]["code"] == 500 and operation in body["error"]["message"]
    counts = await stats(session, sim)
    assert counts["asleep"] == (operation == "wake")
    assert (counts["sleeps"], counts["wakes"]) == ((0, 0) if operation == "sleep" else (1, 0))


@pytest.mark.parametrize("operation", ["sleep", "wake"])
async def test_a_hang_fault_never_answers_and_the_sim_serves_on(start_sim, session, operation):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", f"--{operation}-fault", "hang", env=DEV_MODE)
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
    assert (await call(session, "POST", sim.url + path))[0] == 200


@pytest.mark.parametrize("operation", ["sleep", "wake"])
async def test_a_crash_fault_exits_1(start_sim, session, operation):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", f"--{operation}-fault", "crash", env=DEV_MODE)
    with pytest.raises(aiohttp.ClientError):
        await sleep_then(session, sim, operation)
    assert sim.wait(30) == 1


async def test_faults_change_at_runtime(start_sim, session):
    sim = start_sim("--engine", "sglang", "--enable-memory-saver", "--wake-fault", "hang")
    faults = f"{sim.url}/sim/faults"
    release, resume = f"{sim.url}/release_memory_occupation", f"{sim.url}/resume_memory_occupation"
    assert await call(session, "GET", faults) == (200, {"sleep": "none", "wake": "hang"})
    assert await call(session, "POST", faults, json={"sleep": "error"}) == (200, {"sleep": "error", "wake": "hang"})
    for bad in ({"sleep": "boom"}, {"nap": "error"}, ["error"]):
        assert (await call(session, "POST", faults, json=bad))[0] == 400
    assert (await call(session, "POST", release, json={}))[0] == 500

    assert await call(session, "POST", faults, json={"sleep": "none", "wake": "error"}) == (
        200, {"sleep": "none", "wake": "error"},
    )
    assert (await call(session, "POST", release, json={}))[0] == 200
    assert (await call(session, "POST", resume, json={}))[0] == 500
    assert (await stats(session, sim))["asleep"] is True


async def test_a_sleep_whose_client_left_still_happens(start_sim, session):
    sim = start_sim("--engine", "vllm", "--enable-sleep-mode", "--tokens-per-second", "2", env=DEV_MODE)
    stream = await slow_stream(session, sim)
    sleeping = asyncio.ensure_future(call(session, "POST", f"{sim.url}/sleep?mode=wait"))
    await eventually(lambda: stats_when(session, sim, sleeps_while_busy=1), 30, "the sleep to find the stream")
    sleeping.cancel()  # the caller gives up; the engine goes on
    await eventually(lambda: "sim: sleep call: the client left; the sleep goes on\n" in sim.output(), 30,
                     "the sim to see the sleep's client leave")
    async with stream:
        assert (await stream.read()).rstrip().endswith(b"data: [DONE]")
    counts = await eventually(lambda: stats_when(session, sim, sleeps=1), 30, "the sleep to be done")
    assert counts["asleep"] is True and counts["completed"] == 1
