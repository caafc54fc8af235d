"""Faults at the timing real clients produce: a real `swaplab serve` in front of real `swaplab sim`s.

A crash followed at once by the client's retry, admission counted once for requests,
`/load` and preload, and streaming clients kept visibly alive through long waits, read
by the official `openai` and `anthropic` SDKs.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import anthropic
import openai
import pytest

from procs import PYTHON, SIM, eventually
from routerclient import chat, running, sim_stats, wait_for_state, wait_for_stats

CRASHING_GROUP = f"""
healthCheckTimeout: 30
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --crash-after-tokens 5
  b:
    cmd: {SIM} --port ${{PORT}} --model b
  c:
    cmd: {SIM} --port ${{PORT}} --model c
groups:
  together:
    swap: false
    exclusive: false
    members: [a, b, c]
"""

INTERNALS = ("TransferEncodingError", "Connect call failed", "ClientPayloadError", "Errno", "<")


async def test_a_request_right_after_a_crash_is_served_by_a_restarted_backend(router_factory):
    router = router_factory(CRASHING_GROUP)
    stream = {"model": "a", "stream": True, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        for _ in range(5):
            pid = (await running(session, router.url)).get("a", {}).get("pid")
            async with session.post(f"{router.url}/v1/chat/completions", json=stream) as response:
                events = [e for e in (await response.read()).decode().split("\n\n") if e.strip()]
            error = json.loads(events[-1].removeprefix("data: "))["error"]["message"]
            assert "exited mid-stream (code 1)" in error, error
            assert not any(word in error for word in INTERNALS), error
            # What an agent client does: retry at once, before anyone could notice the exit.
            status, reply = await chat(session, router.url, "a", max_tokens=3)
            assert status == 200, reply
            assert reply["choices"][0]["message"]["content"] == " tok0 tok1 tok2"
            entry = (await running(session, router.url))["a"]
            assert entry["state"] == "ready" and entry["pid"] != pid


async def test_a_backend_that_stays_down_is_explained_not_a_bare_502(router_factory, tmp_path):
    # The server exits after its first answer; every restart fails (it exits while starting).
    marker = tmp_path / "served-once"
    script = tmp_path / "once.py"
    script.write_text(f"""
import os, sys
from pathlib import Path
marker = Path({str(marker)!r})
if marker.exists():
    sys.exit(3)
marker.write_text("x")
os.execvp(sys.executable, [sys.executable, "-m", "swaplab", "sim", "--port", sys.argv[1], "--model", "a",
                           "--crash-after-tokens", "2"])
""")
    router = router_factory(f"""
healthCheckTimeout: 15
models:
  a:
    cmd: {PYTHON} {script} ${{PORT}}
""")
    async with aiohttp.ClientSession() as session:
        # It crashes at its 2nd token, before any response byte: restarted, it exits at once.
        status, reply = await chat(session, router.url, "a", max_tokens=3)
    message = reply["error"]["message"]
    assert status == 503, reply
    assert "model 'a' crashed (exit 1) and did not come back" in message, message
    assert "exited with code 3 while starting" in message, message
    assert not any(word in message for word in INTERNALS[:3]), message


async def held(session: aiohttp.ClientSession, url: str, model: str) -> int:
    entry = (await running(session, url)).get(model, {})
    return entry.get("in_flight", 0) + entry.get("queued", 0)


async def test_load_counts_against_the_concurrency_limit_like_a_request(router_factory):
    router = router_factory(f"""
healthCheckTimeout: 30
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --load-seconds 3
    concurrencyLimit: 1
""")
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        loading = asyncio.ensure_future(session.post(f"{router.url}/load?model=a"))
        await eventually(lambda: held(session, router.url, "a"), 30, "the /load to be held against a's limit")
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 429, await response.text()
            assert "concurrencyLimit" in (await response.json())["error"]["message"]
        response = await loading
        assert response.status == 200 and await response.json() == {"loaded": "a"}
        response.release()
        status, reply = await chat(session, router.url, "a", max_tokens=1)
        assert status == 200, reply


async def test_preload_counts_against_the_concurrency_limit_like_a_request(router_factory):
    router = router_factory(f"""
healthCheckTimeout: 30
hooks:
  on_startup:
    preload: [a]
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --load-seconds 5
    concurrencyLimit: 1
""")
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        assert await held(session, router.url, "a") == 1  # the preload, queued while a starts
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 429
        await wait_for_state(session, router.url, "a", "ready", timeout=60)
        status, reply = await chat(session, router.url, "a", max_tokens=1)
        assert status == 200, reply


async def test_preload_starts_its_models_one_after_another_as_llama_swap_does(router_factory):
    router = router_factory(f"""
healthCheckTimeout: 30
hooks:
  on_startup:
    preload: [a, b]
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --load-seconds 3
  b:
    cmd: {SIM} --port ${{PORT}} --model b
