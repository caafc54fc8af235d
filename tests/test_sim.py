"""`swaplab sim` as a real process on loopback, spoken to over real HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import dataclass

import aiohttp
import anthropic
import pytest

from procs import SwaplabProcess, free_port
from swaplab.sim.request import BadRequest, plan_request
from swaplab.sim.tokens import answer_text

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"


@dataclass
class RunningSim:
    process: SwaplabProcess
    url: str
    port: int


@pytest.fixture
def start_sim(tmp_path):
    started: list[SwaplabProcess] = []

    def start(*extra: str, model: str = "sim-model") -> RunningSim:
        port = free_port()
        process = SwaplabProcess(["sim", "--port", str(port), "--model", model, *extra], tmp_path / f"sim-{port}.log")
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        # /sim/stats answers from the moment the port listens, loading or not.
        process.wait_http(f"{url}/sim/stats")
        return RunningSim(process, url, port)

    yield start
    for process in started:
        process.close()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as client:
        yield client


def chat_body(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "say something nice"}], **fields}


def events_of(raw: bytes) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    events = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(block.removeprefix("data: "))
    return events


async def stats_of(session: aiohttp.ClientSession, sim: RunningSim) -> dict:
    async with session.get(f"{sim.url}/sim/stats") as response:
        return await response.json()


async def wait_for_stats(session, sim: RunningSim, predicate, timeout: float = 30.0) -> tuple[dict, float]:
    """Poll /sim/stats until `predicate` holds; returns the stats and when (monotonic) they matched."""
    deadline = time.monotonic() + timeout
    while True:
        stats = await stats_of(session, sim)
        if predicate(stats):
            return stats, time.monotonic()
        assert time.monotonic() < deadline, f"sim stats never matched: {stats}"
        await asyncio.sleep(0.002)  # the poll's pace, not an ordering: the deadline bounds it


async def test_prints_where_it_listens(start_sim):
    sim = start_sim(model="named")
    assert f"sim: model named listening on http://127.0.0.1:{sim.port}\n" in sim.process.output()


async def test_streaming_chat_sends_role_tokens_finish_usage_and_done(start_sim, session):
    sim = start_sim()
    body = chat_body(model="asked-for", stream=True, max_tokens=4, stream_options={"include_usage": True})
    async with session.post(sim.url + CHAT, json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        events = events_of(await response.read())

    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert {chunk["model"] for chunk in chunks} == {"asked-for"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    contents = [chunk["choices"][0]["delta"].get("content") for chunk in chunks[1:-2]]
    assert contents == [" tok0", " tok1", " tok2", " tok3"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


async def test_streaming_without_include_usage_has_no_usage_chunk(start_sim, session):
    sim = start_sim("--default-max-tokens", "2")
    async with session.post(sim.url + CHAT, json=chat_body(stream=True)) as response:
        events = events_of(await response.read())
    chunks = [json.loads(event) for event in events[:-1]]
    assert events[-1] == "[DONE]"
    assert all("usage" not in chunk for chunk in chunks)
    assert [chunk["choices"][0]["delta"].get("content") for chunk in chunks[1:-1]] == [" tok0", " tok1"]
    # No request limit: the answer ended by itself, as a model stopping would.
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[0]["model"] == "sim-model"


async def test_streaming_completions(start_sim, session):
    sim = start_sim()
    body = {"prompt": "once upon a time", "stream": True, "n_predict": 3, "stream_options": {"include_usage": True}}
    async with session.post(sim.url + COMPLETIONS, json=body) as response:
        assert response.status == 200
        events = events_of(await response.read())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    assert [chunk["choices"][0]["text"] for chunk in chunks[:-2]] == [" tok0", " tok1", " tok2"]
    assert chunks[-2]["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


async def test_non_streaming_chat_and_completions(start_sim, session):
    sim = start_sim("--default-max-tokens", "5")
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "two words"}, {"type": "image_url", "image_url": {}}]},
    ]
    async with session.post(sim.url + CHAT, json={"messages": messages, "max_completion_tokens": 3}) as response:
        assert response.status == 200
        reply = await response.json()
    assert reply["object"] == "chat.completion"
    assert reply["model"] == "sim-model"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": " tok0 tok1 tok2"}
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}

    async with session.post(sim.url + COMPLETIONS, json={"model": "m", "prompt": ["a b", "c"]}) as response:
        reply = await response.json()
    assert reply["object"] == "text_completion" and reply["model"] == "m"
    assert reply["choices"][0]["text"] == answer_text(5) == " tok0 tok1 tok2 tok3 tok4"
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}

    stats = await stats_of(session, sim)
    assert stats == {"requests": 2, "active": 0, "completed": 2, "cancelled": 0}


async def test_models_health_and_tokenize(start_sim, session):
    sim = start_sim(model="listed")
    async with session.get(f"{sim.url}/health") as response:
        assert response.status == 200
    async with session.get(f"{sim.url}/v1/models") as response:
        assert [model["id"] for model in (await response.json())["data"]] == ["listed"]
    async with session.post(f"{sim.url}/tokenize", json={"content": "one two  one\nthree"}) as response:
        tokens = (await response.json())["tokens"]
    assert len(tokens) == 4 and tokens[0] == tokens[2] and all(isinstance(token, int) for token in tokens)


async def test_malformed_requests_get_an_openai_error_and_are_not_counted(start_sim, session):
    sim = start_sim()
    for path, body in ((CHAT, b"{not json"), (CHAT, b'{"messages": []}'), (COMPLETIONS, b'{"prompt": "x", "max_tokens": -1}')):
        async with session.post(sim.url + path, data=body) as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert error["type"] == "invalid_request_error" and error["message"]
    assert (await stats_of(session, sim))["requests"] == 0


async def test_pacing_spaces_tokens_from_a_deadline(start_sim, session):
    sim = start_sim("--tokens-per-second", "10", "--ttft-ms", "100")
    sent = time.monotonic()
    arrivals = []
    contents = []
    async with session.post(sim.url + CHAT, json=chat_body(stream=True, max_tokens=5)) as response:
        async for line in response.content:
            if line.startswith(b"data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if "content" in delta and delta["content"]:
                    contents.append(delta["content"])
                    arrivals.append(time.monotonic() - sent)
    assert contents == [" tok0", " tok1", " tok2", " tok3", " tok4"]
    # Lower bounds only: token i is due 0.1 s (TTFT) + i / 10 s after the request.
    for index, arrival in enumerate(arrivals):
        assert arrival >= 0.1 + index * 0.1 - 0.005, arrivals
    assert arrivals[-1] >= 0.5 - 0.005


async def test_a_10_tokens_per_second_answer_of_5_tokens_takes_at_least_0_4_s(start_sim, session):
    sim = start_sim("--tokens-per-second", "10")
    for path, body in ((CHAT, chat_body(max_tokens=5)), (COMPLETIONS, {"prompt": "x", "max_tokens": 5, "stream": True})):
        sent = time.monotonic()
        async with session.post(sim.url + path, json=body) as response:
            await response.read()
        assert time.monotonic() - sent >= 0.4 - 0.005


@pytest.mark.parametrize("health_before_ready", [False, True])
async def test_loading_refuses_generation_until_ready(start_sim, session, health_before_ready):
    load_seconds = 3.0
    launched = time.monotonic()
    sim = start_sim("--load-seconds", str(load_seconds), *(["--health-before-ready"] if health_before_ready else []))

    # The port listens during the load; generation is refused with an OpenAI error.
    async with session.post(sim.url + CHAT, json=chat_body(max_tokens=1)) as response:
        assert response.status == 503
        error = (await response.json())["error"]
        assert error["code"] == 503 and "loading" in error["message"]
    async with session.get(f"{sim.url}/health") as response:
        assert response.status == (200 if health_before_ready else 503)

    # Loading ends once and for all, so ask /health first, then generate: without
    # --health-before-ready, a 200 from /health means the generation after it must work.
    deadline = time.monotonic() + 60
    while True:
        async with session.get(f"{sim.url}/health") as health:
            healthy = health.status == 200
        if health_before_ready:
            assert healthy
        async with session.post(sim.url + CHAT, json=chat_body(max_tokens=1)) as response:
            if response.status == 200:
                break
            assert response.status == 503
            assert health_before_ready or not healthy, "/health said ready while generation was refused"
        assert time.monotonic() < deadline, "the sim never finished loading"
        await asyncio.sleep(0.05)  # the pace of the samples across the end of loading, not an ordering
    assert time.monotonic() - launched >= load_seconds
    async with session.get(f"{sim.url}/health") as response:
        assert response.status == 200
    # Refused requests are not generation requests.
    assert (await stats_of(session, sim))["requests"] == 1


async def test_crash_after_tokens_across_requests_cuts_the_stream_and_exits_1(start_sim, session):
    sim = start_sim("--crash-after-tokens", "5")
    async with session.post(sim.url + CHAT, json=chat_body(max_tokens=3)) as response:
        assert (await response.json())["choices"][0]["message"]["content"] == " tok0 tok1 tok2"

    contents = []
    lines = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with session.post(sim.url + CHAT, json=chat_body(stream=True, max_tokens=20)) as response:
            assert response.status == 200
            async for line in response.content:
                lines.append(line)
                if line.startswith(b"data: {"):
                    content = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    if content:
                        contents.append(content)
    # Three tokens went to the first request; the fifth in total was the last one out.
    assert contents == [" tok0", " tok1"]
    assert not any(b"[DONE]" in line or b"finish_reason\":\"length" in line for line in lines)
    assert sim.process.wait(30) == 1
    assert "crashing after 5 tokens" in sim.process.output()


async def test_disconnect_mid_stream_is_counted_cancelled_at_once(start_sim, session):
    # tok0 goes out at once, tok1 125 s later (token i is due at TTFT + i / rate): a cancel
    # counted within wait_for_stats' 30 s was noticed from the closed connection, not from
    # a failed write, which could only come with tok1.
    sim = start_sim("--tokens-per-second", "0.008")
    response = await session.post(sim.url + CHAT, json=chat_body(stream=True, max_tokens=50))
    assert response.status == 200
    while b"tok0" not in await response.content.readline():
        pass
    stats = await stats_of(session, sim)
    assert stats == {"requests": 1, "active": 1, "completed": 0, "cancelled": 0}

    response.close()
    gone = time.monotonic()
    stats, seen = await wait_for_stats(session, sim, lambda stats: stats["cancelled"] == 1, timeout=30)
    print(f"sim counted the disconnect {(seen - gone) * 1000:.1f} ms after the client left")
    assert stats == {"requests": 1, "active": 0, "completed": 0, "cancelled": 1}


async def test_disconnect_during_a_long_ttft_is_counted_cancelled(start_sim, session):
    sim = start_sim("--ttft-ms", "60000")
    # Non-streaming: the client gives up before any byte came back.
    pending = asyncio.ensure_future(session.post(sim.url + CHAT, json=chat_body(max_tokens=5)))
    await wait_for_stats(session, sim, lambda stats: stats["active"] == 1)
    pending.cancel()
    stats, _ = await wait_for_stats(session, sim, lambda stats: stats["cancelled"] == 1)
    assert stats["active"] == 0

    # Streaming: the headers came at once, the first token never did.
    response = await session.post(sim.url + COMPLETIONS, json={"prompt": "x", "stream": True})
    assert response.status == 200
    response.close()
    stats, _ = await wait_for_stats(session, sim, lambda stats: stats["cancelled"] == 2)
    assert stats == {"requests": 2, "active": 0, "completed": 0, "cancelled": 2}


async def test_unpaced_concurrent_streams_are_all_whole(start_sim, session):
    sim = start_sim()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as many:
        async def one() -> list[str]:
            async with many.post(sim.url + CHAT, json=chat_body(stream=True, max_tokens=200)) as response:
                events = events_of(await response.read())
            assert events[-1] == "[DONE]"
            return [json.loads(event)["choices"][0]["delta"].get("content") for event in events[1:-2]]

        answers = await asyncio.gather(*(one() for _ in range(64)))
    assert all("".join(answer) == answer_text(200) for answer in answers)
    assert await stats_of(session, sim) == {"requests": 64, "active": 0, "completed": 64, "cancelled": 0}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_stops_it_cleanly_even_mid_stream(start_sim, session, signum):
    sim = start_sim("--tokens-per-second", "1")
    response = await session.post(sim.url + CHAT, json=chat_body(stream=True, max_tokens=50))
    await response.content.readline()
    sim.process.signal(signum)
    assert sim.process.wait(30) == 0
    response.close()


async def test_a_taken_port_is_a_user_error(start_sim, tmp_path):
    sim = start_sim()
    second = SwaplabProcess(["sim", "--port", str(sim.port), "--model", "x"], tmp_path / "second.log")
    try:
        assert second.wait(30) == 2
        assert f"cannot listen on 127.0.0.1:{sim.port}" in second.output()
        assert "Traceback" not in second.output()
    finally:
        second.close()


# -- Anthropic's Messages API, read with the official SDK ------------------------------

NICE = [{"role": "user", "content": "say something nice"}]


def anthropic_client(sim: RunningSim) -> anthropic.AsyncAnthropic:
    # No retries: a test that provokes a 400 or a 503 must see that one answer.
    return anthropic.AsyncAnthropic(base_url=sim.url, api_key="unused", max_retries=0)


async def test_messages_answer_is_an_anthropic_message(start_sim, session):
    sim = start_sim("--default-max-tokens", "5")
    body = {
        "model": "asked-for",
        "max_tokens": 3,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "two words"}, {"type": "image", "source": {}}]},
            {"role": "assistant", "content": "fine"},
            {"role": "user", "content": "three more words"},
        ],
    }
    async with session.post(sim.url + MESSAGES, json=body) as response:
        assert response.status == 200
        assert await response.json() == {
            "id": "msg_sim1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": " tok0 tok1 tok2"}],
            "model": "asked-for",
            "stop_reason": "max_tokens",
            "stop_sequence": None,
            "usage": {"input_tokens": 8, "output_tokens": 3},
        }

    async with anthropic_client(sim) as client:
        message = await client.messages.create(model="m", max_tokens=4, system="be brief", messages=NICE)
        counted = await client.messages.count_tokens(model="m", system=body["system"], messages=body["messages"])
    assert isinstance(message, anthropic.types.Message)
    assert (message.id, message.model, message.stop_reason) == ("msg_sim2", "m", "max_tokens")
    assert [block.text for block in message.content] == [" tok0 tok1 tok2 tok3"]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 4)
    assert counted.input_tokens == 8
    # count_tokens generates nothing: it is not a generation request.
    assert await stats_of(session, sim) == {"requests": 2, "active": 0, "completed": 2, "cancelled": 0}


async def test_messages_stream_event_by_event(start_sim):
    sim = start_sim()
    async with anthropic_client(sim) as client:
        stream = await client.messages.create(model="asked-for", max_tokens=3, messages=NICE, stream=True)
        assert stream.response.headers["content-type"] == "text/event-stream"
        events = [event async for event in stream]

    assert [event.type for event in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0].message
    assert (start.id, start.model, start.content, start.stop_reason) == ("msg_sim1", "asked-for", [], None)
    # Anthropic counts the first output token in message_start; message_delta has the total.
    assert (start.usage.input_tokens, start.usage.output_tokens) == (3, 1)
    assert events[1].index == 0 and events[1].content_block.type == "text"
    assert [event.delta.text for event in events[2:5]] == [" tok0", " tok1", " tok2"]
    assert {event.index for event in events[2:6]} == {0}
    assert events[6].delta.stop_reason == "max_tokens"
    assert events[6].usage.output_tokens == 3


async def test_messages_stream_helper_builds_the_whole_message(start_sim):
    sim = start_sim()
    async with anthropic_client(sim) as client:
        async with client.messages.stream(model="m", max_tokens=3, system="be brief", messages=NICE) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
    assert "".join(texts) == " tok0 tok1 tok2"
    assert [block.text for block in final.content] == [" tok0 tok1 tok2"]
    assert final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (5, 3)


async def test_messages_stream_keeps_ttft_and_pace(start_sim):
    sim = start_sim("--ttft-ms", "200", "--tokens-per-second", "20")
    arrivals: list[tuple[str, float]] = []
    async with anthropic_client(sim) as client:
        sent = time.monotonic()
        stream = await client.messages.create(model="m", max_tokens=4, messages=NICE, stream=True)
        async for event in stream:
            arrivals.append((event.type, time.monotonic() - sent))
    # Lower bounds only: nothing of the body before TTFT (0.2 s), token i not before 0.2 + i / 20 s.
    assert arrivals[0][0] == "message_start" and arrivals[0][1] >= 0.2 - 0.005, arrivals
    tokens = [arrival for kind, arrival in arrivals if kind == "content_block_delta"]
    assert len(tokens) == 4
    for index, arrival in enumerate(tokens):
        assert arrival >= 0.2 + index * 0.05 - 0.005, arrivals


async def test_messages_bad_requests_are_anthropic_400s_and_not_counted(start_sim, session):
    sim = start_sim()
    async with anthropic_client(sim) as client:
        # The SDK insists on max_tokens itself, so the body without it goes through its raw post.
        with pytest.raises(anthropic.BadRequestError) as missing:
            await client.post(MESSAGES, cast_to=anthropic.types.Message, body={"model": "m", "messages": NICE})
        with pytest.raises(anthropic.BadRequestError) as zero:
            await client.messages.create(model="m", max_tokens=0, messages=NICE)
        with pytest.raises(anthropic.BadRequestError) as no_messages:
            await client.messages.count_tokens(model="m", messages=[])
    assert missing.value.status_code == 400
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "'max_tokens' is required: an integer of at least 1"},
    }
    assert zero.value.body["error"]["type"] == "invalid_request_error"
    assert "messages" in no_messages.value.body["error"]["message"]

    async with session.post(sim.url + MESSAGES, data=b"{not json") as response:
        assert response.status == 400
        error = await response.json()
    assert error["type"] == "error" and error["error"]["message"].startswith("invalid JSON body")
    assert (await stats_of(session, sim))["requests"] == 0


async def test_messages_while_loading_are_anthropic_503s(start_sim, session):
    sim = start_sim("--load-seconds", "600")
    async with anthropic_client(sim) as client:
        with pytest.raises(anthropic.InternalServerError) as generating:
            await client.messages.create(model="m", max_tokens=3, messages=NICE, stream=True)
        with pytest.raises(anthropic.InternalServerError) as counting:
            await client.messages.count_tokens(model="m", messages=NICE)
    for refused in (generating.value, counting.value):
        assert refused.status_code == 503
        assert refused.body == {"type": "error", "error": {"type": "overloaded_error", "message": "model sim-model is loading"}}
    assert (await stats_of(session, sim))["requests"] == 0


async def test_crash_after_tokens_counts_every_route_and_cuts_a_messages_stream(start_sim, session):
    sim = start_sim("--crash-after-tokens", "5")
    async with session.post(sim.url + CHAT, json=chat_body(max_tokens=3)) as response:
        assert (await response.json())["choices"][0]["message"]["content"] == " tok0 tok1 tok2"

    seen = []
    async with anthropic_client(sim) as client:
        stream = await client.messages.create(model="m", max_tokens=20, messages=NICE, stream=True)
        # The body ends without its last chunk: the SDK's HTTP library says so.
        with pytest.raises(Exception, match="incomplete chunked read"):
            async for event in stream:
                seen.append(event)
    # Three tokens went to the chat request; the fifth in total was the last one out.
    assert [event.type for event in seen] == ["message_start", "content_block_start", "content_block_delta", "content_block_delta"]
    assert [event.delta.text for event in seen[2:]] == [" tok0", " tok1"]
    assert sim.process.wait(30) == 1
    assert "crashing after 5 tokens" in sim.process.output()


async def test_disconnect_from_a_messages_stream_is_counted_cancelled(start_sim, session):
    # One token a second: the cancel is counted from the closed connection, before the next write.
    sim = start_sim("--tokens-per-second", "1")
    async with anthropic_client(sim) as client:
        async with client.messages.stream(model="m", max_tokens=50, messages=NICE) as stream:
            async for event in stream:
                if event.type == "text":
                    break
            assert await stats_of(session, sim) == {"requests": 1, "active": 1, "completed": 0, "cancelled": 0}
    stats, _ = await wait_for_stats(session, sim, lambda stats: stats["cancelled"] == 1)
    assert stats == {"requests": 1, "active": 0, "completed": 0, "cancelled": 1}


async def test_messages_stream_headers_come_at_once_and_leaving_during_ttft_is_cancelled(start_sim, session):
    sim = start_sim("--ttft-ms", "600000")
    async with anthropic_client(sim) as client:
        # create(stream=True) returns on the response headers: they did not wait for the first token.
        stream = await client.messages.create(model="m", max_tokens=5, messages=NICE, stream=True)
        assert stream.response.status_code == 200
        assert await stats_of(session, sim) == {"requests": 1, "active": 1, "completed": 0, "cancelled": 0}
        await stream.close()
    stats, _ = await wait_for_stats(session, sim, lambda stats: stats["cancelled"] == 1)
    assert stats == {"requests": 1, "active": 0, "completed": 0, "cancelled": 1}


# The request reading is a pure function: a table, no server.
@pytest.mark.parametrize(
    ("kind", "body", "expected"),
    [
        ("chat", {"messages": [{"role": "user", "content": "a b c"}]}, (3, 7, "stop")),
        ("chat", {"messages": [{"role": "user", "content": None}], "max_tokens": 0}, (0, 0, "length")),
        ("chat", {"messages": [{"content": "a"}], "max_tokens": 9, "max_completion_tokens": 2}, (1, 2, "length")),
        ("completion", {"prompt": [1, 2, 3]}, (3, 7, "stop")),
        ("completion", {"prompt": [[1, 2], [3]], "n_predict": -1}, (3, 7, "stop")),
        ("completion", {"prompt": "x y", "n_predict": 4}, (2, 4, "length")),
    ],
)
def test_plan_reads_prompt_size_and_answer_length(kind, body, expected):
    plan = plan_request(kind, body, default_model="d", default_max_tokens=7)
    assert (plan.prompt_tokens, plan.completion_tokens, plan.finish_reason) == expected
    assert plan.model == "d" and not plan.stream and not plan.include_usage


def test_plan_reads_a_messages_body():
    body = {
        "model": "m",
        "max_tokens": 2,
        "system": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "d e"}]}, {"role": "assistant", "content": "f"}],
        "stream": True,
    }
    plan = plan_request("messages", body, default_model="d", default_max_tokens=7)
    assert (plan.kind, plan.model, plan.stream) == ("messages", "m", True)
    assert (plan.prompt_tokens, plan.completion_tokens, plan.finish_reason) == (6, 2, "length")


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("chat", []),
        ("chat", {"messages": "hi"}),
        ("chat", {"messages": [{"content": 3}]}),
        ("chat", {"messages": [{"content": "x"}], "max_tokens": "5"}),
        ("chat", {"messages": [{"content": "x"}], "stream": "yes"}),
        ("completion", {}),
        ("completion", {"prompt": [None]}),
        ("messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        ("messages", {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
        ("messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
        ("messages", {"model": "m", "max_tokens": 5, "messages": []}),
        ("messages", {"model": "m", "max_tokens": 5, "system": 3, "messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_plan_rejects_malformed_bodies(kind, body):
    with pytest.raises(BadRequest):
        plan_request(kind, body, default_model="d", default_max_tokens=7)
