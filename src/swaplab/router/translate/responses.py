"""OpenAI's Responses API (`/v1/responses`) over chat completions, statelessly.

The request: `instructions` and every `system` or `developer` message become the one system
message, first (chat templates take no other); `input` (a string, or items) becomes the
conversation: messages, `function_call` items
as an assistant's `tool_calls` (consecutive calls joined in one turn), `function_call_output`
as `tool` messages; `reasoning` items are dropped. Function tools map one to one; a custom
(free-form) tool, as Codex's `apply_patch` is, becomes a function with one string argument,
`input`, and its calls come back as `custom_tool_call` items; hosted tools (web search) and
Codex's `namespace` groups are left out. `text.format` becomes
`response_format`. Nothing is stored: a `previous_response_id` is refused, saying to send the
whole conversation (Codex does, with `store: false`).

The reply: the Responses event order (`response.created`, `response.in_progress`, per output
item `output_item.added`, its part and deltas, their `done` events, `output_item.done`, then
`response.completed`, or `response.incomplete` when `max_output_tokens` cut it), each event
with its `sequence_number`; reasoning as a `reasoning` item with `reasoning_text` deltas.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from swaplab.router.relay.keepalive import Dialect
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

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


def error_response(status: int, message: str) -> web.Response:
    """OpenAI's error answer."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": None}}, status=status)


# -- the request --------------------------------------------------------------------------


