"""The router's own answers: OpenAI-style JSON errors, and llama-swap's envelope for llama-swap's features."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web



def error_response(status: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> web.Response:
    """An OpenAI-style JSON error."""
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status)


@web.middleware
async def unmatched_route_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A request no route matches: a JSON 404 saying so (an Ollama client's `GET /api/tags` too); a 405,
    with `Allow`, only where the path is a route of another method.

    The last middleware: the guard and the keys have had their say by then, as for any route.
    """
    refused = request.match_info.http_exception
    if refused is None:
        return await handler(request)
    where = f"{request.method} {request.path}"
    if isinstance(refused, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(refused.allowed_methods))
        response = error_response(405, f"{where}: method not allowed; this route takes {allowed}")
        response.headers["Allow"] = allowed
        return response
    return error_response(refused.status, f"unknown route {where}")


# llama-swap's error type and default code per status (swaputil/httperror.go).
_LLAMA_SWAP_KINDS = {
    400: ("invalid_request_error", "bad_request"),
    401: ("authentication_error", "unauthorized"),
    403: ("authentication_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    409: ("invalid_request_error", "conflict"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "gateway_timeout"),
}


def llama_swap_error(accept: str, status: int, message: str) -> web.Response:
    """An error in llama-swap's own words and shape (`swaputil.SendResponse`), for the features it defines.

    Clients written against llama-swap's profiles, selectors and `ignorePaths` read these
    bodies, so they are llama-swap's: the same JSON `{"src": "llama-swap", "error": {...}}`,
    `llama-swap: MESSAGE` for `Accept: text/plain`, its small page for `text/html`.
    """
    if "text/plain" in accept:
        return web.Response(status=status, text=f"llama-swap: {message}", content_type="text/plain")
    if "text/html" in accept:
        page = f"<html><body><h1>llama-swap</h1><p>{_go_html_escape(message)}</p></body></html>"
        return web.Response(status=status, text=page, content_type="text/html")
    kind, code = _LLAMA_SWAP_KINDS.get(
        status, ("invalid_request_error", "invalid_request") if 400 <= status < 500 else ("server_error", "internal_error")
    )
    body = {"src": "llama-swap", "error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status)


def _go_html_escape(text: str) -> str:
    """Go's `html.EscapeString` (its entities for quotes differ from Python's `html.escape`)."""
    for character, entity in (("&", "&amp;"), ("'", "&#39;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;")):
        text = text.replace(character, entity)
    return text
