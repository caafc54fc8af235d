"""The request observer on real bytes: `swaplab sim` and llama.cpp's own server, and through `answer()`."""

from __future__ import annotations

import json
import sys
import time

import aiohttp
import pytest

from observed_proxy import RelayProxy
from procs import SwaplabProcess, eventually, free_port, http_status, wait_until
from swaplab.router.watch.captures import CaptureStore, PendingCapture
from swaplab.router.watch.observe import HEAD_BYTES, TAIL_BYTES, RequestObservation, token_counts

CHAT = [{"role": "user", "content": "Write a long story about a dragon."}]


class Capture:
    """One real response: its status, content type and the chunks as the socket delivered them."""

    def __init__(self, status: int, content_type: str, chunks: list[bytes]):
        self.status = status
        self.content_type = content_type
        self.chunks = chunks

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def observe(self, chunks: list[bytes] | None = None):
        observation = RequestObservation("m", "/p")
        observation.on_headers(self.status, self.content_type)
        for chunk in self.chunks if chunks is None else chunks:
            observation.on_chunk(chunk)
        return observation.finish()


async def capture(url: str, body: dict) -> Capture:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as response:
            chunks = [chunk async for chunk in response.content.iter_any()]
            return Capture(response.status, response.content_type, chunks)


def counts(record) -> tuple:
    return record.prompt_tokens, record.completion_tokens, record.cached_tokens


def assert_same_counts_on_every_split(sample: Capture, expected: tuple, around: int = 1200) -> None:
    """Cut the body in two at every byte of its first and last `around` bytes: the counts never change."""
    body = sample.body
    cuts = set(range(1, min(around, len(body)))) | set(range(max(1, len(body) - around), len(body)))
    for cut in sorted(cuts):
        record = sample.observe([body[:cut], body[cut:]])
        assert counts(record) == expected, f"cut at byte {cut} of {len(body)}"
    # And one byte at a time (short bodies) or in 7-byte pieces (long ones).
    step = 1 if len(body) < 20_000 else 7
    assert counts(sample.observe([body[i : i + step] for i in range(0, len(body), step)])) == expected


def sse_events(body: bytes) -> list[dict]:
    events = []
    for block in body.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    return events


# -- swaplab sim --------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    port = free_port()
    process = SwaplabProcess(
        ["sim", "--port", str(port), "--model", "simmodel"], tmp_path_factory.mktemp("sim") / "sim.log"
    )
    url = f"http://127.0.0.1:{port}"
    process.wait_http(f"{url}/health")
    yield url
    process.close()


async def test_sim_stream_usage_survives_every_chunk_boundary(sim):
    sample = await capture(f"{sim}/v1/chat/completions", {
        "model": "simmodel", "messages": CHAT, "max_tokens": 12, "stream": True,
        "stream_options": {"include_usage": True},
    })
    usage = sse_events(sample.body)[-1]["usage"]
    expected = (usage["prompt_tokens"], usage["completion_tokens"], None)
    assert expected[1] == 12
    record = sample.observe()
    assert counts(record) == expected
    assert record.status == 200 and record.error is None and record.ttft_ms is not None
    assert_same_counts_on_every_split(sample, expected)


async def test_sim_non_streaming_chat_and_completions(sim):
    for path, body in (
        ("/v1/chat/completions", {"model": "simmodel", "messages": CHAT, "max_tokens": 7}),
        ("/v1/completions", {"model": "simmodel", "prompt": "one two three", "max_tokens": 5}),
    ):
        sample = await capture(sim + path, body)
        usage = json.loads(sample.body)["usage"]
        record = sample.observe()
        assert counts(record) == (usage["prompt_tokens"], usage["completion_tokens"], None)
        assert record.ttft_ms is None  # nothing streamed: no first token to time
        assert record.tokens_per_second is None  # the sim reports no decode rate
        assert_same_counts_on_every_split(sample, counts(record))


