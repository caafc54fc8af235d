"""TTFT is the first token's time, never that of what a backend sends while it prefills.

llama.cpp's server answers a streamed request with its headers at once and then, for as long as
the prefill lasts, a bare SSE comment ":" every `--sse-ping-interval` seconds (30 by default: an
agent's 64k-token prompt got several). The router once took the first of them for the first
token: a first token at 71.5 s was recorded at 30.0 s, and the decode rate from there. Here a
real router relays a sim in llama.cpp's personality, whose prefill outlasts many pings; and the
observation's search for the first content event is held to each dialect's own events.
"""

from __future__ import annotations

import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from procs import SIM, eventually
from swaplab.client.http import OpenAIClient
from swaplab.router.watch import observe
from swaplab.router.watch.firsttoken import first_content
from swaplab.router.watch.observe import RequestObservation

PREFILL_SECONDS = 0.5
PING_SECONDS = 0.05
# The sim's tokenizer: a token per word; the prefill is paced at this many prompt tokens a second.
PREFILL_RATE = 20
PROMPT_WORDS = int(PREFILL_SECONDS * PREFILL_RATE)


def prompt(word: str) -> str:
    # A prompt of its own per request: the slot's prompt cache holds none of it, so all of it is prefilled.
    return " ".join(f"{word}{index}" for index in range(PROMPT_WORDS))


def events(body: bytes) -> list[bytes]:
    return [event for event in body.replace(b"\r\n", b"\n").split(b"\n\n") if event]


async def test_a_long_prefill_with_pings_records_the_first_tokens_time(router_factory):
    router = router_factory(f"""
models:
  slow:
    cmd: >-
      {SIM} --port ${{PORT}} --model slow --engine llamacpp --sse-ping-interval {PING_SECONDS}
      --prefill-tokens-per-second {PREFILL_RATE} --tokens-per-second 50
""")
    requests = {
        "/v1/chat/completions": {"model": "slow", "stream": True, "max_tokens": 5,
                                 "messages": [{"role": "user", "content": prompt("chat")}]},
        "/v1/messages": {"model": "slow", "stream": True, "max_tokens": 5,
                         "messages": [{"role": "user", "content": prompt("messages")}]},
    }
    async with aiohttp.ClientSession() as session:
        # Started first: a request that waits for the start has the load in its TTFT, whatever is counted.
        warm = {"model": "slow", "max_tokens": 1, "messages": [{"role": "user", "content": "warm"}]}
        async with session.post(f"{router.url}/v1/chat/completions", json=warm) as response:
            assert response.status == 200
        for path, body in requests.items():
            async with session.post(f"{router.url}{path}", json=body) as response:
                assert response.status == 200
                streamed = events(await response.read())
            # What the client saw: the backend's comments, for the whole prefill, before any event.
            first_event = next(index for index, event in enumerate(streamed) if not event.startswith(b":"))
            assert first_event >= 1 and all(event == b":" for event in streamed[:first_event]), streamed[:3]

        # The bench's client, through the same router: its TTFT is its first token-bearing chunk too.
        async with OpenAIClient(router.url) as client:
            result = await client.chat("slow", [{"role": "user", "content": prompt("bench")}], max_tokens=5)
        assert result.ok and result.ttft_ms is not None and result.ttft_ms >= PREFILL_SECONDS * 1000, result

        count = len(requests) + 1

        async def rows() -> list[dict]:
            async with session.get(f"{router.url}/api/activity") as response:
                found = (await response.json())["activity"]
            streams = [row for row in found if row["resp_content_type"] == "text/event-stream"]
            return streams if len(found) == count + 1 else []

        recorded = await eventually(rows, 20, "every request's activity row")  # the streamed ones
        async with session.get(f"{router.url}/metrics") as response:
            scraped = await response.text()

    # The first token cannot leave the sim before its prefill of PROMPT_WORDS tokens at PREFILL_RATE
    # a second is over, and the router's clock for the request started before the sim's did.
    assert sorted(row["path"] for row in recorded) == sorted([*requests, "/v1/chat/completions"])
    for row in recorded:
        assert row["waited_for"] is None  # the model was ready: nothing but the prefill came before the token
        assert row["status"] == 200 and row["completion_tokens"] == 5, row
        assert row["ttft_ms"] >= PREFILL_SECONDS * 1000, (row["path"], row["ttft_ms"])
        assert row["ttft_ms"] <= row["duration_ms"]
    [family] = [f for f in text_string_to_metric_families(scraped) if f.name == "swaplab:time_to_first_token_seconds"]
    sums = {sample.name: sample.value for sample in family.samples if sample.labels.get("model") == "slow"}
    assert sums["swaplab:time_to_first_token_seconds_count"] == count
    assert sums["swaplab:time_to_first_token_seconds_sum"] >= count * PREFILL_SECONDS


