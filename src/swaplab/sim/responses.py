"""The sim's answers in OpenAI's Responses wire format (/v1/responses), as ready-to-write bytes.

As vLLM 0.34.0 answers a model without a reasoning or tool parser (its "simple" path;
origins below are under vllm/entrypoints/openai/responses/). A stream is `event: NAME` and
`data: JSON` per event (api_router.py:33-45), every event numbered by `sequence_number`
from 0 (serving.py:1359-1369):

    response.created, response.in_progress       at once, before any token (serving.py:1381-1402)
    response.output_item.added,                  with the first text delta (streaming_events.py:839-873,
    response.content_part.added                    opened by the first delta, serving.py:1275-1282)
    response.output_text.delta                   one per token (streaming_events.py:894-912)
    response.output_text.done, response.content_part.done,
    response.output_item.done                    (streaming_events.py:915-958, serving.py:1287-1288)
    response.completed, or response.incomplete when the limit cut the answer (serving.py:1436-1457)

An answer of no tokens opens no item. The JSON keys are in the order vLLM's models dump them
(openai's event types; ResponsesResponse, protocol.py:905-1000). Like the OpenAI stream in
chunks.py, a token costs one bytes formatting of a template, not a json.dumps.

llama.cpp (xllamacpp 2026.10.11549, tools/server/server-task.cpp:1158-1290, 600-700) streams the
same event names but without `sequence_number`, `output_index` or `content_index`, sends
response.created and response.in_progress with the first token, keeps `status` "completed"
whatever the limit did (no response.incomplete), and its response objects carry only id,
object, created_at, status, model, output and usage. The sim answers as vLLM does.
"""

from __future__ import annotations

import json
from typing import Any

from swaplab.sim.chunks import ERROR_TYPES as OPENAI_ERROR_TYPES
from swaplab.sim.request import Plan
from swaplab.sim.tokens import TOKEN_PREFIX, answer_text

