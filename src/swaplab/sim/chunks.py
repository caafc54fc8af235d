"""The sim's answers in OpenAI's wire format, as ready-to-write bytes.

Streams are built from per-request templates so a token costs one bytes
formatting, not a json.dumps: the sim sits in the hot path of the router benchmarks.
"""

from __future__ import annotations

import json
from typing import Any

from swaplab.sim.plan import TOKEN_PREFIX, Plan, answer_text

DONE = b"data: [DONE]\n\n"


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

    def closing(self) -> bytes:
        """The finish_reason event, the usage event when asked for, and [DONE]."""
        plan = self._plan
        reason = plan.finish_reason.encode()
        if plan.kind == "chat":
            finish = self._head + b'"delta":{},"logprobs":null,"finish_reason":"%b"}]}\n\n' % reason
        else:
            finish = self._head + b'"text":"","logprobs":null,"finish_reason":"%b"}]}\n\n' % reason
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


def whole_answer(plan: Plan, request_id: str, created: int) -> dict[str, Any]:
    """The non-streaming response body."""
    text = answer_text(plan.completion_tokens)
    if plan.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": plan.finish_reason,
        }
        object_name = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": plan.finish_reason}
        object_name = "text_completion"
    return {
        "id": request_id,
        "object": object_name,
        "created": created,
        "model": plan.model,
        "choices": [choice],
        "usage": usage_of(plan),
    }


def error_body(message: str, error_type: str, code: int) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
