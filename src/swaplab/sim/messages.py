"""The sim's answers in Anthropic's Messages wire format (/v1/messages), as ready-to-write bytes.

Like the OpenAI stream in chunks.py, a token costs one bytes formatting of a
template, not a json.dumps: the sim sits in the hot path of the router benchmarks.
"""

from __future__ import annotations

import json
from typing import Any

from swaplab.sim.request import Plan
from swaplab.sim.tokens import TOKEN_PREFIX, answer_text

# The plan speaks OpenAI's finish reasons; Anthropic calls them stop reasons.
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn", "abort": "end_turn"}
# The error types Anthropic documents for the statuses the sim answers with.
ERROR_TYPES = {400: "invalid_request_error", 503: "overloaded_error"}

# Every Messages answer is one text block at index 0, so a token's event is the same
# bytes for every request but for its index; its text needs no JSON escaping.
_TOKEN_PREFIX = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"' + TOKEN_PREFIX.encode()
)
_TOKEN_SUFFIX = b'"}}\n\n'
_BLOCK_START = b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
_BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


class MessagesStreamEncoder:
    """The SSE events of one streamed Messages answer."""

    __slots__ = ("_plan", "_id")

    def __init__(self, plan: Plan, request_id: str):
        self._plan = plan
        self._id = request_id

    def opening(self) -> bytes:
        """message_start and the text block's start; they go out with the first token."""
        # output_tokens 1, as Anthropic's message_start counts the token that comes with it.
        message = _message(self._plan, self._id, [], None, min(1, self._plan.completion_tokens))
        return _event("message_start", {"type": "message_start", "message": message}) + _BLOCK_START

    def token(self, index: int) -> bytes:
        """The content_block_delta carrying output token `index`."""
        return b"%b%d%b" % (_TOKEN_PREFIX, index, _TOKEN_SUFFIX)

    def closing(self) -> bytes:
        """The block's stop, message_delta with the stop reason and the output count, message_stop."""
        plan = self._plan
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[plan.finish_reason], "stop_sequence": None},
            "usage": {"output_tokens": plan.completion_tokens},
        }
        return _BLOCK_STOP + _event("message_delta", delta) + _MESSAGE_STOP


def whole_message(plan: Plan, request_id: str) -> dict[str, Any]:
    """The non-streaming response body: a `message` object."""
    content = [{"type": "text", "text": answer_text(plan.completion_tokens)}]
    return _message(plan, request_id, content, STOP_REASONS[plan.finish_reason], plan.completion_tokens)


def error_body(status: int, message: str) -> dict[str, Any]:
    """An Anthropic-style error object for an HTTP status the sim answers with."""
    return {"type": "error", "error": {"type": ERROR_TYPES[status], "message": message}}


def _message(
    plan: Plan, request_id: str, content: list[dict[str, Any]], stop_reason: str | None, output_tokens: int
) -> dict[str, Any]:
    # In the order Anthropic's documentation shows a message's fields.
    return {
        "id": request_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": plan.model,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": plan.prompt_tokens, "output_tokens": output_tokens},
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: %b\ndata: %b\n\n" % (name.encode(), json.dumps(data, separators=(",", ":")).encode())