groups:
  together:
    swap: false
    members: [a, b]
""")
    async with aiohttp.ClientSession() as session:
        await wait_for_state(session, router.url, "a", "starting", timeout=30)
        # b could run beside a, but its turn comes once a is ready.
        assert (await running(session, router.url)).get("b", {}).get("state", "stopped") == "stopped"
        await wait_for_state(session, router.url, "b", "ready", timeout=60)
        assert (await running(session, router.url))["a"]["state"] == "ready"


def heartbeat_config(top: str = "heartbeatInterval: 0.3") -> str:
    return f"""
healthCheckTimeout: 30
{top}
models:
  slow-first-token:
    cmd: {SIM} --port ${{PORT}} --model slow-first-token --ttft-ms 2000
  loading:
    cmd: {SIM} --port ${{PORT}} --model loading --load-seconds 2
  quick:
    cmd: {SIM} --port ${{PORT}} --model quick --ttft-ms 20
    heartbeatInterval: 5
groups:
  all:
    swap: false
    exclusive: false
    members: [slow-first-token, loading, quick]
"""


async def raw_stream(session: aiohttp.ClientSession, url: str, path: str, body: dict) -> tuple[int, str, str]:
    async with session.post(f"{url}{path}", json=body) as response:
        return response.status, response.headers.get("Content-Type", ""), (await response.read()).decode()


async def test_a_slow_first_token_gets_heartbeats_then_the_real_stream(router_factory):
    router = router_factory(heartbeat_config())
    chat_body = {"model": "slow-first-token", "stream": True, "max_tokens": 3,
                 "messages": [{"role": "user", "content": "hi"}]}
    messages_body = {"model": "slow-first-token", "stream": True, "max_tokens": 3,
                     "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        status, _, raw = await raw_stream(session, router.url, "/v1/chat/completions", chat_body)
        assert status == 200
        before_data = raw[: raw.index("data:")]
        assert before_data.count(": keep-alive\n\n") >= 3, raw[:300]  # 2 s at one per 0.3 s
        assert raw.rstrip().endswith("data: [DONE]")

        status, _, raw = await raw_stream(session, router.url, "/v1/messages", messages_body)
        assert status == 200
        assert "event: message_start" in raw, raw[:600]
        before_start = raw[: raw.index("event: message_start")]
        assert before_start.count("event: ping\n") >= 3, raw[:300]
        assert raw.rstrip().endswith('"type":"message_stop"}') or "message_stop" in raw[-200:]

    # The SDKs read them as they read a server's own stream.
    client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="slow-first-token", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == " tok0 tok1 tok2"
    await client.close()

    claude = anthropic.AsyncAnthropic(base_url=router.url, api_key="unused", max_retries=0)
    events = await claude.messages.create(
        model="slow-first-token", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    kinds = [event.type async for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    async with claude.messages.stream(
        model="slow-first-token", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    ) as stream:
        message = await stream.get_final_message()
    assert message.content[0].text == " tok0 tok1 tok2" and message.stop_reason == "max_tokens"
    await claude.close()


async def test_heartbeats_cover_a_model_that_is_still_loading(router_factory):
    router = router_factory(heartbeat_config())
    body = {"model": "loading", "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        status, _, raw = await raw_stream(session, router.url, "/v1/chat/completions", body)
    assert status == 200
    assert raw[: raw.index("data:")].count(": keep-alive") >= 3
    assert raw.rstrip().endswith("data: [DONE]")


async def test_short_waits_and_non_streaming_requests_are_untouched(router_factory):
    router = router_factory(heartbeat_config())
    body = {"model": "quick", "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        status, _, raw = await raw_stream(session, router.url, "/v1/chat/completions", body)
        assert status == 200 and raw.startswith("data: ") and "keep-alive" not in raw
        plain = {**body, "model": "slow-first-token", "stream": False}
        status, content_type, raw = await raw_stream(session, router.url, "/v1/chat/completions", plain)
    assert status == 200 and content_type.startswith("application/json")
    assert json.loads(raw)["choices"][0]["message"]["content"] == " tok0 tok1"


async def test_an_upstream_error_after_heartbeats_arrives_as_an_error_event(router_factory):
    router = router_factory(heartbeat_config())
    # Valid for the router (a model, stream: true), refused by the backend once it has loaded.
    bad_chat = {"model": "loading", "stream": True, "max_tokens": -5, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        status, _, raw = await raw_stream(session, router.url, "/v1/chat/completions", bad_chat)
    assert status == 200 and ": keep-alive" in raw
    error = json.loads(raw.strip().split("\n\n")[-1].removeprefix("data: "))["error"]
    assert "HTTP 400" in error["message"] and error["code"] == 400

    client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    async with aiohttp.ClientSession() as session:
        await session.post(f"{router.url}/unload")
    with pytest.raises(openai.APIError, match="HTTP 400"):
        stream = await client.chat.completions.create(
            model="loading", messages=[{"role": "user", "content": "hi"}], max_tokens=-5, stream=True
        )
        async for _ in stream:
            pass
    await client.close()

    async with aiohttp.ClientSession() as session:
        await session.post(f"{router.url}/unload")
    claude = anthropic.AsyncAnthropic(base_url=router.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.APIError, match="HTTP 400"):
        events = await claude.messages.create(
            model="loading", messages=[], max_tokens=3, stream=True  # no messages: the sim's 400
        )
        async for _ in events:
            pass
    await claude.close()


# A server that is up (its /health answers) but never answers a chat: its response headers never come.
SILENT_SERVER = """
import asyncio, sys
from aiohttp import web