# -- the first content event, per dialect (pure: the bytes as backends send them) -------------------


def sse(document: dict, event: str | None = None, *, spaced: bool = False) -> bytes:
    data = json.dumps(document) if spaced else json.dumps(document, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + b"data: " + data.encode() + b"\n\n"


def chunk(delta: dict, **extra) -> bytes:
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra})


PING = b":\n\n"
ROUTER_HEARTBEAT = b": keep-alive\n\n"

NOT_CONTENT = {
    "/v1/chat/completions": [
        PING, ROUTER_HEARTBEAT,
        chunk({"role": "assistant", "content": None},  # llama.cpp's return_progress, during its prefill
              prompt_progress={"total": 900, "cache": 0, "processed": 512, "time_ms": 80}),
        chunk({"role": "assistant", "content": ""}),  # vLLM's and SGLang's role chunk
        chunk({"role": "assistant", "content": "", "reasoning_content": ""}),  # SGLang's, for K2's templates
        chunk({}),  # a finish
        sse({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 0}}),
        sse({"error": {"message": "the \"content\": \"x\" field", "type": "server_error"}}),
        b"data: [DONE]\n\n",
    ],
    "/v1/messages": [
        PING,
        sse({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                   "content": [], "model": "m", "usage": {"input_tokens": 9}}},
            "message_start"),
        sse({"type": "ping"}, "ping", spaced=True),  # Anthropic's own keep-alive, as its API spaces it
        sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            "content_block_start"),
        sse({"type": "content_block_start", "index": 1,
             "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}},
            "content_block_start"),
    ],
    "/v1/responses": [
        PING,
        # vLLM and SGLang send these two before the prefill, with the request's instructions in them.
        sse({"type": "response.created", "response": {
            "id": "resp_1", "status": "in_progress", "output": [], "metadata": {"text": "hello"},
            "instructions": "Stream response.output_text.delta events; say \"text\": \"x\"."}},
            "response.created"),
        sse({"type": "response.in_progress", "response": {"id": "resp_1", "status": "in_progress"}},
            "response.in_progress"),
        sse({"type": "response.output_item.added", "output_index": 0,
             "item": {"type": "message", "role": "assistant", "content": []}}, "response.output_item.added"),
        sse({"type": "response.content_part.added", "part": {"type": "output_text", "text": ""}},
            "response.content_part.added"),
    ],
    "/api/chat": [  # Ollama's lines (an Ollama peer's, or the router's own heartbeat's shape)
        b'{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":""},"done":false}\n',
        b'{"model":"m","created_at":"2026-01-01T00:00:00Z","response":"","done":true,"done_reason":"stop"}\n',
    ],
}
CONTENT = {
    "/v1/chat/completions": [
        chunk({"role": "assistant", "content": None}) + chunk({"content": "Hel"}),  # llama.cpp: both in one write
        chunk({"content": "\"quoted\""}),
        chunk({"reasoning_content": "Let"}),
        chunk({"reasoning": "Let"}),  # vLLM's newer spelling
        chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "weather", "arguments": ""}}]}),
        sse({"choices": [{"index": 0, "text": " tok0", "finish_reason": None}]}),  # completions
        sse({"content": " tok0", "stop": False}),  # llama.cpp's /completion
        sse({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, spaced=True),  # json.dumps' spacing
    ],
    "/v1/messages": [
        sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
            "content_block_delta"),
        sse({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let"}},
            "content_block_delta"),
        sse({"type": "content_block_delta", "index": 1,
             "delta": {"type": "input_json_delta", "partial_json": "{\"city\""}}, "content_block_delta", spaced=True),
    ],
    "/v1/responses": [
        sse({"type": "response.output_text.delta", "delta": "Hi"}, "response.output_text.delta"),
        sse({"type": "response.reasoning_text.delta", "delta": "Let"}, "response.reasoning_text.delta"),
        sse({"type": "response.function_call_arguments.delta", "delta": "{\""},
            "response.function_call_arguments.delta"),
    ],
    "/api/chat": [
        b'{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"Hi"},"done":false}\n',
        b'{"model":"m","created_at":"2026-01-01T00:00:00Z","response":"Hi","done":false}\n',  # /api/generate
        b'{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":"Let"},'
        b'"done":false}\n',
        b'{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f"}}]},"done":false}\n',
    ],
}
CONTENT_TYPES = {"/api/chat": "application/x-ndjson"}


