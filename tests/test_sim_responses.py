"""`swaplab sim` serving OpenAI's Responses API (`POST /v1/responses`) as vLLM 0.34.0 does: a real sim
process, read with the official `openai` SDK."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest
from procs import Sim

from swaplab.engines import contract
from swaplab.sim.request import BadRequest, plan_request
from swaplab.sim.tokens import answer_text

NICE = "say something nice"
# vLLM's event order for a text answer (swaplab/sim/responses.py has the origins).
OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def openai_client(sim: Sim) -> openai.AsyncOpenAI:
    # No retries: a test that provokes a 400 or a 503 must see that one answer.
    return openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)


async def stats_of(sim: Sim) -> dict:
    async with aiohttp.ClientSession() as session, session.get(sim.url + "/sim/stats") as response:
        return await response.json()


async def test_a_stream_event_by_event_is_vllms_and_reads_as_the_chat_answer(start_sim):
    sim = start_sim()
    async with openai_client(sim) as client:
        stream = await client.responses.create(
            model="asked-for", instructions="be brief", input=NICE, max_output_tokens=3, stream=True)
        assert stream.response.headers["content-type"] == "text/event-stream"
        events = [event async for event in stream]
        chat = await client.chat.completions.create(
            model="asked-for", max_tokens=3,
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": NICE}])

    assert [event.type for event in events] == [
        *OPENING, *["response.output_text.delta"] * 3, *CLOSING, "response.incomplete"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    created = events[0].response
    assert (created.id, created.model, created.status, created.output, created.usage) == (
        "resp_sim1", "asked-for", "in_progress", [], None)
    item_id = events[2].item.id
    deltas = events[4:7]
    assert {(event.item_id, event.output_index, event.content_index) for event in deltas} == {(item_id, 0, 0)}
    # The same tokens, and the same prompt count, as the chat route gives the same prompt.
    text = "".join(event.delta for event in deltas)
    assert text == answer_text(3) == chat.choices[0].message.content
    assert events[7].text == text and events[8].part.text == text
    assert events[9].item.status == "incomplete"

    # The limit cut the answer: vLLM ends with response.incomplete, saying why.
    final = events[-1].response
    assert (final.status, final.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert final.output_text == text
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (5, 3, 8)
    assert final.usage.input_tokens == chat.usage.prompt_tokens
    assert (final.usage.input_tokens_details.cached_tokens, final.usage.output_tokens_details.reasoning_tokens) == (0, 0)
    assert await stats_of(sim) == {"requests": 2, "active": 0, "completed": 2, "cancelled": 0}


async def test_the_sdks_stream_helper_builds_a_completed_response(start_sim):
    sim = start_sim("--default-max-tokens", "4")
    async with openai_client(sim) as client:
        async with client.responses.stream(model="m", input=[{"role": "user", "content": NICE}]) as stream:
            texts = [event.delta async for event in stream if event.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    assert "".join(texts) == answer_text(4)
    # No limit asked: the answer ended at --default-max-tokens, as at end-of-sequence.
    assert (final.status, final.incomplete_details, final.output_text) == ("completed", None, answer_text(4))
    assert [item.status for item in final.output] == ["completed"]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 4)


async def test_a_whole_response_with_input_items_and_tools(start_sim):
    sim = start_sim("--default-max-tokens", "5")
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "two words"}, {"type": "input_image", "image_url": "x"}]},
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "three more words"},
    ]
    async with openai_client(sim) as client:
        # Tools are accepted and echoed; the sim still answers text.
        limited = await client.responses.create(model="asked-for", input=items, tools=tools, max_output_tokens=3)
        whole = await client.responses.create(model="m", input="four words of input", instructions="be brief")

    assert (limited.id, limited.object, limited.model) == ("resp_sim1", "response", "asked-for")
    assert (limited.status, limited.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    [message] = limited.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "incomplete")
    assert [(part.type, part.text, part.annotations) for part in message.content] == [("output_text", answer_text(3), [])]
    assert (limited.usage.input_tokens, limited.usage.output_tokens, limited.usage.total_tokens) == (6, 3, 9)
    assert ([tool.name for tool in limited.tools], limited.tool_choice, limited.max_output_tokens) == (
        ["get_weather"], "auto", 3)

    assert (whole.id, whole.status, whole.incomplete_details, whole.instructions) == ("resp_sim2", "completed", None, "be brief")
    assert whole.output_text == answer_text(5)
    assert (whole.usage.input_tokens, whole.usage.output_tokens, whole.max_output_tokens) == (6, 5, 5)


async def test_created_comes_at_once_and_the_text_keeps_ttft_and_pace(start_sim):
    sim = start_sim("--ttft-ms", "300", "--tokens-per-second", "20")
    arrivals: list[tuple[str, float]] = []
    async with openai_client(sim) as client:
        sent = time.monotonic()
        stream = await client.responses.create(model="m", input=NICE, max_output_tokens=4, stream=True)
        async for event in stream:
            arrivals.append((event.type, time.monotonic() - sent))
    # Lower bounds only: no item before TTFT (0.3 s), token i not before 0.3 + i / 20 s.
    assert [kind for kind, _ in arrivals[:4]] == OPENING
    assert arrivals[2][1] >= 0.3 - 0.005, arrivals
    tokens = [arrival for kind, arrival in arrivals if kind == "response.output_text.delta"]
    assert len(tokens) == 4
    for index, arrival in enumerate(tokens):
        assert arrival >= 0.3 + index * 0.05 - 0.005, arrivals


async def test_created_and_in_progress_do_not_wait_for_the_first_token(start_sim):
    # vLLM sends them before generating: with a ten-minute TTFT they still come, and leaving then is a cancel.
    sim = start_sim("--ttft-ms", "600000")
    async with openai_client(sim) as client:
        stream = await client.responses.create(model="m", input=NICE, stream=True)
        iterator = stream.__aiter__()
        first = [await asyncio.wait_for(iterator.__anext__(), 30) for _ in range(2)]
        assert [event.type for event in first] == ["response.created", "response.in_progress"]
        assert await stats_of(sim) == {"requests": 1, "active": 1, "completed": 0, "cancelled": 0}
        await stream.close()
    for _ in range(1500):
        stats = await stats_of(sim)
        if stats["cancelled"] == 1:
            break
        await asyncio.sleep(0.02)  # the poll's pace; the loop's count bounds it
    assert stats == {"requests": 1, "active": 0, "completed": 0, "cancelled": 1}


async def test_crash_after_tokens_cuts_a_responses_stream(start_sim):
    sim = start_sim("--crash-after-tokens", "2")
    seen = []
    async with openai_client(sim) as client:
        stream = await client.responses.create(model="m", input=NICE, max_output_tokens=20, stream=True)
        # The body ends without its last chunk: the SDK says the connection failed.
        with pytest.raises(openai.APIConnectionError):
            async for event in stream:
                seen.append(event)
    # The second token was the last one out: no done events, no terminal event.
    assert [event.type for event in seen] == [*OPENING, *["response.output_text.delta"] * 2]
    assert "".join(event.delta for event in seen[4:]) == answer_text(2)
    assert sim.popen.wait(30) == 1
    assert "crashing after 2 tokens" in sim.output()


async def test_bad_requests_are_vllms_400s_and_not_counted(start_sim):
    sim = start_sim()
    async with openai_client(sim) as client:
        # The SDK sends what it is given: a body without `input` goes through its raw post.
        with pytest.raises(openai.BadRequestError) as missing:
            await client.post("/responses", cast_to=openai.types.responses.Response, body={"model": "m"})
        with pytest.raises(openai.BadRequestError) as zero:
            await client.responses.create(model="m", input=NICE, max_output_tokens=0)
        with pytest.raises(openai.BadRequestError) as required:
            await client.responses.create(model="m", input=NICE, tool_choice="required")
        with pytest.raises(openai.BadRequestError) as background:
            await client.responses.create(model="m", input=NICE, background=True)
    assert missing.value.status_code == 400
    assert missing.value.body == {
        "message": "'input' is required: a string or a list of input items", "type": "BadRequestError",
        "param": "body.input", "code": 400,
    }
    # vLLM's own words where it has them.
    assert (zero.value.body["message"], zero.value.body["param"]) == ("max_tokens must be at least 1, got 0.", "max_tokens")
    assert required.value.body["message"] == "Tool choice 'required' must be specified with 'tools' parameter."
    assert background.value.body["param"] == "background"
    assert (await stats_of(sim))["requests"] == 0


async def test_while_loading_it_is_a_503(start_sim):
    sim = start_sim("--load-seconds", "600")
    async with openai_client(sim) as client:
        with pytest.raises(openai.InternalServerError) as loading:
            await client.responses.create(model="m", input=NICE, stream=True)
    assert loading.value.status_code == 503
    assert loading.value.body["message"] == "model sim-model is loading"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "tabby"])
async def test_the_route_is_there_where_the_engine_has_it(start_sim, engine):
    # vLLM, SGLang and llama.cpp serve /v1/responses; TabbyAPI does not (its contract's `absent`).
    served = "/v1/responses" not in contract(engine).absent
    assert served == (engine != "tabby")
    sim = start_sim("--engine", engine, *(["--disable-auth", "true"] if engine == "tabby" else []))
    async with openai_client(sim) as client:
        if served:
            response = await client.responses.create(model="sim-model", input=NICE, max_output_tokens=2)
            assert response.output_text == answer_text(2)
        else:
            with pytest.raises(openai.NotFoundError):
                await client.responses.create(model="sim-model", input=NICE, max_output_tokens=2)


# The request reading is a pure function: a table, no server.
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"input": "a b c"}, (3, 7, "stop", {"max_output_tokens": 7})),
        ({"input": "a", "instructions": "b c", "max_output_tokens": 2}, (3, 2, "length", {"instructions": "b c", "max_output_tokens": 2})),
        # Message items with string content or text parts; a tool's output counts, a call's arguments do not.
        ({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a b"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "d e f"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "g", "annotations": []}]},
        ], "tools": [{"type": "function", "name": "f"}]},
         (6, 7, "stop", {"tools": [{"type": "function", "name": "f"}], "max_output_tokens": 7})),
    ],
)
def test_plan_reads_a_responses_body(body, expected):
    plan = plan_request("responses", body, default_model="d", default_max_tokens=7)
    assert (plan.prompt_tokens, plan.completion_tokens, plan.finish_reason, plan.echoes) == expected
    assert (plan.kind, plan.model) == ("responses", "d")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "body.input"),
        ({"input": 3}, "body.input"),
        ({"input": ["a"]}, "body.input"),
        ({"input": [{"role": "user", "content": 3}]}, "body.input"),
        ({"input": "x", "instructions": ["a"]}, "body.instructions"),
        ({"input": "x", "max_output_tokens": "5"}, "body.max_output_tokens"),
        ({"input": "x", "max_output_tokens": -1}, "max_tokens"),
        ({"input": "x", "stream": "yes"}, "body.stream"),
        ({"input": "x", "prompt": {"id": "p"}}, "prompt"),
        ({"input": "x", "background": True, "store": False}, "background"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "g"}, "tools": [{"type": "function", "name": "f"}]},
         "tool_choice"),
    ],
)
def test_plan_refuses_what_vllm_refuses_of_a_responses_body(body, param):
    with pytest.raises(BadRequest) as refused:
        plan_request("responses", body, default_model="d", default_max_tokens=7)
    assert refused.value.param == param
