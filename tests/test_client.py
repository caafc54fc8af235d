"""The shared OpenAI client against real servers on loopback: `swaplab sim` with known timing, a router,
and small scripted servers for what the sim can't do (a late role prelude, tool-call deltas, a
dropped keep-alive connection).

Timing tolerances are stated against the sim's configured figures: TTFT is never below
the configured value and at most TTFT_SLACK_MS above it; token gaps within 5%.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from procs import Sim, free_port

from swaplab.client import OpenAIClient, ServerUnreachableError
from swaplab.errors import UnknownModelError

TTFT_SLACK_MS = 25.0  # a 2-core CI machine running the sim and the test together
GAP_TOLERANCE = 0.05


@pytest.fixture
def sim(tmp_path):
    process = Sim(tmp_path, "--ttft-ms", "100", "--tokens-per-second", "50")
    yield process
    process.close()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


async def test_a_stream_records_ttft_gaps_usage_and_the_answer(sim):
    async with OpenAIClient(sim.url) as client:
        result = await client.chat("sim-model", user("one two three"), max_tokens=6)
    assert result.ok, result.error
    assert result.text == " tok0 tok1 tok2 tok3 tok4 tok5"
    assert (result.prompt_tokens, result.completion_tokens) == (3, 6)  # usage, asked for by the client
    assert result.finish_reason == "length"
    assert len(result.token_times) == 6  # the role prelude that rides with tok0 is not a token of its own
    assert 100 <= result.ttft_ms <= 100 + TTFT_SLACK_MS
    # The sim paces against deadlines, so one late token makes the next gap short: each gap
    # lies within a token period of 20 ms, and together they keep the rate.
    assert all(0 < gap < 40 for gap in result.itl_ms)
    assert sum(result.itl_ms) / len(result.itl_ms) == pytest.approx(20, rel=GAP_TOLERANCE)
    assert result.tpot_ms == pytest.approx(20, rel=GAP_TOLERANCE)
    assert result.e2e_ms == pytest.approx(result.ttft_ms + 5 * 20, rel=GAP_TOLERANCE)


async def test_completions_and_non_streaming_answers(sim):
    async with OpenAIClient(sim.url + "/v1/") as client:  # a /v1 suffix is what users often type
        streamed = await client.complete("sim-model", "once upon a time", max_tokens=3)
        whole = await client.chat("sim-model", user("hi"), max_tokens=3, stream=False)
    assert streamed.ok and streamed.text == " tok0 tok1 tok2" and streamed.prompt_tokens == 4
    assert whole.ok and not whole.streamed
    assert whole.text == " tok0 tok1 tok2" and whole.completion_tokens == 3
    assert whole.ttft_ms is None  # one body: no first token to time
    assert whole.e2e_ms == pytest.approx(100 + 2 * 20, abs=TTFT_SLACK_MS)


async def test_http_errors_and_refused_connections_are_recorded_not_raised(sim, tmp_path):
    async with OpenAIClient(sim.url) as client:
        refused = await client.chat("sim-model", [], max_tokens=3)
    assert refused.status == 400
    assert refused.error == "HTTP 400: 'messages' must be a non-empty list"

    crashing = Sim(tmp_path, "--crash-after-tokens", "3")
    try:
        async with OpenAIClient(crashing.url) as client:
            broken = await client.chat("sim-model", user("hi"), max_tokens=5)
            after = await client.chat("sim-model", user("hi"), max_tokens=5)
    finally:
        crashing.close()
    assert broken.status == 200 and len(broken.token_times) == 3
    assert broken.error is not None and broken.attempts == 1  # tokens had arrived: never retried
    # The crashed server is gone: refused, or reset while its socket was still closing.
    assert after.status is None and after.error.startswith(("cannot connect", "[Errno 104]"))


async def test_server_info_tokenize_and_bad_targets(sim):
    async with OpenAIClient(sim.url) as client:
        info = await client.server_info(None)  # the only model
        ids = await client.tokenize("the quick brown fox", model="sim-model")
        with pytest.raises(UnknownModelError) as unknown:
            await client.server_info("nope")
    assert (info.model, info.backend_kind, info.router, info.config_hash) == ("sim-model", "swaplab-sim", False, None)
    assert len(ids) == 4  # the sim's tokenizer: one token per word
    assert "sim-model" in str(unknown.value)
    async with OpenAIClient(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(ServerUnreachableError, match="cannot reach"):
            await client.server_info("anything")


async def test_through_a_router_the_entry_and_the_backend_are_named(router_factory, tmp_path):
    from procs import SIM

    router = router_factory(f"""
