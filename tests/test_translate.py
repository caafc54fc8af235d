"""Anthropic's Messages and OpenAI's Responses over a server that serves only chat completions.

A real router over real sims: `native` serves the routes itself (the sim's own Messages
encoder), `chatonly` is the sim as TabbyAPI (whose release has neither route), so the router
translates. The SDKs' stream events must be the same through both; tools go and come back;
a peer that lacks the route is learned from its 404; a 404 about a model is passed on.
"""

from __future__ import annotations

import json
import textwrap
import urllib.request

import anthropic
import openai
import pytest

from procs import SIM, Router, Sim, eventually

SCRIPT = {
    "rules": [
        {"match": "weather", "replies": [
            {"reasoning": "I should look it up.", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
            "It is sunny in Paris.",
        ]},
        {"match": "patch", "replies": [
            {"tool_calls": [{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n*** End Patch"}}]},
            "Patched.",
        ]},
    ],
}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    folder = tmp_path_factory.mktemp("translate")
    script = folder / "script.json"
    script.write_text(json.dumps(SCRIPT))
    config = folder / "config.yaml"
    config.write_text(textwrap.dedent(f"""\
        models:
          native:
            cmd: {SIM} --port ${{PORT}} --model native --default-max-tokens 6
            proxy: http://127.0.0.1:${{PORT}}
          chatonly:
            cmd: {SIM} --engine tabby --disable-auth true --port ${{PORT}} --model chatonly --default-max-tokens 6 --script {script}
            proxy: http://127.0.0.1:${{PORT}}
          slow:
            cmd: {SIM} --engine tabby --disable-auth true --port ${{PORT}} --model slow --ttft-ms 600 --tokens-per-second 4
            proxy: http://127.0.0.1:${{PORT}}
            heartbeatInterval: 0.1
          declared:
            cmd: {SIM} --engine tabby --disable-auth true --port ${{PORT}} --model declared
            proxy: http://127.0.0.1:${{PORT}}
            translate: {{messages: false}}
        """))
    process = Router(config, folder)
    yield process
    process.close()


def _anthropic(router: Router) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0)


def _openai(router: Router) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)


def _events(router: Router, model: str, **extra) -> tuple[list[tuple], anthropic.types.Message]:
    """The SDK's stream events, without what differs by nature (ids), and its final message."""
    with _anthropic(router).messages.stream(model=model, max_tokens=6, messages=[{"role": "user", "content": "hi"}],
                                            **extra) as stream:
        events = []
        for event in stream:
            if event.type == "content_block_delta":
                events.append((event.type, event.index, event.delta.type, event.delta.text))
            elif event.type == "content_block_start":
                events.append((event.type, event.index, event.content_block.type))
            elif event.type == "message_delta":
                events.append((event.type, event.delta.stop_reason, event.usage.output_tokens))
            else:
                events.append((event.type,))
        return events, stream.get_final_message()


def test_messages_stream_events_equal_the_native_routes(router):
    native, native_message = _events(router, "native")
    translated, translated_message = _events(router, "chatonly")
    assert translated == native
    assert [event[0] for event in native][:2] == ["message_start", "content_block_start"]
    assert translated_message.content[0].text == native_message.content[0].text
    assert translated_message.stop_reason == native_message.stop_reason == "max_tokens"
    assert translated_message.usage.output_tokens == native_message.usage.output_tokens == 6
    assert translated_message.model == "chatonly"


def test_messages_whole_answer_equals_the_native_routes(router):
    client = _anthropic(router)
    answers = [client.messages.create(model=model, max_tokens=4, system="Be brief.",
                                      messages=[{"role": "user", "content": "hello"}]) for model in ("native", "chatonly")]
    native, translated = answers
    assert [block.type for block in translated.content] == [block.type for block in native.content] == ["text"]
    assert translated.content[0].text == native.content[0].text
    assert translated.stop_reason == native.stop_reason
    assert translated.usage.output_tokens == native.usage.output_tokens
    assert translated.usage.input_tokens > 0


def test_messages_tools_go_and_come_back(router):
    client = _anthropic(router)
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    question = {"role": "user", "content": "What is the weather in Paris?"}
    with client.messages.stream(model="chatonly", max_tokens=100, tools=tools, messages=[question]) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        first = stream.get_final_message()
    assert [block.type for block in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "I should look it up."
    call = first.content[1]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    assert first.stop_reason == "tool_use"
    assert set(deltas) == {"thinking_delta", "input_json_delta"}
    second = client.messages.create(model="chatonly", max_tokens=100, tools=tools, messages=[
        question,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},
    ])
    assert second.content[0].text == "It is sunny in Paris."
    assert second.stop_reason == "end_turn"
    sent = json.loads(urllib.request.urlopen(f"{router.url}/upstream/chatonly/sim/last-request").read())
    assert sent["path"] == "/v1/chat/completions"
    messages = sent["body"]["messages"]
    assert [message["role"] for message in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call.id
    assert messages[2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}


def test_count_tokens_through_translation(router):
    client = _anthropic(router)
    request = {"system": "Be brief", "messages": [{"role": "user", "content": "Tell me a story"}]}
    native = client.messages.count_tokens(model="native", **request).input_tokens
    translated = client.messages.count_tokens(model="chatonly", **request).input_tokens
    assert native > 0 and translated > 0


def test_untranslatable_input_is_a_400_in_the_routes_shape(router):
    with pytest.raises(anthropic.BadRequestError) as raised:
        _anthropic(router).messages.create(model="chatonly", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                                          "data": "JVBERi0="}}]}])
    assert "only text documents" in str(raised.value)
    assert raised.value.body["type"] == "error"
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(router).responses.create(model="chatonly", input="hi", previous_response_id="resp_1")
    assert "send the whole conversation" in str(refused.value)