def chat_request(document: dict[str, Any]) -> dict[str, Any]:
    """The chat completion a Responses request asks for."""
    if document.get("previous_response_id"):
        raise BadRequest("previous_response_id: this model's server has no Responses API, and swaplab translates "
                         "it without storing responses; send the whole conversation in `input`")
    chat: list[dict[str, Any]] = []
    given = document.get("input")
    if isinstance(given, str):
        chat.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for number, item in enumerate(given):
            _item(item, f"input[{number}]", chat)
    elif given is not None:
        raise BadRequest("input: expected a string or a list of items")
    # Codex sends its instructions as developer messages, some after a user's; chat templates take one
    # system message, first: every one joins it, in order.
    system = [text_of(document["instructions"], "instructions")] if document.get("instructions") else []
    system += [message["content"] for message in chat if message["role"] == "system"]
    chat = [message for message in chat if message["role"] != "system"]
    if system:
        chat.insert(0, {"role": "system", "content": "\n\n".join(system)})
    out: dict[str, Any] = {"model": document.get("model"), "messages": chat}
    if isinstance(document.get("max_output_tokens"), int):
        out["max_tokens"] = document["max_output_tokens"]
    copy_sampling(document, out, ("temperature", "top_p", "parallel_tool_calls", "top_logprobs"))
    tools = [_tool(tool, f"tools[{number}]") for number, tool in enumerate(document.get("tools") or ())]
    tools = [tool for tool in tools if tool is not None]
    if tools:
        out["tools"] = tools
        choice = document.get("tool_choice")
        if choice in ("auto", "none", "required"):
            out["tool_choice"] = choice
        elif isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    text = document.get("text") if isinstance(document.get("text"), dict) else {}
    format_ = text.get("format") if isinstance(text.get("format"), dict) else {}
    if format_.get("type") == "json_schema":
        schema = {key: format_[key] for key in ("name", "schema", "strict", "description") if key in format_}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif format_.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    if document.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _item(item: Any, where: str, chat: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        raise BadRequest(f"{where}: expected an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest(f"{where}.role: expected user, assistant, system or developer, got {role!r}")
        content = _content(item.get("content"), f"{where}.content")
        if role in ("system", "developer"):
            content = text_of(content, f"{where}.content")
        chat.append({"role": "system" if role == "developer" else role, "content": content})
    elif kind in ("function_call", "custom_tool_call"):
        if kind == "function_call":
            arguments = item.get("arguments") if isinstance(item.get("arguments"), str) else "{}"
        else:
            arguments = orjson.dumps({"input": item.get("input") or ""}).decode()
        call = {"id": item.get("call_id") or fresh_id("call_"), "type": "function",
                "function": {"name": item.get("name") or "", "arguments": arguments}}
        last = chat[-1] if chat else None
        if last is not None and last["role"] == "assistant" and not isinstance(last.get("content"), list):
            last.setdefault("tool_calls", []).append(call)
        else:
            chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else text_of(output, f"{where}.output", _TEXT_PARTS)
        chat.append({"role": "tool", "tool_call_id": item.get("call_id") or "", "content": text})
    elif kind in ("reasoning", "item_reference"):
        return
    else:
        raise BadRequest(f"{where}: an item of type {kind!r} cannot be sent to a chat completion")


def _content(content: Any, where: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: expected a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text") or part.get("refusal") or ""})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise BadRequest(f"{where}[{number}]: a part of type {kind!r} cannot be sent to a chat completion")
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _tool(tool: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(tool, dict):
        raise BadRequest(f"{where}: expected an object")
    kind = tool.get("type")
    if kind not in ("function", "custom"):
        return None  # a hosted tool (web search, file search...): nothing here runs it
    if not isinstance(tool.get("name"), str):
        raise BadRequest(f"{where}: a {kind} tool needs a name")
    function: dict[str, Any] = {"name": tool["name"]}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    if kind == "function":
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    else:
        function["parameters"] = _CUSTOM_PARAMETERS
    return {"type": "function", "function": function}


def custom_tools(document: dict[str, Any]) -> frozenset[str]:
    return frozenset(tool["name"] for tool in document.get("tools") or ()
                     if isinstance(tool, dict) and tool.get("type") == "custom" and isinstance(tool.get("name"), str))


# -- the reply ----------------------------------------------------------------------------


class ResponsesReply(ChatReader):
    """A chat completion's reply as a Responses answer: its events, or one `response` object."""

    dialect = Dialect.RESPONSES

    def __init__(self, model: str, path: str, request: dict[str, Any]):
        super().__init__(path, request.get("stream") is True)
        self.model = model
        self.request = request
        self.id = fresh_id("resp_")
        self._custom = custom_tools(request)
        self._sequence = 0
        self._started = False
        self._items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the text or reasoning item being streamed
        self._tools: dict[int, dict[str, Any]] = {}  # tool call index -> its item

    # -- framing ----------------------------------------------------------------------------

    def _emit(self, name: str, data: dict[str, Any]) -> bytes:
        if not self.streaming:
            return b""
        data = {"type": name, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return sse(name, data)

    def _response(self, status: str) -> dict[str, Any]:
        request = self.request
        document: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "background": False, "error": None, "incomplete_details": None,
            "instructions": request.get("instructions"), "max_output_tokens": request.get("max_output_tokens"),
            "model": self.model, "output": [item for item in self._items if status != "in_progress"],
            "parallel_tool_calls": request.get("parallel_tool_calls", True), "previous_response_id": None,
            "reasoning": request.get("reasoning") or {"effort": None, "summary": None}, "store": False,
            "temperature": request.get("temperature"), "text": request.get("text") or {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice") or "auto", "tools": request.get("tools") or [],
            "top_p": request.get("top_p"), "truncation": "disabled", "usage": None, "user": None, "metadata": {},
        }
        if status in ("completed", "incomplete"):
            prompt, output, cached = usage_numbers(self.usage)
            document["usage"] = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                                 "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                                 "total_tokens": prompt + output}
        if status == "incomplete":
            document["incomplete_details"] = {"reason": "max_output_tokens"}
        return document

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return (self._emit("response.created", {"response": self._response("in_progress")})
                + self._emit("response.in_progress", {"response": self._response("in_progress")}))

    # -- items ------------------------------------------------------------------------------

    def _open_item(self, kind: str) -> bytes:
        """The text (`message`) or `reasoning` item deltas go to: the open one, or a new one."""
        if self._open is not None and self._open["type"] == kind:
            return b""
        out = self._start() + self._close_item()
        if kind == "message":
            item: dict[str, Any] = {"id": fresh_id("msg_"), "type": "message", "status": "in_progress",
                                    "role": "assistant", "content": []}
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": fresh_id("rs_"), "type": "reasoning", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        self._items.append(item)
        self._open = item
        index = len(self._items) - 1
        out += self._emit("response.output_item.added", {"output_index": index, "item": {**item, "content": []}})
        item["content"].append(part)
        if kind == "message":
            out += self._emit("response.content_part.added", {"item_id": item["id"], "output_index": index,
                                                               "content_index": 0, "part": {**part, "text": ""}})
        return out

    def _close_item(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open = None
        index = self._items.index(item)
        part = item["content"][0]
        if item["type"] == "message":
            item["status"] = "completed"
            out = self._emit("response.output_text.done", {"item_id": item["id"], "output_index": index,
                                                            "content_index": 0, "text": part["text"], "logprobs": []})
            out += self._emit("response.content_part.done", {"item_id": item["id"], "output_index": index,
                                                              "content_index": 0, "part": part})
        else:
            out = self._emit("response.reasoning_text.done", {"item_id": item["id"], "output_index": index,
                                                               "content_index": 0, "text": part["text"]})
        return out + self._emit("response.output_item.done", {"output_index": index, "item": item})

    def text(self, piece: str) -> bytes:
        out = self._open_item("message")
        item = self._open
        assert item is not None
        item["content"][0]["text"] += piece
        return out + self._emit("response.output_text.delta", {
            "item_id": item["id"], "output_index": len(self._items) - 1, "content_index": 0, "delta": piece,
            "logprobs": []})

    def thought(self, piece: str) -> bytes:
        out = self._open_item("reasoning")
        item = self._open
        assert item is not None
        item["content"][0]["text"] += piece
        return out + self._emit("response.reasoning_text.delta", {
            "item_id": item["id"], "output_index": len(self._items) - 1, "content_index": 0, "delta": piece})

    def tool_call(self, index: int, call: dict[str, Any], arguments: str) -> bytes:
        out = b""
        item = self._tools.get(index)
        if item is None:
            out = self._start() + self._close_item()
            custom = call["name"] in self._custom
            item = {"id": fresh_id("ctc_" if custom else "fc_"), "type": "custom_tool_call" if custom else "function_call",
                    "status": "in_progress", "call_id": call["id"], "name": call["name"]}
            item["input" if custom else "arguments"] = ""
            self._tools[index] = item
            self._items.append(item)
            if not custom:
                out += self._emit("response.output_item.added", {"output_index": len(self._items) - 1, "item": {**item}})
        item["name"] = call["name"]
        if item["type"] == "function_call":
            item["arguments"] = call["arguments"]
            if arguments:
                out += self._emit("response.function_call_arguments.delta", {
                    "item_id": item["id"], "output_index": self._items.index(item), "delta": arguments})
        else:
            item["_arguments"] = call["arguments"]
        return out

    def _finish_tools(self) -> bytes:
        """Each tool call's last events: its arguments whole (a custom tool's `input`, read from them)."""
        out = b""
        for item in self._tools.values():
            index = self._items.index(item)
            item["status"] = "completed"
            if item["type"] == "function_call":
                out += self._emit("response.function_call_arguments.done", {
                    "item_id": item["id"], "output_index": index, "name": item["name"], "arguments": item["arguments"]})
            else:
                value = arguments_object(item.pop("_arguments", ""))
                item["input"] = value.get("input", "") if isinstance(value, dict) and isinstance(value.get("input"), str) \
                    else ""
                out += self._emit("response.output_item.added", {"output_index": index,
                                                                  "item": {**item, "input": "", "status": "in_progress"}})
                out += self._emit("response.custom_tool_call_input.done", {
                    "item_id": item["id"], "output_index": index, "input": item["input"]})
            out += self._emit("response.output_item.done", {"output_index": index, "item": item})
        return out

    def closing(self) -> bytes:
        status = "incomplete" if self.finish_reason == "length" else "completed"
        out = self._start() + self._close_item() + self._finish_tools()
        if not self.streaming:
            return orjson.dumps(self._response(status))
        return out + self._emit(f"response.{status}", {"response": self._response(status)})

    # -- errors -----------------------------------------------------------------------------

    def error(self, message: str) -> bytes:
        return self._emit("error", {"code": "upstream_error", "message": message, "param": None}) if self.streaming \
            else b""

    def whole_error(self) -> bytes:
        return orjson.dumps({"error": {"message": self.failure, "type": "server_error", "param": None, "code": None}})

    def error_response(self, status: int, message: str) -> web.Response:
        return error_response(status, message)
