"""The first things every request meets: the Host and Origin policy (`policy.decide`); then the key check and the body limits.

`guard_middleware` runs before any handler: a refused request is answered here, and a
preflight is answered here, from the headers alone. `admission_middleware` comes next: the
key check (`auth.key_refusal`), so a keyless client is refused before a byte of its body is
read; then a request with a body has read it there, within `security.limits` (its
`Content-Length` checked before a byte is read, a body that stalls or takes too long in all
answered 408, one past the size 413, large bodies read a few at a time, and all bodies held
at once bounded, `HeldBodies`), so a handler's `await request.read()` only returns what was
read. One middleware for both: each layer costs every request a coroutine.
`replace_cors_headers` (the app's `on_response_prepare`) drops whatever CORS headers a
backend sent and sets the policy's own, on every response, streamed and websocket ones
included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from swaplab.config.model import Config
from swaplab.config.security import MIB, Limits, Security
from swaplab.router.door.auth import key_refusal
from swaplab.router.door.policy import Facts, Verdict, decide
from swaplab.router.door.responses import error_response

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


class HeldBodies:
    """The bytes of request bodies the router holds at once (`security.limits.maxHeldBodiesMB`), on both front doors.

    A body counts from when its reading starts (its declared length; one of unknown length
    as it comes) until its request is answered: a body read and waiting for its model to
    start is held as surely as one being read. One that does not fit waits for room (the
    guard, at most `bodyTimeout`, then a 503); the lane never waits, it hands such a request
    to aiohttp's server. One that came whole with its head waits too: the 503 lets it go
    rather than hold it while others are answered.
    """

    __slots__ = ("held", "_waiting")

    def __init__(self) -> None:
        self.held = 0
        self._waiting: list[asyncio.Future[None]] = []
        """Who waits for room (`wait_to_take`), woken by `give`."""

    def take(self, size: int, bound: int) -> bool:
        """Hold `size` more bytes if they fit within `bound`."""
        if self.held + size > bound:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        """`size` bytes held are let go; whoever waits for room looks again."""
        self.held -= size
        if self._waiting:
            waiters, self._waiting = self._waiting, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_to_take(self, size: int, bound: int) -> None:
        """Hold `size` more bytes once they fit (the caller bounds the wait)."""
        while not self.take(size, bound):
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            await waiter


def is_upgrade(headers: Mapping[str, str]) -> bool:
    """A websocket upgrade: `Connection` has the token `upgrade` and `Upgrade` the token `websocket` (any case, lists)."""
    return _has_token(headers, "Connection", "upgrade") and _has_token(headers, "Upgrade", "websocket")


def _has_token(headers: Mapping[str, str], name: str, token: str) -> bool:
    values = headers.getall(name, ()) if hasattr(headers, "getall") else [headers.get(name, "")]
    return any(part.strip().lower() == token for value in values for part in value.split(","))


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


def admission_middleware(current: Callable[[], Config], slots: BodySlots, held: HeldBodies):
    """After the policy: the key check (`auth.key_refusal`), then the request's body read within the limits,
    counted in `held` until its answer is done (the config read per request: reloads apply)."""

    @web.middleware
    async def admit(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        config = current()
        if config.api_keys:
            refused = key_refusal(request, config.api_keys, config.security.basic_auth)
            if refused is not None:
                return refused
        if not request.body_exists:
            return await handler(request)
        refused, holding = await read_body(request, config.security.limits, slots, held)
        try:
            return refused if refused is not None else await handler(request)
        finally:
            held.give(holding)

    return admit


async def read_body(
    request: web.Request, limits: Limits, slots: BodySlots, held: HeldBodies,
) -> tuple[web.Response | None, int]:
    """Read the body into the request (where `request.read()` finds it), or the answer that refuses it;
    and the bytes it holds in `held` (the caller gives them back once the request is answered)."""
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        return _too_large(declared, limits), 0
    bound = limits.max_held_body_bytes
    if request.content.is_eof():  # the whole body came with the head (most requests): nothing to wait for
        body = await request.read()
        if len(body) > limits.max_body_bytes:
            return _too_large(len(body), limits), 0
        size = len(body)
        if not held.take(size, bound) and not await _room(held, size, limits):
            return _no_room(held, size, limits), 0
        return None, size
    holding = declared or 0  # a body of unknown length is counted as it comes
    if not held.take(holding, bound) and not await _room(held, holding, limits):
        return _no_room(held, holding, limits), 0
    try:
        if declared is not None and declared <= limits.large_body_bytes:
            return await _read(request, limits, held, holding)
        semaphore = slots.semaphore(limits.max_large_bodies)
        try:
            async with asyncio.timeout(limits.body_timeout):
                await semaphore.acquire()
        except TimeoutError:
            return _busy(
                f"{limits.max_large_bodies} request bodies over {limits.large_body_bytes // MIB} MiB are being "
                "read already (security.limits.maxLargeBodies); retry in a moment",
            ), holding
        try:
            return await _read(request, limits, held, holding)
        finally:
            semaphore.release()
    except BaseException:  # cancelled while reading (the client left): what it held is given back here
        held.give(holding)
        raise


async def _room(held: HeldBodies, size: int, limits: Limits) -> bool:
    """Wait up to `bodyTimeout` for `size` bytes of room among the bodies held; whether they were taken."""
    try:
        async with asyncio.timeout(limits.body_timeout):
            await held.wait_to_take(size, limits.max_held_body_bytes)
    except TimeoutError:
        return False
    return True


def _no_room(held: HeldBodies, size: int, limits: Limits) -> web.Response:
    return _busy(
        f"the router holds {held.held / MIB:.1f} MiB of request bodies already, and this one's {size / MIB:.1f} MiB "
        f"would pass security.limits.maxHeldBodiesMB ({limits.max_held_body_bytes / MIB:g}); retry in a moment",
    )


async def _read(request: web.Request, limits: Limits, held: HeldBodies, holding: int) -> tuple[web.Response | None, int]:
    """Read a body that is still coming, within the idle (`bodyTimeout`) and whole (`bodyDeadline`) limits."""
    content = request.content
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_deadline
    chunks: list[bytes] = []
    size, counted = 0, holding
    try:
        while True:
            idle_until = loop.time() + limits.body_timeout
            try:
                async with asyncio.timeout_at(min(idle_until, deadline)):
                    chunk = await content.readany()
            except TimeoutError:
                return (body_late(limits) if deadline <= idle_until else body_stalled(limits)), holding
            except web.RequestPayloadError as error:
                # Nothing more is read: aiohttp's lingering read after the answer would raise the same
                # error again, unhandled (a traceback in its server's log).
                content.feed_eof()
                return _refuse(400, f"the request body is malformed: {error}", "invalid_request_error"), holding
            if not chunk:
                break
            size += len(chunk)
            if size > limits.max_body_bytes:
                return _too_large(size, limits, more=True), holding
            if size > holding:  # of unknown length: counted as it comes
                if not held.take(size - holding, limits.max_held_body_bytes):
                    return _no_room(held, size - holding, limits), holding
                holding = size
            chunks.append(chunk)
    except BaseException:  # cancelled (the client left): the caller gives back what it counted, this what it added
        held.give(holding - counted)
        raise
    # aiohttp's own cache of the body: `request.read()`, `.text()`, `.json()` and `.post()` return it.
    request._read_bytes = b"".join(chunks)
    return None, holding


def body_stalled(limits: Limits) -> web.Response:
    """408: the body went `bodyTimeout` without a byte; the connection is closed."""
    return _refuse(
        408,
        f"the request body stalled: no byte for {limits.body_timeout:g} s (security.limits.bodyTimeout)",
        "invalid_request_error",
    )


def body_late(limits: Limits) -> web.Response:
    """408: the body was still coming `bodyDeadline` after it began; the connection is closed."""
    return _refuse(
        408,
        f"the request body took more than {limits.body_deadline:g} s in all (security.limits.bodyDeadline)",
        "invalid_request_error",
    )


def _busy(message: str) -> web.Response:
    """503: no room for this body now; the client may retry in a moment."""
    response = _refuse(503, message, "server_error")
    response.headers["Retry-After"] = "1"
    return response


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
