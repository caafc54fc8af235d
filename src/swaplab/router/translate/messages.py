"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over chat completions.

The request: `system` becomes the first message (system messages among `messages`, as Claude Code
sends its environment, join it: chat templates take one, first); content blocks become OpenAI parts (text,
images as data or URLs); an assistant's `tool_use` blocks its `tool_calls`, a user's
`tool_result` blocks `tool` messages (before the rest of that turn, as Anthropic orders
them); `tools`, `tool_choice`, `stop_sequences`, `max_tokens` and sampling map one to one.
Thinking blocks sent back are dropped (a chat template cannot take them back in). Server tools
(`web_search_...`, typed tools the API itself runs) are left out: nothing here runs them; so are
tools with `defer_loading` (the API shows them to the model only once it searched for them).

The reply: Anthropic's event order (`message_start`, per block `content_block_start`,
deltas, `content_block_stop`, then `message_delta` with the stop reason and usage, and
`message_stop`); reasoning as a `thinking` block, text as `text`, each tool call as
`tool_use` with `input_json_delta`s. Input tokens are known only at the end of a chat stream,
so `message_start` says 0 and `message_delta` carries the count (the SDKs take it from there).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from swaplab.router.relay.keepalive import Dialect, error_event
from swaplab.router.translate.common import (
    BadRequest,
    ChatReader,
    arguments_object,
    copy_sampling,
    fresh_id,
    sse,
    text_of,
    usage_numbers,
)

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
               529: "overloaded_error"}


