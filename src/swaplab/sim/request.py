"""What the sim makes of one request: a pure reading of an OpenAI or Anthropic request body into a `Plan`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from swaplab.sim.script import Script, ScriptedReply
from swaplab.sim.tokens import prompt_words

if TYPE_CHECKING:
    from aiohttp import web

# "messages" is Anthropic's Messages API (/v1/messages); the others are OpenAI's
# ("responses" its Responses API, /v1/responses).
Kind = Literal["chat", "completion", "messages", "responses"]

# What a Responses answer repeats of its request, when the request gives it (vLLM's
# ResponsesResponse.from_request, vllm/entrypoints/openai/responses/protocol.py:1001-1068);
# swaplab.sim.responses fills in vLLM's defaults for the rest.
RESPONSE_ECHOES = (
    "instructions", "metadata", "parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p",
    "max_tool_calls", "previous_response_id", "prompt_cache_options", "prompt_cache_key",
    "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "text", "truncation", "user",
    "presence_penalty", "frequency_penalty",
)


class BadRequest(Exception):
    """A request body the sim cannot serve; the message goes back to the client as a 400.

    `param` names the field at fault where the engine's answer says it (the Responses API's `param`).
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Plan:
    """One generation: who asked for what, how long the answer is and how it ends."""

    kind: Kind
    model: str
    stream: bool
    include_usage: bool
    prompt_tokens: int
    completion_tokens: int
    # "length" when the request's own limit cut the answer, "stop" when the answer
    # ended at --default-max-tokens, as a model reaching its end-of-sequence would;
    # a scripted reply's own ("tool_calls", or "length" for a truncated thought).
    # OpenAI's spelling for every kind: the Messages wire format translates it.
    finish_reason: str
    reply: ScriptedReply | None = None  # the script's answer; None: the usual " tok0 tok1 ..."
    # The prompt as the sim's tokens (one per word; a token id as its digits), for the slots' prompt cache.
    prompt: tuple[str, ...] = ()
    id_slot: int | None = None  # llama.cpp's `id_slot`: the slot the request asks for; None (or -1): any
    cache_tokens: int = 0  # prompt tokens the slot already held (llama.cpp's `timings.cache_n`), set once a slot is chosen
    timings: bool = False  # whether the answer carries llama.cpp's `timings` (`--timings`, or any slot flag)
    # A Responses request's own settings its answer repeats (RESPONSE_ECHOES given, and the
    # `max_output_tokens` in force); empty for the other kinds.
    echoes: dict[str, Any] = field(default_factory=dict)


def plan_request(
    kind: Kind, body: Any, *, default_model: str, default_max_tokens: int, script: Script | None = None
) -> Plan:
    """Read a chat, completions, Messages or Responses request body; raises BadRequest on a malformed one.

    With a `script`, a chat request it has a reply for gets that reply, whatever its limit.
    """
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        prompt = [word for message in messages for word in _message_words(message)]
        limit_keys = ("max_completion_tokens", "max_tokens")
    elif kind == "messages":
        prompt = messages_prompt(body)
        limit_keys = ("max_tokens",)
    elif kind == "responses":
        check_responses_body(body)
        prompt = responses_prompt(body)
        limit_keys = ("max_output_tokens",)
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required")
        prompt = _prompt_words(body["prompt"])
        limit_keys = ("max_tokens", "n_predict")

    limit = _requested_limit(body, limit_keys)
    if kind == "messages" and not limit:
        # Anthropic requires a positive limit, so a Messages answer always ends at it ("max_tokens").
        raise BadRequest("'max_tokens' is required: an integer of at least 1")
    if limit is None:
        completion_tokens, finish_reason = default_max_tokens, "stop"
    else:
        completion_tokens, finish_reason = limit, "length"
    reply = script.reply_for(body["messages"]) if script is not None and kind == "chat" else None
    if reply is not None:
        completion_tokens, finish_reason = reply.completion_tokens, reply.finish_reason

    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object")
    id_slot = body.get("id_slot")
    if id_slot is not None and (isinstance(id_slot, bool) or not isinstance(id_slot, int) or id_slot < -1):
        raise BadRequest("'id_slot' must be a slot id, or -1 for any slot")

    echoes = {} if kind != "responses" else {
        **{name: body[name] for name in RESPONSE_ECHOES if body.get(name) is not None},
        "max_output_tokens": completion_tokens,
    }
    return Plan(
        kind=kind,
        model=model or default_model,
        stream=stream,
        include_usage=stream and options.get("include_usage") is True,
        prompt_tokens=len(prompt),
        completion_tokens=completion_tokens,
        finish_reason=finish_reason,
        reply=reply,
        prompt=tuple(prompt),
        id_slot=None if id_slot in (None, -1) else id_slot,
        echoes=echoes,
    )


def messages_prompt_tokens(body: Any) -> int:
    """The prompt size of an Anthropic Messages body: words of `system` and of every message.

    Raises BadRequest when the body lacks what Anthropic requires of it (`model`, `messages`).
    """
    return len(messages_prompt(body))