models:
  sim-a:
    cmd: {SIM} --port ${{PORT}} --model sim-a
    proxy: http://127.0.0.1:${{PORT}}
    checkEndpoint: /health
    aliases: [alpha]
""")
    async with OpenAIClient(router.url) as client:
        info = await client.server_info("alpha")
        ids = await client.tokenize("one two three", model="alpha")
        _, listing = await client.get_json("/api/models")
        result = await client.chat("alpha", user("hi"), max_tokens=2)
    entry = next(model for model in listing["models"] if model["id"] == "sim-a")
    assert info.router and info.upstream_prefix == "/upstream/sim-a"
    assert (info.model, info.model_id, info.alias) == ("alpha", "sim-a", "alpha")
    assert info.config_hash == entry["config_hash"] and info.config_hash
    assert info.backend_kind == "swaplab-sim"
    assert len(ids) == 3
    assert result.ok and result.completion_tokens == 2


# -- scripted servers: what the sim does not do ---------------------------------------------------


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def event(document: dict) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


async def test_ttft_is_the_first_token_bearing_chunk_and_tool_calls_are_assembled():
    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = lambda **fields: event({"choices": [{"index": 0, "delta": fields, "finish_reason": None}]})
        await response.write(delta(role="assistant", content=None))  # a role-only prelude, long before any token
        await asyncio.sleep(0.1)  # the scenario, not an ordering: the first token comes well after the prelude
        await response.write(delta(reasoning_content="Let me look."))
        await response.write(delta(content="Checking."))
        await response.write(delta(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                                                "function": {"name": "read_file", "arguments": "{\"pa"}}]))
        await response.write(delta(tool_calls=[{"index": 0, "function": {"arguments": "th\": \"a.py\"}"}}]))
        await response.write(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}))
        await response.write(event({"choices": [], "usage": {
            "prompt_tokens": 40, "completion_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 32}, "completion_tokens_details": {"reasoning_tokens": 4},
        }}))
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner, url = await serve(app)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    try:
        async with OpenAIClient(url) as client:
            result = await client.chat("m", user("read a.py"), tools=tools)
    finally:
        await runner.cleanup()
    assert result.ok, result.error
    assert result.ttft_ms >= 100  # not the prelude's arrival
    assert len(result.token_times) == 4  # reasoning, content and two tool-call deltas
    assert (result.reasoning, result.text) == ("Let me look.", "Checking.")
    assert result.tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    ]
    assert (result.cached_tokens, result.reasoning_tokens, result.finish_reason) == (32, 4, "tool_calls")


class DroppingServer:
    """HTTP/1.1 by hand: answers the first request of each connection and keeps it alive; with
    `drop_reused`, a second request on the same connection is read and the connection closed
    unanswered (as llama.cpp's server does with idle keep-alive connections); with `drop_fresh`,
    every request is dropped."""

    BODY = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()

    def __init__(self, *, drop_fresh: bool = False):
        self.drop_fresh = drop_fresh
        self.requests = 0
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                self.requests += 1
                if self.drop_fresh or served:
                    return
                served += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                             b"Content-Length: %d\r\n\r\n%b" % (len(self.BODY), self.BODY))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("drop_fresh", [False, True], ids=["reused-connection-dropped", "fresh-connection-dropped"])
async def test_a_dropped_kept_alive_connection_is_retried_once_on_a_fresh_one(drop_fresh):
    server = DroppingServer(drop_fresh=drop_fresh)
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
    try:
        async with OpenAIClient(url) as client:
            first = await client.chat("m", user("hi"), stream=False)
            second = await client.chat("m", user("hi"), stream=False)  # sent on the kept-alive connection
    finally:
        listening.close()
        await listening.wait_closed()
    if drop_fresh:
        # Nothing was reused, so nothing is retried: a request that may have reached the
        # server is never sent twice.
        assert not first.ok and first.attempts == 1
        assert server.requests == 2
    else:
        assert first.ok and first.attempts == 1
        assert second.ok and second.attempts == 2, second.error
        assert server.requests == 3 and server.connections == 2