def test_declared_false_passes_the_servers_404_on(router):
    with pytest.raises(anthropic.NotFoundError):
        _anthropic(router).messages.create(model="declared", max_tokens=4, messages=[{"role": "user", "content": "hi"}])


def test_responses_stream_and_whole(router):
    client = _openai(router)
    whole = client.responses.create(model="chatonly", input="hi", instructions="Be brief.", max_output_tokens=3)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text == " tok0 tok1 tok2"
    assert whole.usage.output_tokens == 3
    with client.responses.stream(model="chatonly", input=[{"role": "user", "content": "hi"}]) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert final.output_text == " tok0 tok1 tok2 tok3 tok4 tok5"


def test_responses_function_and_custom_tools(router):
    client = _openai(router)
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}},
             {"type": "custom", "name": "apply_patch", "description": "Apply a patch"},
             {"type": "web_search"}]
    with client.responses.stream(model="chatonly", input="What is the weather?", tools=tools) as stream:
        types = [event.type for event in stream]
        first = stream.get_final_response()
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call"]
    call = first.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert "response.function_call_arguments.delta" in types
    second = client.responses.create(model="chatonly", tools=tools, input=[
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ])
    assert second.output_text == "It is sunny in Paris."
    patched = client.responses.create(model="chatonly", tools=tools, input="please patch it")
    assert [item.type for item in patched.output] == ["custom_tool_call"]
    assert patched.output[0].input == "*** Begin Patch\n*** End Patch"


def _peer_router(tmp_path, sim: Sim, model: str) -> Router:
    """A router with no models of its own and `sim` as its one peer, serving `model`."""
    config = tmp_path / "config.yaml"
    config.write_text(f"models: {{}}\npeers:\n  box:\n    proxy: {sim.url}\n    models: [{model}]\n")
    return Router(config, tmp_path)


