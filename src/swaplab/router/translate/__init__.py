"""Anthropic's Messages and OpenAI's Responses served over a backend's chat completions.

Claude Code speaks only `/v1/messages`, Codex only `/v1/responses`; TabbyAPI serves neither,
and an OpenAI-only peer may not either. Where a model's server lacks the route, the router
translates: the request becomes a chat completion (`messages`, `responses`), sent down the
usual request path (`Forwarder`), and the reply comes back in the route's own shape (a
`reshape.Reshape`, as Ollama's routes do). Whether a server lacks a route is declared
(`translate:` on a model or peer), known from its engine's contract (TabbyAPI's `absent`),
or learned from its first 404 on the route and remembered (`book.RouteBook`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from swaplab.router.relay.reshape import RESHAPE, Reshape
from swaplab.router.translate import messages, responses
from swaplab.router.translate.common import CHAT_PATH, BadRequest

# The routes translated, and the API each belongs to (the `translate:` key's names).
ROUTES = {"/v1/messages": "messages", "/v1/messages/count_tokens": "messages", "/v1/responses": "responses"}
APIS = ("messages", "responses")

__all__ = ["APIS", "CHAT_PATH", "ROUTES", "BadRequest", "Translation", "begin", "translation"]


@dataclass(frozen=True)
class Translation:
    """One request, translated: the chat completion to send, and the reply's reshape."""

    document: dict[str, Any]
    reshape: Reshape
    path: str = CHAT_PATH


def translation(path: str, document: dict[str, Any], requested: str) -> Translation:
    """The chat completion for a request to `path` (one of `ROUTES`), and its reply's reshape.

    Raises `BadRequest` for what cannot be translated (the client's fault, or a feature a chat
    completion cannot carry), with a message saying which. A query (Claude Code's `?beta=true`) is the
    route's, not the chat completion's.
    """
    path = path.partition("?")[0]
    if path == "/v1/messages":
        return Translation(messages.chat_request(document), messages.MessagesReply(requested, path, document))
    if path == "/v1/messages/count_tokens":
        return Translation(messages.count_request(document), messages.CountReply(path))
    if path == "/v1/responses":
        return Translation(responses.chat_request(document), responses.ResponsesReply(requested, path, document))
    raise KeyError(path)


def begin(request: web.Request, path: str, document: dict[str, Any], requested: str) -> Translation | web.Response:
    """The request's translation, its reshape set on `request` (`reshape.RESHAPE`); or the 400, in the
    route's own shape, saying why it cannot be translated."""
    try:
        translated = translation(path, document, requested)
    except BadRequest as error:
        return error_response(path, 400, f"{error} (this model's server lacks {path.partition('?')[0]}: swaplab "
                                         "translates it to a chat completion)")
    request[RESHAPE] = translated.reshape
    return translated


def error_response(path: str, status: int, message: str) -> web.Response:
    """An error in the route's own shape, before anything was sent."""
    if path.startswith("/v1/messages"):
        return messages.error_response(status, message)
    return responses.error_response(status, message)
