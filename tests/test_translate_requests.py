"""The requests translated to chat completions, field by field (docs/translation.md's tables);
the replies are checked end to end, through the SDKs, in test_translate.py."""

from __future__ import annotations

import pytest

from swaplab.router.translate import BadRequest, messages, responses


def test_messages_request_maps_every_field():
    chat = messages.chat_request({
        "model": "m", "max_tokens": 64, "stop_sequences": ["END"], "temperature": 0.2, "top_p": 0.9, "top_k": 20,
        "stream": True, "system": [{"type": "text", "text": "Be brief."}],
        "tools": [
            {"name": "read", "description": "Read a file", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
            {"name": "later", "input_schema": {"type": "object"}, "defer_loading": True},
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
            ]},
            {"role": "system", "content": [{"type": "text", "text": "Env: linux"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "no such file"}],
                 "is_error": True},
                {"type": "text", "text": "And now?"},
            ]},
        ],
    })
    assert chat["max_tokens"] == 64 and chat["stop"] == ["END"]
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.2, 0.9, 20)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["read"]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\n\nEnv: linux"},
        {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
        {"role": "assistant", "content": "Reading.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": '{"path":"a"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such file"},
        {"role": "user", "content": "And now?"},
    ]


def test_messages_tool_choice_names_a_tool():
    chat = messages.chat_request({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                  "tools": [{"name": "t", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "t"}})
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "t"}}
    assert "stream" not in chat


def test_count_tokens_is_a_one_token_completion():
    chat = messages.count_request({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert chat["max_tokens"] == 1 and "stream" not in chat


@pytest.mark.parametrize("message, words", [
    ({"role": "tool", "content": "x"}, "role 'user' or 'assistant'"),
    ({"role": "user", "content": 3}, "a string or a list of content blocks"),
    ({"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}, "base64 data or a url"),
    ({"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}, "cannot be sent in a message of role 'assistant'"),
])
def test_messages_refusals_say_where(message, words):
    with pytest.raises(BadRequest, match="messages\\[0\\]") as raised:
        messages.chat_request({"messages": [message], "max_tokens": 1})
    assert words in str(raised.value)


def test_responses_request_maps_every_field():
    chat = responses.chat_request({
        "model": "m", "instructions": "Be a coder.", "max_output_tokens": 99, "temperature": 0.5,
        "parallel_tool_calls": False, "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
        "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "custom", "name": "apply_patch", "description": "Patch files"},
            {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]},
            {"type": "web_search"},
        ],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none"}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is here?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
            {"role": "user", "content": "Thanks"},
        ],
    })
    assert chat["max_tokens"] == 99 and chat["temperature"] == 0.5 and chat["parallel_tool_calls"] is False
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True}}
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["exec_command", "apply_patch"]
    assert chat["tools"][1]["function"]["parameters"]["required"] == ["input"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert chat["messages"] == [
        {"role": "system", "content": "Be a coder.\n\nSandbox: none"},
        {"role": "user", "content": [{"type": "text", "text": "What is here?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'}},
            {"id": "c2", "type": "function", "function": {"name": "apply_patch",
                                                          "arguments": '{"input":"*** Begin Patch"}'}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "Done"},
        {"role": "user", "content": "Thanks"},
    ]


@pytest.mark.parametrize("document, words", [
    ({"input": 3}, "input: expected a string or a list of items"),
    ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "input_file", "file_id": "f"}]}, "input[0]: an item of type 'input_file'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": "x", "previous_response_id": "resp_1"}, "send the whole conversation"),
])
def test_responses_refusals_say_where(document, words):
    with pytest.raises(BadRequest) as raised:
        responses.chat_request(document)
    assert words in str(raised.value)
