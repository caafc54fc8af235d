"""`swaplab sim --script FILE` as a real process, read through the shared OpenAIClient."""

from __future__ import annotations

import json

import pytest
from procs import Sim, run_swaplab

from swaplab.client import OpenAIClient

WEATHER_SCRIPT = {
    "rules": [
        {
            "match": r"weather in (Paris|Rome)",
            "replies": [
                {
                    "reasoning": "I should look it up.\nBoth cities.",
                    "tool_calls": [
                        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}},
                        {"name": "get_weather", "arguments": {"city": "Rome"}, "id": "call_rome"},
                    ],
                },
                "It is  sunny\nin both.\n",
            ],
        },
        {"match": "count", "replies": ["one", "two"], "then": {"content": "no more", "finish_reason": "length"}},
        {"match": "think", "replies": [{"reasoning": "still thinking about it", "finish_reason": "length"}]},
    ],
    "default": "I only talk about the weather.",
}


@pytest.fixture
def start_scripted(tmp_path):
    started: list[Sim] = []

    def start(script: dict, *extra: str, name: str = "script.json") -> Sim:
        path = tmp_path / name
        path.write_text(json.dumps(script))
        sim = Sim(tmp_path, "--script", str(path), *extra)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.close()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assistant_turns(count: int) -> list[dict]:
    """`count` earlier assistant turns with their tool answers, as an agent loop sends them."""
    messages: list[dict] = []
    for index in range(count):
        messages.append({"role": "assistant", "content": "", "tool_calls": []})
        messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": "ok"})
    return messages


@pytest.mark.parametrize("stream", [True, False])
async def test_reasoning_and_tool_calls_arrive_as_openai_sends_them(start_scripted, stream):
    sim = start_scripted(WEATHER_SCRIPT)
    async with OpenAIClient(sim.url) as client:
        result = await client.chat("sim-model", user("what is the weather in Paris and Rome?"), stream=stream)
    assert result.ok, result.error
    assert result.reasoning == "I should look it up.\nBoth cities."
    assert result.text == ""
    assert result.finish_reason == "tool_calls"
    assert [call["function"]["name"] for call in result.tool_calls] == ["get_weather", "get_weather"]
    assert [json.loads(call["function"]["arguments"]) for call in result.tool_calls] == [
        {"city": "Paris", "unit": "C"},
        {"city": "Rome"},
    ]
    assert result.tool_calls[1]["id"] == "call_rome"
    assert result.tool_calls[0]["id"].startswith("call_") and result.tool_calls[0]["type"] == "function"
    # Words: 7 of reasoning, and per call its name plus the words of its arguments' JSON text.
    assert result.completion_tokens == 7 + (1 + 4) + (1 + 2)
    assert result.prompt_tokens == 8
    if stream:
        # One event per word: 7 reasoning, per call a head and one fragment per argument word.
        assert len(result.token_times) == 7 + (1 + 4) + (1 + 2)


async def test_turns_follow_the_assistant_messages_already_in_the_request(start_scripted):
    sim = start_scripted(WEATHER_SCRIPT)
    async with OpenAIClient(sim.url) as client:
        second = await client.chat("sim-model", user("the weather in Rome") + assistant_turns(1))
        again = await client.chat("sim-model", user("the weather in Rome") + assistant_turns(5))
        counted = [await client.chat("sim-model", user("count for me") + assistant_turns(turn)) for turn in range(4)]
    # Content is streamed word by word; whitespace, doubled or newline, comes back exactly.
    assert second.text == "It is  sunny\nin both.\n" and second.tool_calls == [] and second.finish_reason == "stop"
    assert second.completion_tokens == 5
    assert again.text == second.text  # past the last reply, the last one repeats
    assert [result.text for result in counted] == ["one", "two", "no more", "no more"]
    assert [result.finish_reason for result in counted] == ["stop", "stop", "length", "length"]


async def test_rules_in_order_then_default(start_scripted):
    sim = start_scripted(WEATHER_SCRIPT)
    async with OpenAIClient(sim.url) as client:
        # Both the first and second rules' patterns are present: the first listed wins.
        both = await client.chat("sim-model", user("count the weather in Paris"))
        other = await client.chat("sim-model", [{"role": "system", "content": "hello"}, *user("hi")])
        parts = await client.chat("sim-model", [{"role": "user", "content": [{"type": "text", "text": "count"}]}])
    assert both.finish_reason == "tool_calls"
    assert other.text == "I only talk about the weather." and other.completion_tokens == 6
    assert parts.text == "one"


async def test_truncated_thought_has_reasoning_no_answer_and_finish_length(start_scripted):
    sim = start_scripted(WEATHER_SCRIPT)
    async with OpenAIClient(sim.url) as client:
        streamed = await client.chat("sim-model", user("think hard"), max_tokens=4)
        whole = await client.chat("sim-model", user("think hard"), stream=False)
    for result in (streamed, whole):
        assert result.ok
        assert (result.reasoning, result.text, result.finish_reason) == ("still thinking about it", "", "length")
        assert result.completion_tokens == 4


async def test_without_a_default_unmatched_requests_get_the_usual_answer(start_scripted):
    sim = start_scripted({"rules": [{"match": "^never$", "replies": ["x"]}]}, "--default-max-tokens", "3")
    async with OpenAIClient(sim.url) as client:
        result = await client.chat("sim-model", user("anything"))
        completion = await client.complete("sim-model", "never")  # scripts answer chat only
    assert result.text == " tok0 tok1 tok2" and result.finish_reason == "stop"
    assert completion.text == " tok0 tok1 tok2"


async def test_yaml_script(start_scripted, tmp_path):
    path = tmp_path / "script.yaml"
    path.write_text(
        "rules:\n"
        "  - match: list\n"
        "    replies:\n"
        "      - tool_calls: [{name: list_dir, arguments: {path: .}}]\n"
        "default: {content: done}\n"
    )
    sim = Sim(tmp_path, "--script", str(path))
    try:
        async with OpenAIClient(sim.url) as client:
            listed = await client.chat("sim-model", user("list the files"))
            other = await client.chat("sim-model", user("hello"))
    finally:
        sim.close()
    assert [(call["function"]["name"], call["function"]["arguments"]) for call in listed.tool_calls] == [
        ("list_dir", '{"path": "."}')
    ]
    assert other.text == "done"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("missing.yaml", None, "sim: cannot read script"),
        ("broken.json", "{not json", "is not valid JSON"),
        ("broken.yaml", "rules: [unclosed", "is not valid YAML"),
        ("key.yaml", "rules: [{match: x, replies: [x], reply: y}]", "rules[0]: unknown key 'reply'"),
        ("regex.yaml", "rules: [{match: '(', replies: [x]}]", "rules[0]: 'match' is not a valid regular expression"),
        ("empty.yaml", "rules: [{match: x, replies: []}]", "rules[0]: 'replies' must be a non-empty list"),
        ("call.yaml", "default: {tool_calls: [{arguments: {}}]}", "default.tool_calls[0]: 'name' must be a non-empty string"),
        ("finish.yaml", 'default: {finish_reason: "a\\"b"}', "'finish_reason' must be a word"),
        ("list.yaml", "- a\n- b\n", "must be a mapping"),
    ],
)
def test_a_bad_script_is_one_line_and_exit_2(tmp_path, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    completed = run_swaplab("sim", "--port", "0", "--model", "m", "--script", str(path), timeout=60)
    assert completed.returncode == 2
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swaplab: sim: ") and message in lines[0], completed.stderr
    assert "listening" not in completed.stdout