def messages_prompt(body: Any) -> list[str]:
    """The prompt of an Anthropic Messages body as the sim's tokens; raises BadRequest as above."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BadRequest("'model' is required: a string")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    system = body.get("system")
    system_words = [] if system is None else _content_words(system, "'system'")
    return system_words + [word for message in messages for word in _message_words(message)]


def responses_prompt(body: dict[str, Any]) -> list[str]:
    """The prompt of an OpenAI Responses body as the sim's tokens: the words of `instructions`, then of
    `input`: a string, or items (messages with string content or text parts, function call outputs)."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string", param="body.instructions")
    words = prompt_words(instructions) if instructions else []
    items = body.get("input")
    if items is None:
        raise BadRequest("'input' is required: a string or a list of input items", param="body.input")
    if isinstance(items, str):
        return words + prompt_words(items)
    if not isinstance(items, list):
        raise BadRequest("'input' must be a string or a list of input items", param="body.input")
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each 'input' item must be an object", param="body.input")
        # A tool's result reads as chat's tool message does: its text counts; a call's arguments do not.
        if item.get("type") == "function_call_output" and isinstance(item.get("output"), str):
            words += prompt_words(item["output"])
        elif item.get("content") is not None:
            try:
                words += _content_words(item["content"], "an input item's 'content'")
            except BadRequest as bad:
                raise BadRequest(str(bad), param="body.input") from None
    return words


def check_responses_body(body: dict[str, Any]) -> None:
    """Refuse what vLLM refuses of a Responses body beyond its prompt (each check with its origin)."""
    for name, kind in (("model", str), ("stream", bool)):
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise BadRequest(f"'{name}' must be a {'string' if kind is str else 'boolean'}", param=f"body.{name}")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise BadRequest("'max_output_tokens' must be an integer", param="body.max_output_tokens")
    if limit is not None and limit < 1:
        # The limit becomes SamplingParams' max_tokens, which wants one token at least (vllm/sampling_params.py:695-700).
        raise BadRequest(f"max_tokens must be at least 1, got {limit}.", param="max_tokens")
    if body.get("prompt") is not None:  # vllm/entrypoints/openai/responses/protocol.py:694-703
        raise BadRequest("prompt template is not supported", param="prompt")
    if body.get("background"):
        # Background mode needs `store` (protocol.py:680-692) and the response store, which vLLM keeps
        # off unless VLLM_ENABLE_RESPONSES_API_STORE=1 (vllm/entrypoints/openai/responses/serving.py:264-277).
        if not body.get("store", True):
            raise BadRequest("background can only be used when `store` is true", param="background")
        raise BadRequest(
            "This vLLM engine does not support `store=True` and therefore does not support the background mode. "
            "To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
            "launching the vLLM server.", param="background")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be a list", param="body.tools")
    # protocol.py:865-903: tool_choice "required" or a named tool needs that tool in `tools`.
    choice = body.get("tool_choice")
    if choice == "required" and not tools:
        raise BadRequest("Tool choice 'required' must be specified with 'tools' parameter.", param="tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        names = {tool.get("name") for tool in tools or () if isinstance(tool, dict)}
        if choice.get("name") not in names:
            raise BadRequest("Tool choice 'function' not found in 'tools' parameter.", param="tool_choice")


def _requested_limit(body: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"'{key}' must be an integer")
        if value < 0:
            if key == "n_predict":  # llama.cpp: -1 means "until the model stops"
                continue
            raise BadRequest(f"'{key}' must not be negative")
        return value
    return None


def _message_words(message: Any) -> list[str]:
    if not isinstance(message, dict):
        raise BadRequest("each message must be an object")
    content = message.get("content")
    return [] if content is None else _content_words(content, "message 'content'")


def _content_words(content: Any, what: str) -> list[str]:
    # A string, or a list of parts (OpenAI) or content blocks (Anthropic): the text ones count.
    if isinstance(content, str):
        return prompt_words(content)
    if isinstance(content, list):
        return [
            word
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            for word in prompt_words(part["text"])
        ]
    raise BadRequest(f"{what} must be a string or a list of parts")


def _prompt_words(prompt: Any) -> list[str]:
    # A prompt may be text, a list of texts, token ids, or a list of token-id lists.
    if isinstance(prompt, str):
        return prompt_words(prompt)
    if isinstance(prompt, list):
        words: list[str] = []
        for item in prompt:
            if isinstance(item, str):
                words += prompt_words(item)
            elif isinstance(item, int) and not isinstance(item, bool):
                words.append(str(item))
            elif isinstance(item, list):
                words += [str(token) for token in item]
            else:
                raise BadRequest("'prompt' items must be strings, token ids or lists of token ids")
        return words
    raise BadRequest("'prompt' must be a string or a list")


async def json_body(request: web.Request) -> Any:
    """The request's JSON body; `BadRequest` (a 400) when it is not JSON."""
    try:
        return await request.json()
    except ValueError as error:  # json.JSONDecodeError is a ValueError
        raise BadRequest(f"invalid JSON body: {error}") from None
    except RecursionError:
        raise BadRequest("invalid JSON body: nested deeper than json reads") from None
