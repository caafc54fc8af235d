"""Ollama's request bodies as the OpenAI requests that mean the same, checked as they are read.

Shapes are Ollama's (its docs/api.md and `api/types.go`): `/api/chat` and `/api/generate`
become `/v1/chat/completions` (a raw `generate`, or one to a model that does not chat:
`/v1/completions`), `/api/embed` and `/api/embeddings` become `/v1/embeddings`. `options`
map to the sampling parameters they name (llama.cpp's names where OpenAI has none); the
load-time ones (`num_ctx`, `num_gpu`...) belong to the model's command in the config and
are left out. `keep_alive` is read as Ollama reads it. Anything malformed raises
`BadRequest` with what is wrong and where.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"


class BadRequest(Exception):
    """An Ollama request that cannot be translated: answered 400 with this message."""


# Ollama's sampling options -> the OpenAI (or llama.cpp) parameters sent for them, with the
# JSON types each accepts. vLLM calls llama.cpp's `repeat_penalty` `repetition_penalty`:
# both are sent, and each server reads its own.
_NUMBER = (int, float)
_SAMPLING: dict[str, tuple[tuple[str, ...], tuple[type, ...]]] = {
    "temperature": (("temperature",), _NUMBER),
    "top_p": (("top_p",), _NUMBER),
    "top_k": (("top_k",), (int,)),
    "min_p": (("min_p",), _NUMBER),
    "typical_p": (("typical_p",), _NUMBER),
    "seed": (("seed",), (int,)),
    "repeat_penalty": (("repeat_penalty", "repetition_penalty"), _NUMBER),
    "repeat_last_n": (("repeat_last_n",), (int,)),
    "presence_penalty": (("presence_penalty",), _NUMBER),
    "frequency_penalty": (("frequency_penalty",), _NUMBER),
    "mirostat": (("mirostat",), (int,)),
    "mirostat_tau": (("mirostat_tau",), _NUMBER),
    "mirostat_eta": (("mirostat_eta",), _NUMBER),
    "num_keep": (("n_keep",), (int,)),
}
LOAD_OPTIONS = frozenset({
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap",
    "use_mlock", "embedding_only", "num_thread", "numa", "num_gqa", "rope_frequency_base", "rope_frequency_scale",
    "draft_num_predict",
})
"""Options a loaded server cannot change per request: its command in the config sets them."""
RETIRED_OPTIONS = frozenset({"penalize_newline", "tfs_z"})
"""Options Ollama itself no longer applies (llama.cpp dropped them)."""

_GO_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
THINKING_LEVELS = ("low", "medium", "high", "max")


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's `keep_alive`: a number of seconds or a Go duration (`5m`, `1h30m`, `-1`); a negative one means
    forever (kept negative here), 0 unload after the request. None when the request gave none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadRequest(f"keep_alive must be a number of seconds or a duration such as \"5m\", not {_shown(value)}")
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)  # "-1", "3600": seconds, as Ollama's OLLAMA_KEEP_ALIVE reads them
        except ValueError:
            seconds = _go_duration(text)
    else:
        seconds = float(value)
    if math.isnan(seconds):
        raise BadRequest("keep_alive must be a number of seconds, not NaN")
    return -1.0 if seconds < 0 else seconds


def _go_duration(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _GO_DURATION.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise BadRequest(f"keep_alive {text!r} is not a duration (e.g. \"30s\", \"5m\", \"1h30m\", \"-1\")")
    return sign * sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def sampling(options: Any) -> dict[str, Any]:
    """`options` as the OpenAI request's parameters (`num_predict` -> `max_tokens`, `stop` as it is)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise BadRequest(f"options must be an object of model parameters, not {_shown(options)}")
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None or key in LOAD_OPTIONS or key in RETIRED_OPTIONS:
            continue
        if key == "num_predict":
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadRequest(f"options.num_predict must be a whole number, not {_shown(value)}")
            if value >= 0:  # -1: no limit, -2: fill the context; either is the server's own default
                out["max_tokens"] = value
            continue
        if key == "stop":
            out["stop"] = _stop(value)
            continue
        if key not in _SAMPLING:
            continue  # Ollama, too, ignores an option it does not know (and logs it)
        names, kinds = _SAMPLING[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            kind = "a whole number" if kinds == (int,) else "a number"
            raise BadRequest(f"options.{key} must be {kind}, not {_shown(value)}")
        for name in names:
            out[name] = value
    return out


def _stop(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise BadRequest(f"options.stop must be a list of strings, not {_shown(value)}")


def response_format(value: Any) -> dict[str, Any] | None:
    """`format`: "json" is JSON mode, an object is a JSON schema the reply must match."""
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, Mapping):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": dict(value), "strict": True}}
    raise BadRequest(f"format must be \"json\" or a JSON schema object, not {_shown(value)}")


def thinking(value: Any) -> dict[str, Any]:
    """`think`: true/false turns the template's thinking on or off; a level sets the reasoning effort."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"chat_template_kwargs": {"enable_thinking": value}}
    if isinstance(value, str) and value in THINKING_LEVELS:
        return {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "high" if value == "max" else value}
    raise BadRequest(f"think must be true, false or one of {', '.join(THINKING_LEVELS)}, not {_shown(value)}")


def streaming(document: Mapping[str, Any]) -> bool:
    """Ollama streams unless told `"stream": false`."""
    value = document.get("stream", True)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise BadRequest(f"stream must be true or false, not {_shown(value)}")
    return value


def model_name(document: Any) -> str:
    if not isinstance(document, Mapping):
        raise BadRequest("the body must be a JSON object")
    name = document.get("model")
    if not isinstance(name, str) or not name:
        raise BadRequest("model is required: the name of a model (GET /api/tags lists them)")
    return name


def chat_request(document: Mapping[str, Any], upstream_model: str, stream: bool) -> dict[str, Any]:
    """`/api/chat` as a `/v1/chat/completions` body."""
    messages = document.get("messages")
    if not isinstance(messages, list):
        raise BadRequest(f"messages must be a list of messages, not {_shown(messages)}")
    out: dict[str, Any] = {"model": upstream_model, "messages": chat_messages(messages)}
    tools = document.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(tool, Mapping) for tool in tools):
            raise BadRequest(f"tools must be a list of tool objects, not {_shown(tools)}")
        if tools:
            out["tools"] = [_tool(tool, index) for index, tool in enumerate(tools)]
    return _common(out, document, stream)


def generate_request(
    document: Mapping[str, Any], upstream_model: str, stream: bool, chat: bool = True
) -> tuple[str, dict[str, Any]]:
    """`/api/generate` as a chat turn (`system`, then the prompt and its images); or a completion of the prompt
    as it is, when `raw` or when the model does not chat (`chat` False: a base model, with no chat template)."""
    prompt = _optional_text(document, "prompt")
    system = _optional_text(document, "system")
    raw = document.get("raw") is True
    if document.get("suffix"):
        raise BadRequest("suffix (fill-in-the-middle) is not translated: send it to the model's own /infill "
                         "(POST /upstream/MODEL/infill with input_prefix and input_suffix)")
    if raw and (system or document.get("template")):  # Ollama's own 400 (server/routes.go GenerateHandler)
        raise BadRequest("raw mode does not support template or system: the prompt is sent as it is, so write "
                         "them into it")
    if document.get("template"):
        raise BadRequest("template is not applied: the backend formats the prompt with the model's own chat "
                         "template; send the prompt already formatted with \"raw\": true instead")
    images = document.get("images")
    if raw or not chat:
        if images:
            raise BadRequest("images need the model's chat template: send them without \"raw\": true" if raw else
                             "images need a chat template, and this model's capabilities say it does not chat "
                             "(no text in and text out in its config entry)")
        # A model without a chat template drops `system`, as Ollama's default template (`{{ .Prompt }}`) does.
        out: dict[str, Any] = {"model": upstream_model, "prompt": prompt}
        return COMPLETIONS_PATH, _common(out, document, stream, chat=False)
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append(_user_turn(prompt, images, "images"))
    out = {"model": upstream_model, "messages": messages}
    return CHAT_PATH, _common(out, document, stream)


def _common(out: dict[str, Any], document: Mapping[str, Any], stream: bool, chat: bool = True) -> dict[str, Any]:
    out.update(sampling(document.get("options")))
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}
    fmt = response_format(document.get("format"))
    if fmt is not None:
        out["response_format"] = fmt
    if chat:
        out.update(thinking(document.get("think")))
    logprobs = document.get("logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, bool):
            raise BadRequest(f"logprobs must be true or false, not {_shown(logprobs)}")
        top = document.get("top_logprobs")
        if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
            raise BadRequest(f"top_logprobs must be a whole number from 0 to 20, not {_shown(top)}")
        if logprobs:
            if chat:
                out["logprobs"] = True
                if top:
                    out["top_logprobs"] = top
            else:
                out["logprobs"] = top or 1
    return out


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's: images as content parts, tool calls with JSON-string arguments and ids,
    tool results tied to the call they answer (by `tool_call_id`, else the latest call of `tool_name`)."""
    out: list[dict[str, Any]] = []
    calls_by_name: dict[str, str] = {}
    last_call = ""
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise BadRequest(f"{where} must be an object with a role and content, not {_shown(message)}")
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"{where}.role must be system, user, assistant or tool, not {_shown(role)}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise BadRequest(f"{where}.content must be text, not {_shown(content)}")
        content = content or ""
        if role == "user":
            out.append(_user_turn(content, message.get("images"), f"{where}.images"))
            continue
        if message.get("images"):
            raise BadRequest(f"{where}: only a user message may carry images")
        turn: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            thought = message.get("thinking")
            if isinstance(thought, str) and thought:
                turn["reasoning_content"] = thought
            calls = message.get("tool_calls")
            if calls:
                if not isinstance(calls, list):
                    raise BadRequest(f"{where}.tool_calls must be a list, not {_shown(calls)}")
                turn["tool_calls"] = []
                for number, call in enumerate(calls):
                    translated = _tool_call(call, f"{where}.tool_calls[{number}]", f"call_{index}_{number}")
                    calls_by_name[translated["function"]["name"]] = last_call = translated["id"]
                    turn["tool_calls"].append(translated)
        elif role == "tool":
            name = message.get("tool_name") or message.get("name")
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                call_id = calls_by_name.get(name, last_call) if isinstance(name, str) else last_call
            turn["tool_call_id"] = call_id or "call_0"
            if isinstance(name, str) and name:
                turn["name"] = name
        out.append(turn)
    return out


def _user_turn(content: str, images: Any, where: str) -> dict[str, Any]:
    if not images:
        return {"role": "user", "content": content}
    if not isinstance(images, list):
        raise BadRequest(f"{where} must be a list of base64-encoded images, not {_shown(images)}")
    parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    for number, image in enumerate(images):
        parts.append({"type": "image_url", "image_url": {"url": image_url(image, f"{where}[{number}]")}})
    return {"role": "user", "content": parts}


# The image formats llama.cpp's multimodal loader reads (stb_image), by their first bytes.
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


BASE64_PIECE = 1024 * 1024
"""Characters of an image's base64 checked at a time (a multiple of 4): a large image is never decoded whole."""


def image_url(value: Any, where: str) -> str:
    """A base64 image (or a `data:` URL) as a `data:` URL of its own type: one copy of the text at most, none when
    the client sent that URL already."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where} must be a base64-encoded image, not {_shown(value)}")
    start = value.find(",") + 1 if value.startswith("data:") else 0  # a `data:` URL without a comma: not base64
    try:
        first = value[start:start + 64]
        head = base64.b64decode(first + "=" * (-len(first) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where} is not valid base64") from None
    if not valid_base64(value, start):
        raise BadRequest(f"{where} is not valid base64")
    for magic, mime in _IMAGE_MAGIC:
        if head.startswith(magic):
            return _data_url(mime, value, start)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _data_url("image/webp", value, start)
    raise BadRequest(f"{where} is not a PNG, JPEG, GIF, WebP or BMP image")


def valid_base64(text: str, start: int = 0, piece: int = BASE64_PIECE) -> bool:
    """Whether `base64.b64decode(text[start:], validate=True)` takes it, asked of `piece` characters at a time
    (a multiple of 4), so that neither the decoded image nor an ASCII copy of its text is ever made whole."""
    padding = text.find("=", start)
    if padding < 0:
        padding = len(text)
    elif text.count("=", padding) != len(text) - padding:
        return False  # something follows the padding, which validate refuses wherever it is
    last = start + max(padding - start - 1, 0) // piece * piece  # where the last piece of data begins
    try:
        for at in range(start, last, piece):
            base64.b64decode(text[at:at + piece], validate=True)
        # The last piece with its padding, 3 `=` at most: more says what 3 do (a whole quad takes any number).
        # The text itself, not a copy, when it is one piece.
        base64.b64decode(text[last:padding + 3], validate=True)
    except (binascii.Error, ValueError):  # ValueError: a character that is not ASCII
        return False
    return True


def _data_url(mime: str, value: str, start: int) -> str:
    prefix = f"data:{mime};base64,"
    if start == len(prefix) and value.startswith(prefix):
        return value
    return prefix + value[start:]


def _tool(tool: Mapping[str, Any], index: int) -> dict[str, Any]:
    function = tool.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise BadRequest(f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
    return {"type": tool.get("type") or "function", "function": dict(function)}


def _tool_call(call: Any, where: str, default_id: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise BadRequest(f"{where} must be {{\"function\": {{\"name\": ..., \"arguments\": {{...}}}}}}")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (Mapping, str)):
        raise BadRequest(f"{where}.function.arguments must be an object, not {_shown(arguments)}")
    try:
        text = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    except orjson.JSONEncodeError as error:
        raise BadRequest(f"{where}.function.arguments cannot be sent on: {error}") from None
    call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else default_id
    return {"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": text}}


def embed_request(document: Mapping[str, Any], upstream_model: str, legacy: bool) -> tuple[dict[str, Any], int]:
    """`/api/embed` (`input`: text or texts) or the older `/api/embeddings` (`prompt`) as a `/v1/embeddings`
    body, and how many inputs it carries (0: an empty legacy prompt, answered without the model)."""
    if legacy:
        prompt = _optional_text(document, "prompt")
        inputs: list[str] = [prompt] if prompt else []
    else:
        value = document.get("input")
        if isinstance(value, str):
            inputs = [value]
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            inputs = value
        else:
            raise BadRequest(f"input must be a text or a list of texts, not {_shown(value)}")
        if not inputs:
            raise BadRequest("input is empty: give a text or a list of texts to embed")
    out: dict[str, Any] = {"model": upstream_model, "input": inputs, "encoding_format": "float"}
    dimensions = document.get("dimensions")
    if dimensions is not None:
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions <= 0:
            raise BadRequest(f"dimensions must be a positive whole number, not {_shown(dimensions)}")
        out["dimensions"] = dimensions
    sampling(document.get("options"))  # checked; an embedding has nothing to sample
    return out, len(inputs)


def _optional_text(document: Mapping[str, Any], key: str) -> str:
    value = document.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be text, not {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A value as a message shows it: its JSON, cut short."""
    try:
        text = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."
