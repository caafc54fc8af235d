"""The translation of OpenAI replies into Ollama's, fed as the relay feeds it: bytes in any cut (issue 26)."""

from __future__ import annotations

import json

import ollama
import pytest

from swaplab.router.ollama.replies import ChatReply, EmbedReply


def sse(*documents) -> bytes:
    return b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in documents) + b"data: [DONE]\n\n"


def delta(**fields) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


END = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
       "usage": {"prompt_tokens": 12, "completion_tokens": 9},
       "timings": {"prompt_n": 12, "prompt_ms": 20.5, "predicted_n": 9, "predicted_ms": 90.25}}
STREAM = sse(
    delta(role="assistant", content=""),
    delta(reasoning_content="Weather: "),
    delta(content="Let me look."),
    delta(tool_calls=[{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_", "arguments": ""}}]),
    delta(tool_calls=[{"index": 0, "function": {"name": "weather", "arguments": '{"ci'}}]),
    delta(tool_calls=[{"index": 0, "function": {"arguments": 'ty": "Tokyo"}'}}]),
    END,
)


def run(reply: ChatReply, body: bytes, cut: int | None) -> bytes:
    assert reply.accepts(200, "text/event-stream")
    pieces = [body] if cut is None else [body[i:i + cut] for i in range(0, len(body), cut)]
    return b"".join(reply.feed(piece) for piece in pieces) + reply.finish()


@pytest.mark.parametrize("cut", [None, 1, 2, 7, 64])
def test_a_stream_cut_anywhere_gives_the_same_lines(cut):
    out = run(ChatReply("m", "/api/chat", True, None), STREAM, cut)
    lines = [json.loads(line) for line in out.splitlines()]
    parts = [ollama.ChatResponse.model_validate(line) for line in lines]
    assert [(p.message.thinking, p.message.content) for p in parts[:2]] == [("Weather: ", ""), (None, "Let me look.")]
    (call,) = parts[2].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Tokyo"})
    assert lines[2]["message"]["tool_calls"][0]["id"] == "call_1"
    final = parts[-1]
    assert final.done and final.done_reason == "stop" and len(parts) == 4
    assert (final.prompt_eval_count, final.eval_count) == (12, 9)
    assert (final.prompt_eval_duration, final.eval_duration) == (20_500_000, 90_250_000)  # llama.cpp's timings, in ns


def test_a_client_that_asked_for_one_object_gets_the_stream_whole():
    out = run(ChatReply("m", "/api/chat", False, None), STREAM, 5)
    answer = ollama.ChatResponse.model_validate_json(out)
    assert answer.message.content == "Let me look." and answer.message.thinking == "Weather: "
    assert answer.message.tool_calls[0].function.arguments == {"city": "Tokyo"} and answer.done


def test_generate_lines_carry_response_and_thinking():
    body = sse(delta(reasoning_content="hm"), delta(content="Blue."), {**END, "choices": [
        {"index": 0, "delta": {}, "finish_reason": "length"}]})
    lines = [ollama.GenerateResponse.model_validate_json(line) for line in
             run(ChatReply("m", "/api/generate", True, None, generate=True), body, 3).splitlines()]
    assert [(line.thinking, line.response) for line in lines[:2]] == [("hm", ""), (None, "Blue.")]
    assert lines[-1].done_reason == "length" and lines[-1].response == ""


def test_a_raw_completion_stream_reads_its_text():
    body = sse({"choices": [{"index": 0, "text": "Paris", "finish_reason": None}]},
               {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "usage": {"completion_tokens": 1}})
    lines = run(ChatReply("m", "/api/generate", True, None, generate=True), body, None).splitlines()
    assert json.loads(lines[0])["response"] == "Paris" and json.loads(lines[-1])["eval_count"] == 1


def test_an_error_the_backend_streams_ends_the_reply_as_ollamas_error_line():
    body = sse(delta(content="par"), {"error": {"message": "the model crashed", "type": "server_error"}})
    lines = run(ChatReply("m", "/api/chat", True, None), body, 4).splitlines()
    assert json.loads(lines[-1]) == {"error": "the model crashed"} and len(lines) == 2
    whole = ChatReply("m", "/api/chat", False, None)
    assert json.loads(run(whole, body, 4)) == {"error": "the model crashed"} and whole.status == 502


def test_a_whole_json_reply_for_a_streaming_request_is_one_done_line():
    reply = ChatReply("m", "/api/chat", True, None)
    assert reply.accepts(200, "application/json")
    body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi",
                                                             "tool_calls": [{"id": "c", "function": {
                                                                 "name": "f", "arguments": "not json"}}]},
                                    "finish_reason": "stop"}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}})
    out = reply.feed(body.encode()[:10]) + reply.feed(body.encode()[10:]) + reply.finish()
    (line,) = out.splitlines()
    answer = ollama.ChatResponse.model_validate_json(line)
    assert answer.done and answer.message.content == "hi"
    assert answer.message.tool_calls[0].function.arguments == {}  # a model's unreadable arguments: an empty object


def test_embeddings_in_their_input_order_and_the_older_single_shape():
    body = json.dumps({"data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}],
                       "usage": {"prompt_tokens": 4}}).encode()
    reply = EmbedReply("e", "/api/embed", None, legacy=False)
    assert reply.accepts(200, "application/json") and not reply.accepts(500, "application/json")
    reply.feed(body)
    answer = ollama.EmbedResponse.model_validate_json(reply.finish())
    assert answer.embeddings == [[1.0, 0.0], [0.0, 1.0]] and answer.prompt_eval_count == 4
    legacy = EmbedReply("e", "/api/embeddings", None, legacy=True)
    legacy.feed(body)
    assert json.loads(legacy.finish()) == {"embedding": [1.0, 0.0]}