# vLLM's error types (vllm/entrypoints/serve/exception_handling/error_response.py:14-100);
# the sim's own statuses beyond those get the OpenAI route's.
ERROR_TYPES = {**OPENAI_ERROR_TYPES, 400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


def status_of(plan: Plan) -> str:
    """A response's status: "incomplete" when the limit cut it, else "completed", an abort included
    (utils.py:148-152, serving.py:795, 855-859)."""
    return "incomplete" if plan.finish_reason == "length" else "completed"


class ResponsesStreamEncoder:
    """The SSE events of one streamed Responses answer."""

    __slots__ = ("_plan", "_id", "_created", "_item_id", "_token_prefix", "_token_middle")

    def __init__(self, plan: Plan, request_id: str, created: int):
        self._plan = plan
        self._id = request_id
        self._created = created
        self._item_id = item_id_of(request_id)
        # A token's text is TOKEN_PREFIX and its index, its sequence number the index + 4
        # (created, in_progress, the item and its part come first): nothing needs JSON escaping.
        self._token_prefix = (
            b'event: response.output_text.delta\ndata: {"content_index":0,"delta":"' + TOKEN_PREFIX.encode()
        )
        self._token_middle = (
            b'","item_id":"%b","logprobs":[],"output_index":0,"sequence_number":' % self._item_id.encode()
        )

    def preamble(self) -> bytes:
        """response.created and response.in_progress: vLLM sends them before the first token."""
        response = _response(self._plan, self._id, self._created, status="in_progress", output=[], usage=None)
        return _event("response.created", response=response, sequence_number=0) + _event(
            "response.in_progress", response=response, sequence_number=1)

    def opening(self) -> bytes:
        """Nothing: the output item opens with its first delta (see `token`)."""
        return b""

    def token(self, index: int) -> bytes:
        """The output_text.delta carrying output token `index`; the first comes after its item's opening."""
        delta = b'%b%d%b%d,"type":"response.output_text.delta"}\n\n' % (
            self._token_prefix, index, self._token_middle, index + 4)
        return delta if index else self._item_opening() + delta

    def closing(self) -> bytes:
        """The text's, part's and item's done events (when there was an item), then the terminal event."""
        plan = self._plan
        done = b""
        sequence = 2
        output: list[dict[str, Any]] = []
        if plan.completion_tokens:
            text = answer_text(plan.completion_tokens)
            sequence = plan.completion_tokens + 4
            part = _text_part(text)
            item = _message_item(self._item_id, [part], status_of(plan))
            done = (
                _event("response.output_text.done", content_index=0, item_id=self._item_id, logprobs=[],
                       output_index=0, sequence_number=sequence, text=text)
                + _event("response.content_part.done", content_index=0, item_id=self._item_id, output_index=0,
                         part=part, sequence_number=sequence + 1)
                + _event("response.output_item.done", item=item, output_index=0, sequence_number=sequence + 2)
            )
            sequence += 3
            output = [item]
        status = status_of(plan)
        response = _response(plan, self._id, self._created, status=status, output=output, usage=_usage(plan))
        terminal = "response.incomplete" if status == "incomplete" else "response.completed"
        return done + _event(terminal, response=response, sequence_number=sequence)

    def _item_opening(self) -> bytes:
        item = _message_item(self._item_id, [], "in_progress")
        part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        return _event("response.output_item.added", item=item, output_index=0, sequence_number=2) + _event(
            "response.content_part.added", content_index=0, item_id=self._item_id, output_index=0, part=part,
            sequence_number=3)


def whole_response(plan: Plan, request_id: str, created: int) -> dict[str, Any]:
    """The non-streaming response body: a `response` object with one message item, its text empty
    of parts when no token came (serving.py:1068-1086)."""
    text = answer_text(plan.completion_tokens)
    item = _message_item(item_id_of(request_id), [_text_part(text)] if text else [], status_of(plan))
    return _response(plan, request_id, created, status=status_of(plan), output=[item], usage=_usage(plan))


def item_id_of(request_id: str) -> str:
    """The answer's message item id: vLLM's `msg_` prefix on the response's own number."""
    return "msg_" + request_id.removeprefix("resp_")


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error object (vllm/entrypoints/serve/engine/protocol.py:79-87) for a status the sim answers with."""
    return {"error": {"message": message, "type": ERROR_TYPES[status], "param": param, "code": status}}


def _text_part(text: str) -> dict[str, Any]:
    # A finished part has no logprobs unless asked for: null, where the opened part had [] (streaming_events.py:919-924).
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def _message_item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message"}


def _usage(plan: Plan) -> dict[str, Any]:
    # One turn, no reasoning or tools: the per-turn lists stay empty (serving.py:896-922, protocol.py:99-117).
    return {
        "input_tokens": plan.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": plan.cache_tokens, "cache_write_tokens": 0,
            "input_tokens_per_turn": [], "cached_tokens_per_turn": [],
        },
        "output_tokens": plan.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0, "tool_output_tokens": 0,
            "output_tokens_per_turn": [], "tool_output_tokens_per_turn": [],
        },
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
    }


def _response(
    plan: Plan, request_id: str, created: int, *, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    # ResponsesResponse's fields in order, with what from_request puts in them (protocol.py:905-1068):
    # the request's own settings, else vLLM's defaults (temperature and top_p 1.0, protocol.py:544-549).
    echoes = plan.echoes
    tools = echoes.get("tools", [])
    # Without tools, "auto" reads as "none" (protocol.py:876-880).
    tool_choice = echoes.get("tool_choice", "auto")
    if not tools and tool_choice == "auto":
        tool_choice = "none"
    return {
        "id": request_id,
        "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echoes.get("instructions"),
        "metadata": echoes.get("metadata"),
        "model": plan.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": echoes.get("parallel_tool_calls", True),
        "temperature": echoes.get("temperature", 1.0),
        "tool_choice": tool_choice,
        "tools": tools,
        "top_p": echoes.get("top_p", 1.0),
        "background": False,
        "max_output_tokens": echoes.get("max_output_tokens"),
        "max_tool_calls": echoes.get("max_tool_calls"),
        "previous_response_id": echoes.get("previous_response_id"),
        "prompt": None,
        "prompt_cache_options": echoes.get("prompt_cache_options"),
        "prompt_cache_key": echoes.get("prompt_cache_key"),
        "prompt_cache_retention": echoes.get("prompt_cache_retention"),
        "reasoning": echoes.get("reasoning"),
        "safety_identifier": echoes.get("safety_identifier"),
        "service_tier": echoes.get("service_tier", "auto"),
        "status": status,
        "text": echoes.get("text"),
        "top_logprobs": None,  # the sim gives no logprobs
        "truncation": echoes.get("truncation", "disabled"),
        "usage": usage,
        "user": echoes.get("user"),
        "presence_penalty": echoes.get("presence_penalty", 0.0),
        "frequency_penalty": echoes.get("frequency_penalty", 0.0),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _event(name: str, **data: Any) -> bytes:
    # The event's fields in openai's order (alphabetical) with `type` last, as vLLM dumps them.
    payload = json.dumps({**data, "type": name}, separators=(",", ":"))
    return b"event: %b\ndata: %b\n\n" % (name.encode(), payload.encode())
