"""Reading OpenAI answers into a `RequestResult`: SSE streams chunk by chunk, whole bodies at once.

Pure code over bytes and dicts; the HTTP side (`swaplab.client.http`) feeds it with the
time each piece of the body arrived.
"""

from __future__ import annotations

import json
from typing import Any

from swaplab.client.result import RequestResult

ERROR_TEXT_CHARS = 300
_loads = json.loads


class StreamAssembler:
    """Feeds SSE bytes into one `RequestResult`; `close()` settles what the end of the stream means."""

    __slots__ = ("_data", "_on_token", "_pending", "_reasoning", "_text", "_tools", "done", "result")

    def __init__(self, result: RequestResult, on_token=None):
        self.result = result
        self.done = False  # `data: [DONE]` arrived
        self._pending = b""  # an incomplete line carried to the next read
        self._data: list[bytes] = []  # data lines of the event being read
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tools: dict[int, dict[str, Any]] = {}
        self._on_token = on_token

    def feed(self, data: bytes, now: float) -> None:
        """Bytes of the body as they arrived at `now`; complete events are handled at once."""
        if self._pending:
            data = self._pending + data
        lines = data.split(b"\n")
        self._pending = lines.pop()  # b"" when the data ended on a newline
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:  # a blank line ends the event
                if self._data:
                    payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                    self._data = []
                    self._event(payload, now)
            elif line.startswith(b"data:"):
                payload = line[5:]
                self._data.append(payload[1:] if payload.startswith(b" ") else payload)
            # Comments (":"), `event:`, `id:` and `retry:` lines carry nothing for us.

    def _event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = _loads(payload)
        except ValueError:
            self.result.error = f"unreadable stream event: {payload[:80]!r}"
            return
        if not isinstance(chunk, dict):
            return
        result = self.result
        if "error" in chunk:  # vLLM, llama.cpp and routers end a failed stream with an error event
            result.error = error_text(chunk)
            return
        usage = chunk.get("usage")
        if usage:
            result.usage = usage
        timings = chunk.get("timings")
        if timings:
            result.timings = timings
        token = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if delta is None:  # completions: the text is on the choice itself
                delta = choice
            content = delta.get("content")
            if content is None:
                content = delta.get("text")
            if content:
                self._text.append(content)
                token = True
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self._reasoning.append(reasoning)
                token = True
            tool_calls = delta.get("tool_calls")
            if tool_calls:
                self._tool_deltas(tool_calls)
                token = True
            finish = choice.get("finish_reason")
            if finish:
                result.finish_reason = finish
        if token:
            result.token_times.append(now)
            if self._on_token is not None:
                self._on_token()

    def _tool_deltas(self, deltas: list[dict[str, Any]]) -> None:
        # A tool call arrives in pieces keyed by index: id, type and name first, then
        # fragments of the arguments' JSON text.
        for position, delta in enumerate(deltas):
            index = delta.get("index", position)
            call = self._tools.get(index)
            if call is None:
                call = self._tools[index] = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            if delta.get("id"):
                call["id"] = delta["id"]
            if delta.get("type"):
                call["type"] = delta["type"]
            function = delta.get("function") or {}
            if function.get("name"):
                call["function"]["name"] += function["name"]
            if function.get("arguments"):
                call["function"]["arguments"] += function["arguments"]

    def close(self, now: float) -> RequestResult:
        """The body ended (or broke) at `now`: assemble the answer and say whether it was complete."""
        if self._pending:
            self.feed(b"\n\n", now)  # a last event without its blank line still counts
        elif self._data:
            self.feed(b"\n", now)
        result = self.result
        result.end_at = now
        result.text = "".join(self._text)
        result.reasoning = "".join(self._reasoning)
        result.tool_calls = [self._tools[index] for index in sorted(self._tools)]
        apply_usage(result, result.usage)
        if result.error is None and not self.done and result.finish_reason is None:
            result.error = "the stream ended before the answer did (no finish_reason, no [DONE])"
        return result


def read_whole_answer(result: RequestResult, document: Any, now: float) -> RequestResult:
    """A non-streamed answer (chat or completions) into `result`."""
    result.end_at = now
    if not isinstance(document, dict):
        result.error = "the answer is not a JSON object"
        return result
    if "error" in document:
        result.error = error_text(document)
        return result
    choices = document.get("choices") or []
    if choices:
        choice = choices[0]
        message = choice.get("message")
        if message is None:
            result.text = choice.get("text") or ""
        else:
            result.text = message.get("content") or ""
            result.reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            result.tool_calls = list(message.get("tool_calls") or [])
        result.finish_reason = choice.get("finish_reason")
    result.usage = document.get("usage")
    result.timings = document.get("timings")
    apply_usage(result, result.usage)
    return result


def apply_usage(result: RequestResult, usage: dict[str, Any] | None) -> None:
    """OpenAI's usage object (and its cached / reasoning details) onto the result's counts."""
    if not usage:
        return
    result.prompt_tokens = _integer(usage.get("prompt_tokens"))
    result.completion_tokens = _integer(usage.get("completion_tokens"))
    result.cached_tokens = _integer(_nested(usage, "prompt_tokens_details", "cached_tokens"))
    result.reasoning_tokens = _integer(_nested(usage, "completion_tokens_details", "reasoning_tokens"))


def error_text(document: Any) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message"}}`, `{"error": "..."}`, `{"detail"}`)."""
    if isinstance(document, dict):
        error = document.get("error", document)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                value = error.get(key)
                if isinstance(value, str) and value:
                    return value[:ERROR_TEXT_CHARS]
        elif isinstance(error, str) and error:
            return error[:ERROR_TEXT_CHARS]
        detail = document.get("detail")
        if isinstance(detail, str) and detail:
            return detail[:ERROR_TEXT_CHARS]
    return json.dumps(document)[:ERROR_TEXT_CHARS]


def _nested(document: dict[str, Any], outer: str, inner: str) -> Any:
    value = document.get(outer)
    return value.get(inner) if isinstance(value, dict) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
