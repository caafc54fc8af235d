"""The backend's OpenAI replies given back in Ollama's shapes (`reshape.Reshape`).

A stream becomes Ollama's newline-delimited JSON: a line per content, thinking or tool-call
delta (tool calls whole, as Ollama sends them), then a last line with `done`, `done_reason`
and the counts and durations, in nanoseconds, from the backend's `usage` and llama.cpp's
`timings` (measured here where the backend gave none). A non-streamed reply is one object.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

import orjson
from aiohttp import web

from swaplab.router.relay.keepalive import Dialect

NDJSON = "application/x-ndjson"
JSON = "application/json"
# OpenAI's finish reasons in Ollama's words: a reply that ends by calling a tool ends as "stop" there.
_DONE_REASONS = {"tool_calls": "stop", "function_call": "stop", "content_filter": "stop"}


_second: list[Any] = [None, ""]  # the last whole second formatted, for a stream's many lines within it


def timestamp(when: float | None = None) -> str:
    """Ollama's `created_at`: RFC 3339 with microseconds, in UTC."""
    when = time.time() if when is None else when
    second, fraction = divmod(when, 1.0)
    if _second[0] != second:
        moment = datetime.fromtimestamp(second, timezone.utc)
        _second[0], _second[1] = second, moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_second[1]}.{min(int(fraction * 1e6), 999999):06d}Z"


def error_response(status: int, message: str) -> web.Response:
    """Ollama's error answer: `{"error": MESSAGE}` (its clients raise it as ResponseError with the status)."""
    return web.json_response({"error": message}, status=status)


def _line(document: dict[str, Any]) -> bytes:
    return orjson.dumps(document) + b"\n"


class Reply:
    """What every Ollama reply shares: its framing, errors, timing; subclasses read the upstream's body."""

    dialect = Dialect.OLLAMA

    def __init__(self, model: str, path: str, streaming: bool, keep_alive: float | None):
        self.model = model
        """The name the client asked for, as Ollama echoes it."""
        self.path = path
        self.streaming = streaming
        self.keep_alive = keep_alive
        self.content_type = NDJSON if streaming else JSON
        self.load_seconds = 0.0
        self.status = 200
        """A whole reply's status: an error the upstream reported mid-stream makes it 502."""
        self.started = time.perf_counter()
        self._body = bytearray()

    def accepts(self, status: int, content_type: str) -> bool:
        return status == 200 and content_type in ("text/event-stream", JSON)

    def feed(self, chunk: bytes) -> bytes:
        self._body += chunk
        return b""

    def finish(self) -> bytes:
        raise NotImplementedError

    def error(self, message: str) -> bytes:
        return json.dumps({"error": message}).encode() + b"\n"

    def error_response(self, status: int, message: str) -> web.Response:
        return error_response(status, message)

    def heartbeat(self) -> bytes:
        return b""

    def loading(self, text: str) -> bytes:
        return b""

    def durations(self) -> dict[str, int]:
        return {
            "total_duration": round((time.perf_counter() - self.started) * 1e9),
            "load_duration": round(self.load_seconds * 1e9),
        }

    def _whole(self) -> dict[str, Any]:
        try:
            document = orjson.loads(bytes(self._body))
        except orjson.JSONDecodeError:
            document = None
        if not isinstance(document, dict):
            raise ValueError("the backend's reply is not a JSON object")
        return document