def error_response(status: int, message: str) -> web.Response:
    """Anthropic's error answer: `{"type": "error", "error": {"type", "message"}}`."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


# -- the request --------------------------------------------------------------------------


def chat_request(document: dict[str, Any]) -> dict[str, Any]:
    """The chat completion a Messages request asks for."""
    conversation = document.get("messages")
    if not isinstance(conversation, list):
        raise BadRequest("messages: expected a list of messages")
    chat: list[dict[str, Any]] = []
    system = [text_of(document["system"], "system")] if document.get("system") else []
    for number, message in enumerate(conversation):
        if isinstance(message, dict) and message.get("role") == "system":
            # Claude Code sends its environment as a system message after the first user turn; chat
            # templates take a system message only first, so it joins the system prompt.
            system.append(text_of(message.get("content"), f"messages[{number}].content"))
            continue
        chat += _message(message, f"messages[{number}]")
    if system:
        chat.insert(0, {"role": "system", "content": "\n\n".join(system)})
    out: dict[str, Any] = {"model": document.get("model"), "messages": chat}
    if isinstance(document.get("max_tokens"), int):
        out["max_tokens"] = document["max_tokens"]
    if document.get("stop_sequences"):
        out["stop"] = document["stop_sequences"]
    copy_sampling(document, out, ("temperature", "top_p", "top_k"))
    tools = [_tool(tool, f"tools[{number}]") for number, tool in enumerate(document.get("tools") or ())]
    tools = [tool for tool in tools if tool is not None]
    if tools:
        out["tools"] = tools
        choice = document.get("tool_choice")
        if isinstance(choice, dict):
            kind = choice.get("type")
            if kind == "any":
                out["tool_choice"] = "required"
            elif kind == "tool":
                out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
            elif kind in ("auto", "none"):
                out["tool_choice"] = kind
            if choice.get("disable_parallel_tool_use") is True:
                out["parallel_tool_calls"] = False
    if document.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def count_request(document: dict[str, Any]) -> dict[str, Any]:
    """`count_tokens` as a one-token chat completion, whose `usage` counts the prompt."""
    chat = chat_request({**document, "stream": False})
    chat["max_tokens"] = 1
    return chat


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise BadRequest(f"{where}: expected an object with role 'user' or 'assistant'")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: expected a string or a list of content blocks")
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for number, block in enumerate(content):
        place = f"{where}.content[{number}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": text_of(block.get("text"), place)})
        elif kind == "image":
            parts.append(_image(block, place))
        elif kind == "document":
            source = block.get("source") if isinstance(block.get("source"), dict) else {}
            if source.get("type") != "text":
                raise BadRequest(f"{place}: only text documents can be sent to a chat completion")
            parts.append({"type": "text", "text": text_of(source.get("data"), place)})
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": block.get("id") or fresh_id("toolu_"), "type": "function",
                          "function": {"name": block.get("name") or "",
                                       "arguments": orjson.dumps(block.get("input") or {}).decode()}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "",
                            "content": _result_text(block, place)})
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise BadRequest(f"{place}: a {kind!r} block cannot be sent in a message of role {role!r}")
    out: list[dict[str, Any]] = list(results)
    if role == "assistant":
        text = "".join(part["text"] for part in parts if part["type"] == "text")
        if text or calls:
            turn: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
    elif parts:
        if all(part["type"] == "text" for part in parts):
            out.append({"role": "user", "content": "\n".join(part["text"] for part in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type') or 'image/png'};base64,{source.get('data') or ''}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise BadRequest(f"{where}: an image's source must be base64 data or a url")
    return {"type": "image_url", "image_url": {"url": url}}


def _result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if isinstance(content, list):
        content = [part for part in content if not (isinstance(part, dict) and part.get("type") == "image")]
    text = text_of(content, where)
    return f"Error: {text}" if block.get("is_error") is True else text


def _tool(tool: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise BadRequest(f"{where}: expected an object with a name")
    if tool.get("type") not in (None, "custom") or tool.get("defer_loading") is True:
        return None  # a server tool (the API itself would run it), or one the model is shown only once searched for
    function: dict[str, Any] = {"name": tool["name"],
                                "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


# -- the reply ----------------------------------------------------------------------------


class MessagesReply(ChatReader):
    """A chat completion's reply as a Messages answer: Anthropic's events, or one `message` object."""

    dialect = Dialect.ANTHROPIC

    def __init__(self, model: str, path: str, request: dict[str, Any]):
        super().__init__(path, request.get("stream") is True)
        self.model = model
        self.id = fresh_id("msg_")
        self._started = False
        self._index = -1
        self._open: tuple[str, int] | None = None  # the block being streamed: its kind ("text", "thinking", "tool N")
        self._blocks: list[dict[str, Any]] = []
        self._tools: dict[int, int] = {}  # tool call index -> its block

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None, output: int, input_: int) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content, "model": self.model,
                "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": input_, "output_tokens": output}}

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return sse("message_start", {"type": "message_start", "message": self._message([], None, 0, 0)})

    def _block(self, kind: str, block: dict[str, Any]) -> bytes:
        """Close the open block and open a new one, unless `kind` is the open one's."""
        if self._open is not None and self._open[0] == kind:
            return b""
        out = self._start() + self._close_block()
        self._index += 1
        self._open = (kind, self._index)
        self._blocks.append(block)
        if self.streaming:
            start = {**block, "input": {}} if block["type"] == "tool_use" else {**block}
            out += sse("content_block_start", {"type": "content_block_start", "index": self._index,
                                               "content_block": start})
        return out

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        index = self._open[1]
        self._open = None
        if not self.streaming:
            return b""
        return sse("content_block_stop", {"type": "content_block_stop", "index": index})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        if not self.streaming:
            return b""
        return sse("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def text(self, piece: str) -> bytes:
        out = self._block("text", {"type": "text", "text": ""})
        self._blocks[-1]["text"] += piece
        return out + self._delta({"type": "text_delta", "text": piece})

    def thought(self, piece: str) -> bytes:
        out = self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self._blocks[-1]["thinking"] += piece
        return out + self._delta({"type": "thinking_delta", "thinking": piece})

    def tool_call(self, index: int, call: dict[str, Any], arguments: str) -> bytes:
        out = b""
        if index not in self._tools:
            out = self._block(f"tool {index}", {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}})
            self._tools[index] = len(self._blocks) - 1
        block = self._blocks[self._tools[index]]
        block["name"] = call["name"]
        block["_arguments"] = call["arguments"]
        if arguments and self._open == (f"tool {index}", self._index):
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def closing(self) -> bytes:
        prompt, output, _ = usage_numbers(self.usage)
        stop = STOP_REASONS.get(self.finish_reason or "stop", "end_turn")
        for block in self._blocks:
            if block["type"] == "tool_use":
                value = arguments_object(block.pop("_arguments", ""))
                block["input"] = value if isinstance(value, dict) else {}
        if not self.streaming:
            return orjson.dumps(self._message(self._blocks, stop, output, prompt))
        out = self._start() + self._close_block()
        out += sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"input_tokens": prompt, "output_tokens": output}})
        return out + sse("message_stop", {"type": "message_stop"})

    def error(self, message: str) -> bytes:
        return error_event(message, Dialect.ANTHROPIC)

    def whole_error(self) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": "api_error", "message": self.failure}})

    def error_response(self, status: int, message: str) -> web.Response:
        return error_response(status, message)


class CountReply(ChatReader):
    """`count_tokens`: the one-token completion's prompt count, as `{"input_tokens": N}`."""

    dialect = Dialect.ANTHROPIC

    def __init__(self, path: str):
        super().__init__(path, False)

    def text(self, piece: str) -> bytes:
        return b""

    def thought(self, piece: str) -> bytes:
        return b""

    def tool_call(self, index: int, call: dict[str, Any], arguments: str) -> bytes:
        return b""

    def closing(self) -> bytes:
        prompt, _, _ = usage_numbers(self.usage)
        return orjson.dumps({"input_tokens": prompt})

    def error(self, message: str) -> bytes:
        return b""

    def whole_error(self) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": "api_error", "message": self.failure}})

    def error_response(self, status: int, message: str) -> web.Response:
        return error_response(status, message)