async def test_sim_stream_without_usage_reports_no_counts(sim):
    sample = await capture(f"{sim}/v1/chat/completions", {
        "model": "simmodel", "messages": CHAT, "max_tokens": 5, "stream": True,
    })
    assert b'"usage"' not in sample.body
    record = sample.observe()
    assert counts(record) == (None, None, None)
    assert record.ttft_ms is not None and record.tokens_per_second is None


async def test_a_long_stream_is_held_in_a_bounded_window(sim):
    sample = await capture(f"{sim}/v1/chat/completions", {
        "model": "simmodel", "messages": CHAT, "max_tokens": 4000, "stream": True,
        "stream_options": {"include_usage": True},
    })
    assert len(sample.body) > 20 * (HEAD_BYTES + TAIL_BYTES)
    observation = RequestObservation("m", "/p")
    observation.on_headers(sample.status, sample.content_type)
    biggest = 0
    for chunk in sample.chunks:
        observation.on_chunk(chunk)
        biggest = max(biggest, observation.retained_bytes)
    assert biggest <= HEAD_BYTES + 2 * TAIL_BYTES + max(map(len, sample.chunks))  # the tail holds whole chunks
    usage = sse_events(sample.body)[-1]["usage"]
    assert counts(observation.finish()) == (usage["prompt_tokens"], 4000, None)


async def test_a_captured_stream_keeps_every_byte_and_the_same_counts(sim):
    sample = await capture(f"{sim}/v1/chat/completions", {
        "model": "simmodel", "messages": CHAT, "max_tokens": 4000, "stream": True,
        "stream_options": {"include_usage": True},
    })
    headers = {"Authorization": "Bearer sk-x", "X-Session-ID": "s-1"}
    for limit, kept in ((10 * len(sample.body), True), (len(sample.body) // 2, False)):
        observation = RequestObservation(
            "m", "/p", request_headers=headers, session_headers=("X-Session-ID",),
            capture=PendingCapture(5, "POST", "/p", headers, limit),
        )
        observation.sending(b'{"sent": true}')
        observation.on_headers(sample.status, sample.content_type)
        for chunk in sample.chunks:
            observation.on_chunk(chunk)
        record = observation.finish()  # the record first, as the router's batch takes them
        assert counts(record) == (counts(sample.observe())) and record.capture_id == 5 and record.session_id == "s-1"
        captured = observation.capture()
        if not kept:  # more than its limit: given up while it streamed
            assert captured is None
            continue
        assert captured.response_body == sample.body and captured.request_body == b'{"sent": true}'
        assert captured.status == 0 and captured.request_headers["Authorization"] == "[REDACTED]"
        assert observation.capture() is None  # taken once


async def test_sim_error_body_becomes_the_error(sim):
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{sim}/v1/chat/completions", data=b"{not json") as response:
            sample = Capture(response.status, response.content_type, [await response.read()])
    record = sample.observe()
    assert record.status == 400
    assert record.error.startswith("invalid JSON body")


def test_anthropic_usage_is_split_between_first_and_last_event():
    # Shapes from Anthropic's streaming documentation: input counts come first, output last.
    head = b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":25,"cache_read_input_tokens":100,"cache_creation_input_tokens":3,"output_tokens":1}}}\n\n'
    tail = b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}\n\n'
    result = token_counts(head, tail)
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (128, 15, 100)


def test_keys_inside_generated_text_are_not_mistaken_for_usage():
    body = b'data: {"choices":[{"delta":{"content":"\\"usage\\": {\\"prompt_tokens\\": 999}"}}]}\n\n'
    result = token_counts(body, body)
    assert result.prompt_tokens is None


# -- llama.cpp's own server (the real default) -------------------------------------------


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory):
    pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")
    from swaplab.builtin.models import smollm2_path
    from swaplab.errors import SwaplabError

    try:
        model = smollm2_path()
    except SwaplabError as error:
        pytest.skip(str(error))
    import subprocess

    port = free_port()
    log = open(tmp_path_factory.mktemp("llamacpp") / "llamacpp.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "swaplab.builtin.llamacpp", "--model", str(model), "--port", str(port),
         "--ctx-size", "2048", "--parallel", "1", "--threads", "2"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: process.poll() is not None or http_status(f"{url}/health") == 200, 120, "llama.cpp to load")
    assert process.poll() is None, "llama.cpp exited"
    yield url
    process.terminate()
    process.wait(30)
    log.close()


async def test_llamacpp_chat_stream_usage_and_timings(llamacpp):
    sample = await capture(f"{llamacpp}/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 24, "stream": True, "stream_options": {"include_usage": True},
    })
    final = sse_events(sample.body)[-1]
    usage, timings = final["usage"], final["timings"]
    expected = (usage["prompt_tokens"], usage["completion_tokens"], usage["prompt_tokens_details"]["cached_tokens"])
    record = sample.observe()
    assert counts(record) == expected
    assert record.tokens_per_second == timings["predicted_per_second"]  # the server's own decode rate
    assert record.prompt_per_second == timings["prompt_per_second"]  # and its prefill rate
    assert record.resp_content_type.startswith("text/event-stream")
    assert_same_counts_on_every_split(sample, expected)