class ChatReply(Reply):
    """`/api/chat` (`message`) and `/api/generate` (`response`, `thinking`) from a chat or completions reply."""

    def __init__(self, model: str, path: str, streaming: bool, keep_alive: float | None, *, generate: bool = False):
        super().__init__(model, path, streaming, keep_alive)
        self.generate = generate
        self._events = False
        self._pending = b""
        self._calls: dict[int, dict[str, str]] = {}
        self._done_reason = "stop"
        self._usage: dict[str, Any] = {}
        self._timings: dict[str, Any] = {}
        self._first_at: float | None = None
        self._last_at = 0.0
        self._failed = False
        self._error = ""
        self._logprobs: list[dict[str, Any]] = []
        self._text: list[str] = []
        self._thoughts: list[str] = []
        """A stream read for a client that asked for one object: its pieces, joined at the end."""

    def accepts(self, status: int, content_type: str) -> bool:
        self._events = content_type == "text/event-stream"
        return super().accepts(status, content_type)

    # -- the lines of a reply ---------------------------------------------------------

    def _chunk(self, content: str = "", thinking: str = "", calls: list[dict[str, Any]] | None = None,
               done: bool = False) -> dict[str, Any]:
        document: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.generate:
            document["response"] = content
            if thinking:
                document["thinking"] = thinking
        else:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            document["message"] = message
        document["done"] = done
        return document

    def heartbeat(self) -> bytes:
        return _line(self._chunk())

    def loading(self, text: str) -> bytes:
        return _line(self._chunk(thinking=text))

    def _final(self, content: str = "", thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        document = self._chunk(content, thinking, calls, done=True)
        document["done_reason"] = self._done_reason
        document.update(self.durations())
        prompt = _count(self._usage.get("prompt_tokens"), self._timings.get("prompt_n"))
        if prompt is not None:
            document["prompt_eval_count"] = prompt
        if isinstance(self._timings.get("prompt_ms"), (int, float)):
            document["prompt_eval_duration"] = round(self._timings["prompt_ms"] * 1e6)
        elif self._first_at is not None:  # measured: from the request's admission to its first token
            document["prompt_eval_duration"] = round((self._first_at - self.started - self.load_seconds) * 1e9)
        output = _count(self._usage.get("completion_tokens"), self._timings.get("predicted_n"))
        if output is not None:
            document["eval_count"] = output
        if isinstance(self._timings.get("predicted_ms"), (int, float)):
            document["eval_duration"] = round(self._timings["predicted_ms"] * 1e6)
        elif self._first_at is not None and self._last_at > self._first_at:
            document["eval_duration"] = round((self._last_at - self._first_at) * 1e9)
        elif output:  # a whole reply without timings: its time from admission, prefill included
            document["eval_duration"] = round((time.perf_counter() - self.started - self.load_seconds) * 1e9)
        if self._logprobs and not self.streaming:
            document["logprobs"] = self._logprobs
        return document

    # -- reading the upstream -----------------------------------------------------------

    def feed(self, chunk: bytes) -> bytes:
        if not self._events:
            return super().feed(chunk)
        data = self._pending + chunk
        events = data.split(b"\n\n")
        self._pending = events.pop()
        lines = [line for event in events for line in self._event(event)]
        return b"".join(lines)

    def _event(self, event: bytes) -> list[bytes]:
        if event.startswith(b"data: ") and b"\n" not in event:  # one data line: almost every event
            payload = event[6:].strip()
        else:
            payload = b"".join(line[5:].strip() for line in event.replace(b"\r\n", b"\n").split(b"\n")
                               if line.startswith(b"data:"))
        if not payload or payload == b"[DONE]" or self._failed:
            return []
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(document, dict):
            return []
        if document.get("error") is not None:
            self._failed = True
            self.status = 502
            self._error = _message(document["error"])
            return [self.error(self._error)] if self.streaming else []
        self._note(document)
        out = []
        for choice in document.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            content, thought, called = self._delta(choice)
            self._logprobs += _logprobs(choice)
            if content or thought or called:
                now = time.perf_counter()
                if self._first_at is None:
                    self._first_at = now
                self._last_at = now
            if content or thought:
                if self.streaming:
                    out.append(_line(self._chunk(content, thought)))
                else:
                    self._text.append(content)
                    self._thoughts.append(thought)
        return out

    def _note(self, document: dict[str, Any]) -> None:
        if isinstance(document.get("usage"), dict):
            self._usage = document["usage"]
        if isinstance(document.get("timings"), dict):
            self._timings = document["timings"]

    def _delta(self, choice: dict[str, Any]) -> tuple[str, str, bool]:
        """A streamed choice's text, thinking, and whether it carried a piece of a tool call (its pieces
        and its finish reason are kept)."""
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self._done_reason = _DONE_REASONS.get(reason, reason)
        delta = choice.get("delta")
        if not isinstance(delta, dict):  # a completion's chunk
            text = choice.get("text")
            return (text if isinstance(text, str) else ""), "", False
        pieces = delta.get("tool_calls") or ()
        for piece in pieces:
            if not isinstance(piece, dict):
                continue
            call = self._calls.setdefault(_index(piece, len(self._calls)), {"id": "", "name": "", "arguments": ""})
            function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
            if isinstance(piece.get("id"), str):
                call["id"] = piece["id"]
            if isinstance(function.get("name"), str):
                call["name"] += function["name"]
            if isinstance(function.get("arguments"), str):
                call["arguments"] += function["arguments"]
        content = delta.get("content")
        thought = delta.get("reasoning_content") or delta.get("reasoning")
        return (content if isinstance(content, str) else ""), (thought if isinstance(thought, str) else ""), bool(pieces)

    def finish(self) -> bytes:
        if self._events:
            lines = self._event(self._pending) if self._pending.strip() else []
            if self._failed:
                return b"".join(lines) if self.streaming else orjson.dumps({"error": self._error})
            calls = _tool_calls(self._calls)
            if not self.streaming:  # the client asked for one object: the stream read, answered whole
                return orjson.dumps(self._final("".join(self._text), "".join(self._thoughts), calls))
            if calls:
                lines.append(_line(self._chunk(calls=calls)))
            lines.append(_line(self._final()))
            return b"".join(lines)
        try:
            document = self._whole()
        except ValueError as error:
            return self.error(str(error)) if self.streaming else orjson.dumps({"error": str(error)})
        self._note(document)
        content, thought, calls = "", "", []
        for choice in document.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._done_reason = _DONE_REASONS.get(reason, reason)
            message = choice.get("message")
            if isinstance(message, dict):
                content = message.get("content") or ""
                thought = message.get("reasoning_content") or message.get("reasoning") or ""
                calls = _tool_calls({
                    index: {"id": call.get("id") or "", "name": (call.get("function") or {}).get("name") or "",
                            "arguments": (call.get("function") or {}).get("arguments") or ""}
                    for index, call in enumerate(message.get("tool_calls") or ()) if isinstance(call, dict)
                })
            elif isinstance(choice.get("text"), str):
                content = choice["text"]
            self._logprobs += _logprobs(choice)
            break
        final = self._final(content if isinstance(content, str) else "", thought if isinstance(thought, str) else "", calls)
        return _line(final) if self.streaming else orjson.dumps(final)


class EmbedReply(Reply):
    """`/api/embed` (`embeddings`, counts and durations) or `/api/embeddings` (`embedding`) from `/v1/embeddings`."""

    def __init__(self, model: str, path: str, keep_alive: float | None, *, legacy: bool):
        super().__init__(model, path, False, keep_alive)
        self.legacy = legacy

    def accepts(self, status: int, content_type: str) -> bool:
        return status == 200 and content_type == JSON

    def finish(self) -> bytes:
        try:
            document = self._whole()
        except ValueError as error:
            return orjson.dumps({"error": str(error)})
        rows = [row for row in document.get("data") or () if isinstance(row, dict)]
        rows.sort(key=lambda row: row.get("index", 0) if isinstance(row.get("index"), int) else 0)
        vectors = [row.get("embedding") or [] for row in rows]
        if self.legacy:
            return orjson.dumps({"embedding": vectors[0] if vectors else []})
        out: dict[str, Any] = {"model": self.model, "embeddings": vectors, **self.durations()}
        usage = document.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            out["prompt_eval_count"] = usage["prompt_tokens"]
        return orjson.dumps(out)


def _tool_calls(calls: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    """Accumulated OpenAI tool calls as Ollama's: arguments an object (a model's unreadable ones: empty)."""
    out = []
    for index in sorted(calls):
        call = calls[index]
        try:
            arguments = orjson.loads(call["arguments"]) if call["arguments"].strip() else {}
        except orjson.JSONDecodeError:
            arguments = {}
        function: dict[str, Any] = {"index": index, "name": call["name"],
                                    "arguments": arguments if isinstance(arguments, dict) else {}}
        entry: dict[str, Any] = {"function": function}
        if call["id"]:
            entry["id"] = call["id"]
        out.append(entry)
    return out


def _logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content` as Ollama's `logprobs`: token, logprob and the top alternatives."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return []
    out = []
    for entry in content:
        if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            continue
        item: dict[str, Any] = {"token": entry["token"], "logprob": entry.get("logprob", 0.0)}
        top = [{"token": alt.get("token", ""), "logprob": alt.get("logprob", 0.0)}
               for alt in entry.get("top_logprobs") or () if isinstance(alt, dict)]
        if top:
            item["top_logprobs"] = top
        out.append(item)
    return out


def _count(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _index(piece: dict[str, Any], default: int) -> int:
    index = piece.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else default


def _message(error: Any) -> str:
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    try:
        return orjson.dumps(error).decode()
    except orjson.JSONEncodeError:
        return "the backend reported an error"
