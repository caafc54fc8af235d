"""The first thing every request meets: the Host and Origin policy (`policy.decide`); after the key check, the body limits.

`guard_middleware` runs before the key check and before any handler: a refused request is
answered here, and a preflight is answered here, from the headers alone. `body_middleware`
runs after the key check (so a keyless client is refused before a byte of its body is
read): a request with a body has read it there, within `security.limits` (its
`Content-Length` checked before a byte is read, a body that stalls answered 408, one past
the size 413, and large bodies read a few at a time), so a handler's `await request.read()`
only returns what was read. `replace_cors_headers` (the
app's `on_response_prepare`) drops whatever CORS headers a backend sent and sets the
policy's own, on every response, streamed and websocket ones included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from swaplab.config.security import MIB, Limits, Security
from swaplab.router.policy import Facts, Verdict, decide
from swaplab.router.responses import error_response
from swaplab.router.websocket import is_upgrade

log = logging.getLogger("swaplab.router")

VERDICT = web.RequestKey("verdict", Verdict)
CORS_PREFIX = "access-control-"


class BodySlots:
    """The large bodies being read at once (`security.limits.maxLargeBodies`); a reload's new bound applies to new reads."""

    def __init__(self) -> None:
        self._bound = 0
        self._semaphore = asyncio.Semaphore(1)

    def semaphore(self, bound: int) -> asyncio.Semaphore:
        if bound != self._bound:
            self._bound, self._semaphore = bound, asyncio.Semaphore(bound)
        return self._semaphore


def facts_of(request: web.Request, listen_loopback: bool) -> Facts:
    headers = request.headers
    return Facts(
        method=request.method,
        path=request.path,
        host=headers.get("Host"),
        origin=headers.get("Origin"),
        fetch_site=headers.get("Sec-Fetch-Site"),
        preflight_method=headers.get("Access-Control-Request-Method"),
        preflight_headers=headers.get("Access-Control-Request-Headers", ""),
        private_network=headers.get("Access-Control-Request-Private-Network", "").lower() == "true",
        upgrade=request.method == "GET" and is_upgrade(headers),
        listen_loopback=listen_loopback,
    )


def guard_middleware(current: Callable[[], Security], listen_loopback: Callable[[], bool]):
    """The policy's verdict for every request (read per request: reloads apply)."""

    @web.middleware
    async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        security = current()
        verdict = decide(facts_of(request, listen_loopback()), security)
        request[VERDICT] = verdict
        if verdict.status == 204:
            return web.Response(status=204)
        if not verdict.goes_on:
            return _refuse(verdict.status, verdict.message, "permission_error")
        return await handler(request)

    return guard


def body_middleware(current: Callable[[], Security], slots: BodySlots):
    """A request's body read within the limits, after the key check (read per request: reloads apply)."""

    @web.middleware
    async def read(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if request.body_exists:
            refused = await read_body(request, current().limits, slots)
            if refused is not None:
                return refused
        return await handler(request)

    return read


async def read_body(request: web.Request, limits: Limits, slots: BodySlots) -> web.Response | None:
    """Read the body into the request (where `request.read()` finds it), or the answer that refuses it."""
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        return _too_large(declared, limits)
    if declared is not None and declared <= limits.large_body_bytes:
        return await _read(request, limits)
    semaphore = slots.semaphore(limits.max_large_bodies)
    try:
        async with asyncio.timeout(limits.body_timeout):
            await semaphore.acquire()
    except TimeoutError:
        response = _refuse(
            503,
            f"{limits.max_large_bodies} request bodies over {limits.large_body_bytes // MIB} MiB are being read "
            "already (security.limits.maxLargeBodies); retry in a moment",
            "server_error",
        )
        response.headers["Retry-After"] = "1"
        return response
    try:
        return await _read(request, limits)
    finally:
        semaphore.release()


async def _read(request: web.Request, limits: Limits) -> web.Response | None:
    content = request.content
    if content.is_eof():  # the whole body came with the headers (most requests): nothing to wait for
        body = await request.read()
        return _too_large(len(body), limits) if len(body) > limits.max_body_bytes else None
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(limits.body_timeout):
                chunk = await content.readany()
        except TimeoutError:
            return body_stalled(limits)
        except web.RequestPayloadError as error:
            return _refuse(400, f"the request body is malformed: {error}", "invalid_request_error")
        if not chunk:
            break
        size += len(chunk)
        if size > limits.max_body_bytes:
            return _too_large(size, limits, more=True)
        chunks.append(chunk)
    # aiohttp's own cache of the body: `request.read()`, `.text()`, `.json()` and `.post()` return it.
    request._read_bytes = b"".join(chunks)
    return None


def body_stalled(limits: Limits) -> web.Response:
    """408: the body went `bodyTimeout` without a byte; the connection is closed."""
    return _refuse(
        408,
        f"the request body stalled: no byte for {limits.body_timeout:g} s (security.limits.bodyTimeout)",
        "invalid_request_error",
    )


def _too_large(size: int, limits: Limits, more: bool = False) -> web.Response:
    return _refuse(
        413,
        f"the request body is {'more than ' if more else ''}{size} bytes; this router takes at most "
        f"{limits.max_body_bytes} ({limits.max_body_bytes // MIB} MiB, security.limits.maxBodyMB)",
        "invalid_request_error",
    )


def _refuse(status: int, message: str, kind: str) -> web.Response:
    """An answer that ends the connection: whatever the client still sends is not read."""
    response = error_response(status, message, kind)
    response.force_close()
    return response


async def replace_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the router's CORS headers, never the backend's."""
    apply_cors(request, response)


def apply_cors(request: web.Request, response: web.StreamResponse) -> None:
    """The router's CORS headers (the policy's verdict for `request`) in place of any the answer holds."""
    headers = response.headers
    for name in [name for name in headers if name.lower().startswith(CORS_PREFIX)]:
        headers.popall(name, None)
    verdict = request.get(VERDICT)
    if verdict is None:
        return
    for name, value in verdict.headers:
        if name == "Vary":
            if "origin" not in headers.get("Vary", "").lower():
                headers.add("Vary", value)
        else:
            headers[name] = value
