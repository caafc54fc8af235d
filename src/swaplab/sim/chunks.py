"""The sim's answers in OpenAI's wire format, as ready-to-write bytes.

Streams are built from per-request templates so a token costs one bytes
formatting, not a json.dumps: the sim sits in the hot path of the router benchmarks.
"""

from __future__ import annotations

import json
import re
from typing import Any

from swaplab.sim.request import Plan
from swaplab.sim.script import ScriptedReply
from swaplab.sim.tokens import TOKEN_PREFIX, answer_text

DONE = b"data: [DONE]\n\n"
# The error types OpenAI-compatible servers give the statuses the sim answers with.
ERROR_TYPES = {
    400: "invalid_request_error", 404: "not_found_error", 500: "internal_server_error",
    501: "not_supported_error", 503: "unavailable_error",
}


class StreamEncoder:
    """The SSE events of one streamed answer."""

    __slots__ = ("_head", "_token_prefix", "_token_suffix", "_plan", "_id", "_created")

    def __init__(self, plan: Plan, request_id: str, created: int):
        self._plan = plan
        self._id = request_id
        self._created = created
        object_name = "chat.completion.chunk" if plan.kind == "chat" else "text_completion"
        self._head = (
            f'data: {{"id":"{request_id}","object":"{object_name}","created":{created},'
            f'"model":{json.dumps(plan.model)},"choices":[{{"index":0,'
        ).encode()
        # A token's text is TOKEN_PREFIX and its index: nothing in it needs JSON escaping.
        if plan.kind == "chat":
            self._token_prefix = self._head + b'"delta":{"content":"' + TOKEN_PREFIX.encode()
            self._token_suffix = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._token_prefix = self._head + b'"text":"' + TOKEN_PREFIX.encode()
            self._token_suffix = b'","logprobs":null,"finish_reason":null}]}\n\n'

    def opening(self) -> bytes:
        """What precedes the first token: the assistant role for chat, nothing for completions."""
        if self._plan.kind == "chat":
            return self._head + b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        return b""

    def token(self, index: int) -> bytes:
        """The event carrying output token `index`."""
        return b"%b%d%b" % (self._token_prefix, index, self._token_suffix)

    def scripted(self, reply: ScriptedReply, request_id: str) -> list[bytes]:
        """The token-bearing events of a scripted reply, one word each: reasoning, content, tool calls."""
        events = [{"reasoning_content": piece} for piece in word_pieces(reply.reasoning)]
        events += [{"content": piece} for piece in word_pieces(reply.content)]
        for index, call in enumerate(tool_calls_of(reply, request_id)):
            # As OpenAI streams a call: id, type and name first, then the arguments' JSON text in fragments.
            head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
            events.append({"tool_calls": [{"index": index, **head}]})
            events += [
                {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                for piece in word_pieces(call["function"]["arguments"])
            ]
        return [
            self._head + b'"delta":%b,"logprobs":null,"finish_reason":null}]}\n\n' % json.dumps(delta, separators=(",", ":")).encode()
            for delta in events
        ]

    def closing(self) -> bytes:
        """The finish_reason event, the usage event when asked for, and [DONE]."""
        plan = self._plan
        reason = plan.finish_reason.encode()
        # llama.cpp sends its timings with the last chunk.
        timings = b',"timings":' + json.dumps(timings_of(plan), separators=(",", ":")).encode() if plan.timings else b""
        if plan.kind == "chat":
            finish = self._head + b'"delta":{},"logprobs":null,"finish_reason":"%b"}]%b}\n\n' % (reason, timings)
        else:
            finish = self._head + b'"text":"","logprobs":null,"finish_reason":"%b"}]%b}\n\n' % (reason, timings)
        if not plan.include_usage:
            return finish + DONE
        # The usage event has no choices; its head is the template's minus the open choice.
        usage_head = self._head[: -len(b'[{"index":0,')]
        usage = usage_head + b"[],\"usage\":%b}\n\n" % json.dumps(usage_of(plan), separators=(",", ":")).encode()
        return finish + usage + DONE


def usage_of(plan: Plan) -> dict[str, int]:
    """OpenAI's usage object for a whole answer."""
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
    }


def timings_of(plan: Plan) -> dict[str, int]:
    """llama.cpp's `timings`, the token counts only: prompt tokens processed, reused from the slot, generated."""
    return {
        "prompt_n": plan.prompt_tokens - plan.cache_tokens,
        "cache_n": plan.cache_tokens,
        "predicted_n": plan.completion_tokens,
    }


def word_pieces(text: str) -> list[str]:
    """`text` cut before each word, whitespace kept, so the pieces join back to it exactly."""
    pieces = re.findall(r"\s*\S+", text)
    if not pieces:
        return [text] if text else []
    pieces[-1] += text[sum(map(len, pieces)) :]  # trailing whitespace rides on the last word
    return pieces


def tool_calls_of(reply: ScriptedReply, request_id: str) -> list[dict[str, Any]]:
    """A scripted reply's calls as a message's `tool_calls`; ids the script leaves out come from the request's."""
    stem = request_id.removeprefix("chatcmpl-")
    return [
        {"id": call.id or f"call_{stem}_{index}", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        for index, call in enumerate(reply.tool_calls)
    ]


def scripted_message(reply: ScriptedReply, request_id: str) -> dict[str, Any]:
    """A scripted reply as a non-streamed chat message (content null when it only calls tools, as OpenAI's)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or (None if reply.tool_calls else "")}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = tool_calls_of(reply, request_id)
    return message


def whole_answer(plan: Plan, request_id: str, created: int) -> dict[str, Any]:
    """The non-streaming response body."""
    if plan.kind == "chat":
        if plan.reply is not None:
            message = scripted_message(plan.reply, request_id)
        else:
            message = {"role": "assistant", "content": answer_text(plan.completion_tokens)}
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": plan.finish_reason,
        }
        object_name = "chat.completion"
    else:
        choice = {"index": 0, "text": answer_text(plan.completion_tokens), "logprobs": None, "finish_reason": plan.finish_reason}
        object_name = "text_completion"
    return {
        "id": request_id,
        "object": object_name,
        "created": created,
        "model": plan.model,
        "choices": [choice],
        "usage": usage_of(plan),
        **({"timings": timings_of(plan)} if plan.timings else {}),
    }


def error_body(status: int, message: str) -> dict[str, Any]:
    """An OpenAI-style error object for an HTTP status the sim answers with."""
    return {"error": {"message": message, "type": ERROR_TYPES[status], "param": None, "code": status}}