def test_a_peer_without_the_route_is_learned_from_its_404(tmp_path):
    sim = Sim(tmp_path, "--engine", "tabby", "--disable-auth", "true", "--default-max-tokens", "3", model="remote")
    router = _peer_router(tmp_path, sim, "remote")
    try:
        client = _anthropic(router)
        for _ in range(2):
            answer = client.messages.create(model="remote", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
            assert answer.content[0].text == " tok0 tok1 tok2"
        stats = json.loads(urllib.request.urlopen(f"{sim.url}/sim/stats").read())
        # The first request met the 404 (not a generation) and went again translated; the second went
        # translated at once: two chat completions, and the lesson told once.
        assert stats["requests"] == 2, stats
        assert router.output().count("answered 404 on the messages API's route") == 1
    finally:
        router.close()
        sim.close()


def test_a_404_about_the_model_is_not_a_missing_route(tmp_path):
    sim = Sim(tmp_path, "--engine", "vllm", "--served-model-name", "other", model="other")
    router = _peer_router(tmp_path, sim, "wrong-name")
    try:
        with pytest.raises(anthropic.NotFoundError) as raised:
            _anthropic(router).messages.create(model="wrong-name", max_tokens=3,
                                               messages=[{"role": "user", "content": "hi"}])
        assert "does not exist" in str(raised.value)
        assert "answered 404" not in router.output()
    finally:
        router.close()
        sim.close()



def _response_events(router: Router, model: str, **extra) -> tuple[list[tuple], object]:
    with _openai(router).responses.stream(model=model, input="hi", instructions="Be brief.", **extra) as stream:
        events = []
        for event in stream:
            delta = getattr(event, "delta", None)
            events.append((event.type, event.sequence_number, delta if isinstance(delta, str) else None))
            last = event
        # The SDK builds a final response from `response.completed` alone; an incomplete one is its event's.
        return events, stream.get_final_response() if last.type == "response.completed" else last.response


@pytest.mark.parametrize("extra", [{}, {"max_output_tokens": 4}])
def test_responses_stream_events_equal_the_native_routes(router, extra):
    native, native_response = _response_events(router, "native", **extra)
    translated, translated_response = _response_events(router, "chatonly", **extra)
    assert translated == native
    assert translated_response.status == native_response.status
    assert translated_response.output_text == native_response.output_text
    assert translated_response.usage.output_tokens == native_response.usage.output_tokens
    assert [item.type for item in translated_response.output] == [item.type for item in native_response.output]


async def test_heartbeats_and_cancel_through_translation(router):
    """A translated stream gets Anthropic's pings while the server is silent, and a client that leaves
    cancels the server's generation, as on every route."""
    import aiohttp

    body = {"model": "slow", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/messages", json=body) as response:
            assert response.status == 200
            events = []
            async for line in response.content:
                if line.startswith(b"event: "):
                    events.append(line[7:].strip().decode())
                if "content_block_delta" in events:
                    break  # the client leaves mid-answer
    assert events[0] == "ping" and events.index("message_start") > 0, events

    def stats():
        with urllib.request.urlopen(f"{router.url}/upstream/slow/sim/stats") as answer:
            return json.loads(answer.read())

    await eventually(lambda: stats()["cancelled"] == 1, 10, lambda: f"the sim to count a cancel: {stats()}")


async def test_ttft_of_a_translated_stream_is_its_first_token(router):
    """The activity row reads the server's chat stream in its own dialect: TTFT is the first token's (the sim
    holds it 600 ms), not the heartbeats' nor never."""
    with _anthropic(router).messages.stream(model="slow", max_tokens=2, messages=[{"role": "user", "content": "ttft"}]) \
            as stream:
        stream.until_done()

    def row():
        with urllib.request.urlopen(f"{router.url}/api/activity") as answer:
            rows = json.loads(answer.read())["activity"]
        return next((r for r in rows if r["requested_model"] == "slow" and r["completion_tokens"] == 2), None)

    found = await eventually(row, 10, "the translated request's activity row")
    assert found["path"] == "/v1/messages"
    assert found["ttft_ms"] is not None and found["ttft_ms"] >= 600, found
