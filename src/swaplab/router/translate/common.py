"""What both translations share: reading a chat completion's reply, streamed or whole.

`ChatReader` parses the backend's OpenAI chat stream (SSE `data:` events, comments and
`[DONE]` skipped) or its whole JSON answer into calls of a few methods (`text`, `thought`,
`tool_call`, `finished`) that each reply shape implements, and keeps the usage and the
finish reason. The bytes the client gets are whatever those methods return.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from aiohttp import web

from swaplab.router.relay.keepalive import HEARTBEATS, Dialect

CHAT_PATH = "/v1/chat/completions"
JSON = "application/json"
EVENT_STREAM = "text/event-stream"


class BadRequest(ValueError):
    """A request that cannot be translated; its message says why (a 400)."""


def fresh_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def sse(name: str, data: dict[str, Any]) -> bytes:
    """One typed server-sent event, as Anthropic's and OpenAI's Responses streams frame them."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def text_of(content: Any, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A content that must be text: a string, or a list of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict) and part.get("type") in kinds and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}: a part of type {kind!r} where only text can go")
        return "\n".join(pieces)
    raise BadRequest(f"{where}: expected a string or a list of text parts, got {type(content).__name__}")


def arguments_object(text: str) -> Any:
    """A tool call's arguments as the object the model meant (an unreadable string: {})."""
    if not text.strip():
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value


def copy_sampling(document: dict[str, Any], out: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if document.get(name) is not None:
            out[name] = document[name]


class ChatReader:
    """Reads one chat completion reply; subclasses say what each piece becomes for their client."""

    dialect: Dialect
    content_type_streaming: str = EVENT_STREAM

    def __init__(self, path: str, streaming: bool):
        self.path = path
        self.streaming = streaming
        self.content_type = self.content_type_streaming if streaming else JSON
        self.keep_alive: float | None = None
        self.load_seconds = 0.0
        self.status = 200
        self.created = int(time.time())
        self.usage: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.failure = ""
        self._events = False
        self._pending = b""
        self._body = bytearray()
        self._calls: dict[int, dict[str, Any]] = {}

    # -- Reshape's protocol -----------------------------------------------------------

    def accepts(self, status: int, content_type: str) -> bool:
        self._events = content_type == EVENT_STREAM
        return status == 200 and content_type in (EVENT_STREAM, JSON)

    def feed(self, chunk: bytes) -> bytes:
        if not self._events:
            self._body += chunk
            return b""
        data = self._pending + chunk
        if b"\r\n" in data:
            data = data.replace(b"\r\n", b"\n")
        events = data.split(b"\n\n")
        self._pending = events.pop()
        return b"".join(self._event(event) for event in events)

    def finish(self) -> bytes:
        if self._events:
            out = self._event(self._pending) if self._pending.strip() else b""
            if self.failure:
                return out if self.streaming else self.whole_error()
            return out + self.closing()
        try:
            document = orjson.loads(bytes(self._body))
        except orjson.JSONDecodeError:
            document = None
        if not isinstance(document, dict):
            self.failure = "the backend's reply is not a JSON object"
            self.status = 502
            return self.error(self.failure) if self.streaming else self.whole_error()
        self._note(document)
        for choice in document.get("choices") or ():
            if isinstance(choice, dict):
                message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
                thought = message.get("reasoning_content") or message.get("reasoning")
                if isinstance(thought, str) and thought:
                    self.thought(thought)
                if isinstance(message.get("content"), str) and message["content"]:
                    self.text(message["content"])
                for index, call in enumerate(message.get("tool_calls") or ()):
                    if isinstance(call, dict):
                        function = call.get("function") if isinstance(call.get("function"), dict) else {}
                        arguments = function.get("arguments") if isinstance(function.get("arguments"), str) else ""
                        self._calls[index] = {"id": call.get("id") or fresh_id("call_"),
                                              "name": function.get("name") or "", "arguments": arguments}
                        self.tool_call(index, self._calls[index], arguments)
                if isinstance(choice.get("finish_reason"), str):
                    self.finish_reason = choice["finish_reason"]
                break
        return self.closing()

    def heartbeat(self) -> bytes:
        return HEARTBEATS[self.dialect]

    def loading(self, text: str) -> bytes:
        return self.heartbeat()

    # -- what subclasses implement --------------------------------------------------------

    def text(self, piece: str) -> bytes:
        raise NotImplementedError

    def thought(self, piece: str) -> bytes:
        raise NotImplementedError

    def tool_call(self, index: int, call: dict[str, Any], arguments: str) -> bytes:
        """A piece of tool call `index`: `call` holds its id, name and arguments so far (`arguments`, the new
        piece, included)."""
        raise NotImplementedError

    def closing(self) -> bytes:
        """The last events of a stream (or the whole answer) once the backend's reply is complete."""
        raise NotImplementedError

    def error(self, message: str) -> bytes:
        raise NotImplementedError

    def whole_error(self) -> bytes:
        raise NotImplementedError

    def error_response(self, status: int, message: str) -> web.Response:
        raise NotImplementedError

    # -- reading the backend's stream ------------------------------------------------------

    def _event(self, event: bytes) -> bytes:
        if event.startswith(b"data: ") and b"\n" not in event:
            payload = event[6:].strip()
        else:
            payload = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not payload or payload == b"[DONE]" or self.failure:
            return b""
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(document, dict):
            return b""
        if document.get("error") is not None:
            error = document["error"]
            self.failure = error.get("message") if isinstance(error, dict) and isinstance(error.get("message"), str) \
                else str(error)
            self.status = 502
            return self.error(self.failure) if self.streaming else b""
        self._note(document)
        out = []
        for choice in document.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                out.append(self.thought(thought))
            if isinstance(delta.get("content"), str) and delta["content"]:
                out.append(self.text(delta["content"]))
            for piece in delta.get("tool_calls") or ():
                if isinstance(piece, dict):
                    out.append(self._tool_piece(piece))
            if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                self.finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _tool_piece(self, piece: dict[str, Any]) -> bytes:
        index = piece.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = len(self._calls) - (0 if isinstance(piece.get("id"), str) and piece["id"] else 1)
            index = max(index, 0)
        function = piece.get("function") if isinstance(piece.get("function"), dict) else {}
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = {"id": piece.get("id") or fresh_id("call_"), "name": "", "arguments": ""}
        if isinstance(function.get("name"), str):
            call["name"] += function["name"]
        arguments = function.get("arguments") if isinstance(function.get("arguments"), str) else ""
        call["arguments"] += arguments
        return self.tool_call(index, call, arguments)

    def _note(self, document: dict[str, Any]) -> None:
        if isinstance(document.get("usage"), dict):
            self.usage = document["usage"]


def usage_numbers(usage: dict[str, Any]) -> tuple[int, int, int]:
    """Prompt, completion and cached prompt tokens of a chat completion's `usage` (0 where absent)."""
    def number(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    return number(usage.get("prompt_tokens")), number(usage.get("completion_tokens")), number(details.get("cached_tokens"))