async def test_llamacpp_stream_without_usage_falls_back_to_timings(llamacpp):
    body = {"messages": CHAT, "max_tokens": 16}
    reference = json.loads((await capture(f"{llamacpp}/v1/chat/completions", body)).body)["usage"]
    sample = await capture(f"{llamacpp}/v1/chat/completions", {**body, "stream": True})
    assert b'"usage"' not in sample.body
    timings = sse_events(sample.body)[-1]["timings"]
    record = sample.observe()
    # timings' prompt_n counts only what was not in the cache; prompt_n + cache_n is the prompt.
    assert record.prompt_tokens == reference["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
    assert record.completion_tokens == timings["predicted_n"]
    assert record.cached_tokens == timings["cache_n"]
    assert_same_counts_on_every_split(sample, counts(record))


async def test_llamacpp_anthropic_stream_longer_than_the_window(llamacpp):
    reference = json.loads((await capture(f"{llamacpp}/v1/messages", {"messages": CHAT, "max_tokens": 2})).body)["usage"]
    sample = await capture(f"{llamacpp}/v1/messages", {
        "messages": CHAT, "max_tokens": 600, "ignore_eos": True, "temperature": 0, "stream": True,
    })
    # Long enough that the middle is let go: message_start's input counts survive in the head.
    assert len(sample.body) > HEAD_BYTES + 2 * TAIL_BYTES
    prompt = reference["input_tokens"] + reference.get("cache_read_input_tokens", 0)
    record = sample.observe()
    assert record.prompt_tokens == prompt
    assert record.completion_tokens == sse_events(sample.body)[-2]["usage"]["output_tokens"] == 600
    assert_same_counts_on_every_split(sample, counts(record), around=600)


async def test_llamacpp_native_completion_and_its_errors(llamacpp):
    for stream in (False, True):
        sample = await capture(f"{llamacpp}/completion", {"prompt": "The sky is", "n_predict": 6, "ignore_eos": True, "stream": stream})
        final = sse_events(sample.body)[-1] if stream else json.loads(sample.body)
        record = sample.observe()
        assert record.completion_tokens == final["timings"]["predicted_n"] == 6
        assert record.prompt_tokens == final["timings"]["prompt_n"] + final["timings"]["cache_n"]
        assert record.tokens_per_second == final["timings"]["predicted_per_second"]
    sample = await capture(f"{llamacpp}/v1/chat/completions", {"messages": "not a list"})
    record = sample.observe()
    assert record.status == 400 and record.error == json.loads(sample.body)["error"]["message"]


# -- through relay() ---------------------------------------------------------------


async def test_relay_times_a_paced_stream(tmp_path):
    port = free_port()
    sim = SwaplabProcess(
        ["sim", "--port", str(port), "--model", "paced", "--ttft-ms", "150", "--tokens-per-second", "50"],
        tmp_path / "sim.log",
    )
    try:
        sim.wait_http(f"http://127.0.0.1:{port}/health")
        async with RelayProxy(f"http://127.0.0.1:{port}") as proxy, aiohttp.ClientSession() as session:
            body = {"model": "paced-alias", "messages": CHAT, "max_tokens": 20, "stream": True,
                    "stream_options": {"include_usage": True}}
            # The client's own view, on the relay's clock (perf_counter, this process): the relay
            # starts observing after `sent` and sees each chunk before it forwards it.
            sent = time.perf_counter()
            async with session.post(f"{proxy.url}/v1/chat/completions", json=body) as response:
                assert await response.content.readany()
                first_byte = time.perf_counter()
                await response.read()
            await eventually(lambda: proxy.records, 5, "the record")
            recorded = time.perf_counter()  # the record exists: the relay's end came before this
    finally:
        sim.close()
    [record] = proxy.records
    assert (record.status, record.path, record.requested_model, record.completion_tokens) == (
        200, "/v1/chat/completions", "paced-alias", 20,
    )
    # The first token's time, not the last one's: at least the sim's TTFT, and no later than
    # the client's own first byte (the sim sends the last token 19 * 20 ms after the first).
    assert 150 <= record.ttft_ms <= (first_byte - sent) * 1000
    # Whole: at least TTFT and 19 token intervals, within the client's view of the request.
    assert 150 + 19 * 20 <= record.duration_ms <= (recorded - sent) * 1000
    # The rate is the 19 tokens after the first over the time from the first chunk to the last.
    # That window ends no later than the request, and it is no shorter than 150 + 19 * 20 ms (the
    # last chunk left the sim that long after the request reached it, after `sent`) less the
    # client's first-byte time (the first chunk reached the relay before the client's first byte).
    # A rate over all 20 tokens, or over the time from the request's start, falls outside.
    assert record.tokens_per_second is not None and record.tokens_per_second > 0
    window_ms = (record.completion_tokens - 1) / record.tokens_per_second * 1000
    assert 150 + 19 * 20 - (first_byte - sent) * 1000 <= window_ms <= record.duration_ms - record.ttft_ms
    assert not record.client_disconnected and record.error is None


async def test_relay_records_a_client_that_leaves_and_a_backend_that_dies(tmp_path):
    # The client that leaves reads from a sim whose tok0 goes out at once and tok1 125 s later
    # (token i is due at TTFT + i / rate), so a record within the 30 s waited for was made when
    # the client left: not at a failed write, nor at the stream's end (or the crash that a
    # stream left running would reach). The backend that dies is a sim of its own.
    leaving_port = free_port()
    leaving = SwaplabProcess(
        ["sim", "--port", str(leaving_port), "--model", "s", "--tokens-per-second", "0.008"], tmp_path / "leaving.log",
    )
    try:
        leaving.wait_http(f"http://127.0.0.1:{leaving_port}/health")
        port = free_port()
        sim = SwaplabProcess(
            ["sim", "--port", str(port), "--model", "s", "--tokens-per-second", "50", "--crash-after-tokens", "30"],
            tmp_path / "sim.log",
        )
        try:
            sim.wait_http(f"http://127.0.0.1:{port}/health")
            body = {"model": "s", "messages": CHAT, "max_tokens": 200, "stream": True}
            async with RelayProxy(f"http://127.0.0.1:{leaving_port}") as proxy:
                sent = time.perf_counter()
                async with aiohttp.ClientSession() as session:
                    async with session.post(f"{proxy.url}/v1/chat/completions", json=body) as response:
                        await response.content.readline()  # the first event, then leave
                await eventually(lambda: proxy.records, 30, "the disconnect's record")
                recorded = time.perf_counter()
                [gone] = proxy.records
            async with RelayProxy(f"http://127.0.0.1:{port}") as proxy:
                async with aiohttp.ClientSession() as session:
                    async with session.post(f"{proxy.url}/v1/chat/completions", json=body) as response:
                        tail = await response.read()  # the sim dies at its 30th token
                await eventually(lambda: proxy.records, 5, "the crash's record")
                [crashed] = proxy.records
        finally:
            sim.close()
    finally:
        leaving.close()
    assert gone.client_disconnected and gone.status == 200 and gone.error is None
    assert gone.duration_ms <= (recorded - sent) * 1000  # it ended when the client left, within the wait
    assert b"the upstream broke off mid-response" in tail
    assert not crashed.client_disconnected
    assert crashed.error == "the upstream broke off mid-response"


async def test_relay_records_an_unreachable_upstream():
    async with RelayProxy(f"http://127.0.0.1:{free_port()}") as proxy, aiohttp.ClientSession() as session:
        async with session.post(f"{proxy.url}/v1/chat/completions", json={"model": "x"}) as response:
            assert response.status == 502
    [record] = proxy.records
    assert record.status == 502 and record.error.startswith("cannot connect to http://127.0.0.1:")
    assert record.error.endswith("(Connection refused)")


def test_speculative_decoding_counts_from_llamacpp_timings_and_vllm_metrics():
    llamacpp = b'data: {"choices": [], "timings": {"predicted_n": 9, "draft_n": 12, "draft_n_accepted": 7}}\n\n'
    counts = token_counts(llamacpp, llamacpp)
    assert (counts.draft_tokens, counts.draft_accepted_tokens) == (12, 7)
    vllm = (
        b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5}, "metrics": {"speculative_decoding": '
        b'{"num_draft_tokens": 8, "num_accepted_draft_tokens": 6}}}'
    )
    counts = token_counts(vllm, vllm)
    assert (counts.completion_tokens, counts.draft_tokens, counts.draft_accepted_tokens) == (5, 8, 6)
    assert token_counts(b"{}", b"{}").draft_tokens is None



def test_requests_captured_at_once_hold_no_more_than_the_budget_together():
    """256 long streams captured at once must not hold 256 budgets: the one that takes the total over is given up."""
    store = CaptureStore(1)  # 1 MiB
    chunk = b"data: " + b"x" * 4090 + b"\n\n"  # 4 KiB
    observations = [
        RequestObservation("m", "/p", capture=PendingCapture(i, "POST", "/p", {}, store.budget, store))
        for i in range(3)
    ]
    for observation in observations:
        observation.on_headers(200, "text/event-stream")
    for _ in range(100):  # 400 KiB each, interleaved: 1.2 MiB together
        for observation in observations:
            observation.on_chunk(chunk)
    assert store.held <= store.budget
    given_up = [o for o in observations if o.pending.chunks is None]
    assert len(given_up) == 1 and "at once" in given_up[0].pending.reason
    for observation in observations:
        observation.end(completed=True)
        observation.record()
    kept = [observation.capture() for observation in observations]
    assert [capture is not None for capture in kept] == [o not in given_up for o in observations]
    assert all(len(capture.response_body) == 100 * len(chunk) for capture in kept if capture is not None)
    assert store.held == 0  # built or given up, nothing counts any more


def test_captures_of_ended_requests_make_no_room_shortage_for_the_running_ones():
    """Ended requests wait for the bookkeeping batch: until it runs, the newest of them win, as in the store,
    and a request still running is not given up because older, finished ones have not been stored yet."""
    store = CaptureStore(1)  # 1 MiB
    chunk = b"data: " + b"x" * 4090 + b"\n\n"  # 4 KiB

    def streamed(capture_id: int) -> RequestObservation:  # 400 KiB, alone
        pending = PendingCapture(capture_id, "POST", "/p", {}, store.budget, store)
        observation = RequestObservation("m", "/p", capture=pending)
        observation.on_headers(200, "text/event-stream")
        for _ in range(100):
            observation.on_chunk(chunk)
        return observation

    first = streamed(1)
    first.end(completed=True)
    second = streamed(2)
    second.end(completed=True)
    third = streamed(3)  # 1.2 MiB with the two ended ones, none of which the batch has stored yet
    assert third.pending.chunks is not None, third.pending.reason
    third.end(completed=True)
    assert store.arriving <= store.budget and store.held == 0
    assert first.pending.chunks is None and "newer" in first.pending.reason
    for observation in (first, second, third):
        observation.record()
        capture = observation.capture()
        if capture is not None:
            store.add(capture)
    assert [capture_id in store for capture_id in (1, 2, 3)] == [False, True, True]
    assert store.held == 0 and store.arriving == 0