async def health(request):
    return web.json_response({"status": "ok"})

async def never(request):
    await asyncio.Event().wait()

app = web.Application()
app.router.add_get("/health", health)
app.router.add_post("/v1/chat/completions", never)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


@pytest.mark.parametrize("lane", ["on", "off"])
async def test_no_response_header_after_heartbeats_ends_the_stream_with_an_error_event(router_factory, tmp_path, lane):
    # The router's own answer (here `timeouts.responseHeader`'s 504) inside the stream its heartbeats
    # committed: on the lane and on aiohttp's server alike.
    script = tmp_path / "silent.py"
    script.write_text(SILENT_SERVER)
    router = router_factory(f"""
heartbeatInterval: 0.1
models:
  silent:
    cmd: {PYTHON} {script} ${{PORT}}
    timeouts: {{responseHeader: 3}}
""", env={"SWAPLAB_LANE": lane})
    body = {"model": "silent", "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        status, content_type, raw = await raw_stream(session, router.url, "/v1/chat/completions", body)
    assert status == 200 and content_type.startswith("text/event-stream") and raw.startswith(": keep-alive")
    error = json.loads(raw.strip().split("\n\n")[-1].removeprefix("data: "))["error"]
    assert "sent no response header within 3 s" in error["message"] and error["code"] == 504
    async with aiohttp.ClientSession() as session:
        assert (await running(session, router.url))["silent"]["state"] == "ready"
    assert "Traceback" not in router.output() and "Error handling request" not in router.output()


# Crashes under its first chat (the connection resets before any answer); once restarted, takes the
# request sent again and never answers it, noting that it arrived.
CRASH_THEN_SILENT = """
import asyncio, os, sys
from pathlib import Path
from aiohttp import web

crashed, arrived = Path(sys.argv[2]), Path(sys.argv[3])

async def health(request):
    return web.json_response({"status": "ok"})

async def chat(request):
    if not crashed.exists():
        crashed.write_text("once")
        os._exit(3)
    arrived.write_text("again")
    await asyncio.Event().wait()

app = web.Application()
app.router.add_get("/health", health)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def test_a_client_leaving_the_request_sent_again_after_a_restart_gives_back_its_slot(router_factory, tmp_path):
    # The restart trades the request's admission for one on the new server; a client that leaves
    # while the request is on its second way must give that one back, or the model never idles.
    script, crashed, arrived = tmp_path / "crash.py", tmp_path / "crashed", tmp_path / "arrived"
    script.write_text(CRASH_THEN_SILENT)
    router = router_factory(f"""
models:
  fragile:
    cmd: {PYTHON} {script} ${{PORT}} {crashed} {arrived}
""")
    body = {"model": "fragile", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(session.post(f"{router.url}/v1/chat/completions", json=body))
        await eventually(arrived.exists, 60, "the request sent again to the restarted server")
        assert (await running(session, router.url))["fragile"]["in_flight"] == 1
        request.cancel()  # the client leaves
        with pytest.raises(asyncio.CancelledError):
            await request

        async def given_back() -> bool:
            return (await running(session, router.url))["fragile"]["in_flight"] == 0

        await eventually(given_back, 10, "the restarted server's slot given back")
    assert "Traceback" not in router.output()


async def test_a_client_leaving_during_heartbeats_cancels_the_upstream_at_once(router_factory):
    router = router_factory(heartbeat_config().replace("--ttft-ms 2000", "--ttft-ms 30000"))
    body = {"model": "slow-first-token", "stream": True, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/load?model=slow-first-token") as response:
            assert response.status == 200
        proxy = (await running(session, router.url))["slow-first-token"]["proxy"]
        before = await sim_stats(session, proxy)
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert await response.content.readline() == b": keep-alive\n"
        stats = await wait_for_stats(session, proxy, lambda stats: stats["cancelled"] != before["cancelled"], timeout=10)
        assert stats["active"] == 0