def cases(table: dict[str, list[bytes]]) -> list[tuple[str, bytes]]:
    return [(path, sample) for path, samples in table.items() for sample in samples]


@pytest.mark.parametrize(("path", "sample"), cases(NOT_CONTENT))
def test_what_precedes_the_first_token_is_not_content(path, sample):
    assert first_content(path, CONTENT_TYPES.get(path, "text/event-stream")).search(sample) is None


@pytest.mark.parametrize(("path", "sample"), cases(CONTENT))
def test_each_dialects_first_token_is_content(path, sample):
    assert first_content(path, CONTENT_TYPES.get(path, "text/event-stream")).search(sample) is not None


@pytest.fixture
def clock(monkeypatch):
    """The observation's clock, one second a reading: a record's TTFT in seconds is the number of
    the chunk (from 1) that brought the first content event."""
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(observe.time, "perf_counter", lambda: float(next(ticks)))


def observed(path: str, chunks: list[bytes]):
    observation = RequestObservation("m", path)
    observation.on_headers(200, CONTENT_TYPES.get(path, "text/event-stream"))
    for piece in chunks:
        observation.on_chunk(piece)
    return observation.finish()


@pytest.mark.parametrize("path", list(CONTENT))
def test_ttft_is_the_chunk_of_the_first_content_event_wherever_the_chunks_are_cut(clock, path):
    prelude = b"".join(NOT_CONTENT[path])
    body = prelude + CONTENT[path][0] + CONTENT[path][-1]
    found = first_content(path, CONTENT_TYPES.get(path, "text/event-stream")).search(body)
    assert found is not None and found.start() >= len(prelude)
    for cut in range(1, len(body)):
        record = observed(path, [body[:cut], body[cut:]])
        # Found in the first piece only when the whole marker is in it; never before the content's bytes.
        assert record.ttft_ms == (1000 if cut >= found.end() else 2000), (path, cut)
    assert observed(path, [prelude]).ttft_ms is None  # no token came: no time to first token


def test_the_decode_rate_starts_at_the_first_token_not_the_pings(clock):
    usage = sse({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": 3}})
    tokens = [chunk({"role": "assistant", "content": None}) + chunk({"content": "a"}), chunk({"content": "b"}),
              chunk({"content": "c"})]
    record = observed("/v1/chat/completions", [PING] * 5 + tokens + [usage])
    # Chunks 1-5 are pings, 6 the first token, 9 the last chunk: two tokens after the first in 3 s.
    assert record.ttft_ms == 6000
    assert record.tokens_per_second == pytest.approx(2 / 3)
