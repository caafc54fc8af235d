"""What the sim makes of one request: a pure reading of an OpenAI or Anthropic request body into a `Plan`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from swaplab.sim.script import Script, ScriptedReply
from swaplab.sim.tokens import prompt_words

if TYPE_CHECKING:
    from aiohttp import web

# "messages" is Anthropic's Messages API (/v1/messages); the others are OpenAI's.
Kind = Literal["chat", "completion", "messages"]


class BadRequest(Exception):
    """A request body the sim cannot serve; the message goes back to the client as a 400."""


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


def plan_request(
    kind: Kind, body: Any, *, default_model: str, default_max_tokens: int, script: Script | None = None
) -> Plan:
    """Read a chat, completions or Messages request body; raises BadRequest on a malformed one.

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
