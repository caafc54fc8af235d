"""The router's front door: a model request on the common path is served without aiohttp's server.

It is one concept in one module (about 560 lines): one connection's life on the lane, from
its first byte to its answer or its hand-over to aiohttp, where reading, deadlines, pacing
and the hand-over share the connection's state and must change it together.

Every connection to the router starts on a `LaneConnection`. It reads a request's line and
headers (llhttp, through httptools) and, for a request the lane takes, its body; then the
request goes to the same handler aiohttp would call (`Forwarder.handle_model_request`), as a
`reply.LaneRequest`, and its answer is written by `reply.LaneResponse`. aiohttp's server
costs each request its protocol's bookkeeping, two task steps, a stream writer, the request
object, the router's three middlewares and the response's header machinery and signal; the
lane serves a model request for some 170k fewer instructions (benchmarks/instructions.py,
docs/performance.md).

The lane takes an HTTP/1.1 `POST` to one of the model routes (`routes.MODEL_ROUTES`) with
a `Content-Length` body no larger than `security.limits.largeBodyMB`, no `Expect`, no
`Transfer-Encoding`, no `Content-Encoding` (aiohttp's parser decodes such a body) and no
upgrade, with one `Host` and no second of any header aiohttp's parser takes once
(`SINGLETON_HEADERS`: without `Host`, or with two, aiohttp answers 400),
that the Host and Origin policy lets on (`policy.decide`, as the guard) and that carries a
valid key when `apiKeys` are set (as `auth`), both read from its head before a byte of its
body is waited for. Anything
else, from the first byte the lane could not take, is handed to aiohttp's server: the
connection's protocol becomes aiohttp's, which is given every byte read so far and reads
the rest itself. So a preflight, a refused request, a missing key, a large or chunked body,
a malformed head, another route or an HTTP/1.0 client meets aiohttp, its middlewares and
their answers as before, and a connection that turns to aiohttp stays with it.

What aiohttp's server did for a request the lane serves, the lane does: the request's line
and headers must arrive within `security.limits.headerTimeout` of the connection's start or
of the end of the last answer, and a body may go `bodyTimeout` without a byte and take
`bodyDeadline` in all (answered 408 as the guard answers it), all from one timer for all
connections; a body counts among the bodies held (`guard.HeldBodies`) until its answer is
done, and one that does not fit is handed to aiohttp's guard, which waits for room; a client that leaves
cancels its handler (aiohttp's `handler_cancellation`); the router's CORS headers replace
the backend's; `logRequests` writes its line; the connection is kept alive unless the
client or the answer says otherwise, and requests a client sends ahead are read in turn,
each once the answer before it has left: while the client's socket takes no more (writes
paused) the lane reads nothing from it, so a client that sends without reading holds a
bounded few MiB, whoever answers. A client that half-closes (sends its end) is taken to have
left, as by aiohttp's server: cancel on disconnect rests on that end.
`SWAPLAB_LANE=off` sends every request to aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Protocol

import httptools
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_parser import SINGLETON_HEADERS
from multidict import CIMultiDict, CIMultiDictProxy

from swaplab.config.model import Config
from swaplab.config.security import Security
from swaplab.errors import SwaplabError
from swaplab.router.door.auth import key_matches, presented_key
from swaplab.router.door.guard import VERDICT, HeldBodies, apply_cors, body_late, body_stalled, facts_of
from swaplab.router.door.policy import Verdict, decide
from swaplab.router.door.reply import LaneRequest, LaneResponse, answer_bytes
from swaplab.router.door.routes import MODEL_ROUTES

log = logging.getLogger("swaplab.router")

LANE_ENV = "SWAPLAB_LANE"
LANE_ROUTES = frozenset(MODEL_ROUTES)
# aiohttp's own limit on a request line or header line: a head past it goes to aiohttp, which answers it.
HEAD_LIMIT = 8190
# Headers aiohttp's parser refuses twice (`Duplicate 'Host' header found.`, a 400): such a head goes to it.
# Each as a bit of `LaneConnection._singletons`: a head's are noted without a set of its own.
_SINGLETONS = {name.lower().encode(): 1 << bit for bit, name in enumerate(sorted(SINGLETON_HEADERS))}
_HOST = _SINGLETONS[b"host"]
# Bytes a client may send ahead while its request is served before its reading is paused.
READ_AHEAD = 1024 * 1024
# Verdicts kept per (Host, Origin, Sec-Fetch-Site): beyond this many, decided each time.
VERDICTS_KEPT = 256

Handler = Callable[[LaneRequest], Awaitable[web.StreamResponse]]


class ConfigSource(Protocol):
    config: Config


def _may_start_a_head(start: bytearray) -> bool:
    """Whether llhttp takes `start` as the beginning of a request's head (a part of it with no end yet)."""
    try:
        httptools.HttpRequestParser(object()).feed_data(start)
    except httptools.HttpParserError:
        return False
    return True


def lane_enabled() -> bool:
    """`SWAPLAB_LANE`: on (the default) or off."""
    wanted = os.environ.get(LANE_ENV, "").strip().lower()
    if wanted not in ("", "on", "off", "1", "0"):
        raise SwaplabError(f"{LANE_ENV}={wanted!r}: say on or off")
    return wanted not in ("off", "0")


def _internal_error() -> web.Response:
    """aiohttp's answer to a handler that failed (a new one each time: the CORS headers are the request's)."""
    return web.Response(status=500, text="500 Internal Server Error\n\nServer got itself in trouble",
                        content_type="text/plain")


class State(Enum):
    HEAD = "waiting for a request's line and headers"
    BODY = "reading a request's body"
    SERVING = "serving a request"
    GONE = "handed to aiohttp, or closed"


class _Logged:
    """What the request log reads of an answer the lane wrote."""

    __slots__ = ("status", "body_length")

    def __init__(self, status: int, body_length: int):
        self.status = status
        self.body_length = body_length


class LaneServer:
    """The protocol factory of the router's listening socket, and what its connections share.

    `fallback` is aiohttp's server (`web.AppRunner.server`), called for a protocol when a
    connection is handed over. Deadlines (a head, a body) are kept per connection and swept
    by one timer, so the common path arms no timer of its own.
    """

    def __init__(
        self, handler: Handler, source: ConfigSource, listen_loopback: bool,
        fallback: Callable[[], asyncio.Protocol], held: HeldBodies,
        access_log: AbstractAccessLogger | None = None,
    ):
        self.handler = handler
        self.source = source
        """Whose `config` is the one in force (the fleet's: a reload changes it there), read as an attribute."""
        self.listen_loopback = listen_loopback
        self.fallback = fallback
        self.access_log = access_log
        self.held = held
        """The bodies held at once, the guard's count: a lane request's body counts until it is answered."""
        self.connections: set[LaneConnection] = set()
        self.served = 0
        """Requests the lane took (served, or being served)."""
        self.handed_over = 0
        """Connections handed to aiohttp."""
        self._waiting: set[LaneConnection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._verdicts: dict[tuple[str | None, str | None, str | None], Verdict] = {}
        self._verdicts_of: Security | None = None

    def __call__(self) -> LaneConnection:
        return LaneConnection(self)

    def verdict(self, request: LaneRequest, security: Security) -> Verdict:
        """The Host and Origin policy's verdict on a lane request (`policy.decide`, as the guard asks it).

        A POST to a model route changes state whatever its path, so the verdict depends only
        on its `Host`, `Origin` and `Sec-Fetch-Site` and on the config's `security`: it is
        kept per those three (a few clients, a few values), and forgotten when a reload brings
        another `security`.
        """
        if security is not self._verdicts_of:
            self._verdicts, self._verdicts_of = {}, security
        headers = request.headers
        key = (headers.get("Host"), headers.get("Origin"), headers.get("Sec-Fetch-Site"))
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = decide(facts_of(request, self.listen_loopback), security)  # type: ignore[arg-type]
            if len(self._verdicts) < VERDICTS_KEPT:
                self._verdicts[key] = verdict
        return verdict

    def wait(self, connection: LaneConnection, seconds: float, by: float | None = None) -> None:
        """`connection` must make progress within `seconds` (its head, or its body's next byte), and by `by` at the latest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        connection.deadline = deadline if by is None or by > deadline else by
        self._waiting.add(connection)
        if self._sweep is None:
            limits = self.source.config.security.limits
            every = max(0.05, min(limits.header_timeout, limits.body_timeout, limits.body_deadline) / 4)
            self._sweep = loop.call_later(every, self._expire, every)

    def unwait(self, connection: LaneConnection) -> None:
        self._waiting.discard(connection)

    def _expire(self, every: float) -> None:
        self._sweep = None
        now = asyncio.get_running_loop().time()
        for connection in [c for c in self._waiting if c.deadline <= now]:
            self._waiting.discard(connection)
            connection.expire()
        if self._waiting:
            self._sweep = asyncio.get_running_loop().call_later(every, self._expire, every)

    async def shutdown(self, timeout: float) -> None:
        """Close idle connections; give requests being served `timeout` seconds, then cancel them."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        tasks = [c.task for c in self.connections if c.task is not None and not c.task.done()]
        for connection in list(self.connections):
            if connection.task is None or connection.task.done():
                connection.close()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        for connection in list(self.connections):
            connection.close()


class LaneConnection(asyncio.Protocol):
    """One client connection while the lane has it: the Protocol asyncio calls, llhttp's callbacks for its heads,
    and what a `LaneResponse` writes to (the `reply.Sink`)."""

    def __init__(self, server: LaneServer):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.buffer = bytearray()
        self.state = State.HEAD
        self.deadline = 0.0
        self.task: asyncio.Task[None] | None = None
        self.keep_alive = True
        """Whether the connection is kept after the answer being written (the client's and the answer's say)."""
        self.written = 0
        """Bytes of the current answer written so far (a failing handler's 500 only goes where none were)."""
        self._reading_paused = False
        self._writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        # the head being read
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._length = 0
        self._plain = True
        """No header that keeps the request off the lane (chunks, Expect, an upgrade, a body's encoding, a second `Host`
        or other singleton)."""
        self._singletons = 0
        """The headers that may come once (aiohttp's `SINGLETON_HEADERS`) the head has shown, a bit each (`_SINGLETONS`)."""
        self._body_at = 0
        self._body_end = 0
        self._body_by = 0.0
        """When the body being read must be whole (`bodyDeadline` after it began to wait), or 0."""
        self._holding = 0
        """Bytes of `server.held` this connection's request holds (its body's length, until answered)."""
        self._request: LaneRequest | None = None
        """The request whose head was admitted, while its body is read."""

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:  # as aiohttp sets them on its connections
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, (list, tuple)) and peer else None
        self.server.connections.add(self)
        self.server.wait(self, self.server.source.config.security.limits.header_timeout)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.state is State.SERVING:
            self._pace_reading()
            return
        try:
            self._advance()
        except Exception:  # never the lane's to fail a connection: aiohttp gets it as it came
            log.exception("the lane could not read a request from %s; aiohttp's server takes the connection", self.remote)
            if self.state in (State.HEAD, State.BODY):
                self._hand_over()
            else:
                self.close()

    def eof_received(self) -> bool | None:
        """The client sent its end: the connection closes, and a request being served is cancelled, as
        aiohttp's server (with `handler_cancellation`) does. A FIN is how a client that left is told from
        one still reading, so cancel on disconnect rests on it; a client that half-closes after a request
        the router cannot answer at once is taken to have left, on both front doors."""
        return None

    def connection_lost(self, error: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.unwait(self)
        self.transport = None
        self.state = State.GONE
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its handler is cancelled, which closes its upstream
        else:
            self._let_go()  # a body being read, or none (a request being served lets go when it ends)
        self._wake_writer()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._pace_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer()
        self._pace_reading()

    def _pace_reading(self) -> None:
        """Read from the client only while its answers leave and what it sent ahead is bounded.

        A client that sends without reading (pipelined requests the lane answers itself, a 404
        each) would otherwise have its answers pile up in the transport without bound: while
        writes are paused nothing more is read, and no further request is taken (`_serve`
        waits for the drain before the next).
        """
        transport = self.transport
        if transport is None or self.state is State.GONE:
            return
        hold = self._writing_paused or (self.state is State.SERVING and len(self.buffer) > READ_AHEAD)
        if hold and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not hold and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def _wake_writer(self) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        """Until the client's socket takes more (returns at once while it does)."""
        if not self._writing_paused:
            return
        if self.transport is None:
            raise ConnectionResetError("Connection lost")
        self._drain = asyncio.get_running_loop().create_future()
        await self._drain

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # llhttp's side (a request's head)
    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length":  # llhttp refuses a second one
            self._length = int(value) if value.isdigit() else -1
        elif lower in (b"transfer-encoding", b"expect", b"upgrade", b"content-encoding"):  # aiohttp decodes a body
            self._plain = False
        if lower in _SINGLETONS:
            bit = _SINGLETONS[lower]
            if self._singletons & bit:
                self._plain = False  # aiohttp's 400
            self._singletons |= bit
        self._headers.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    # the lane
    def _advance(self) -> None:
        """Read what the buffer holds of the next request; serve it once whole, or hand the connection over."""
        buffer = self.buffer
        if self.state is State.HEAD:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                # Too long for the lane, bare line feeds, or a start llhttp already refuses (aiohttp's parser
                # answers that at once, 400, where the lane would wait for an end that may never come).
                if len(buffer) > HEAD_LIMIT or b"\n\n" in buffer or not _may_start_a_head(buffer):
                    self._hand_over()
                return
            if end + 4 > HEAD_LIMIT or buffer.find(b"\n\n", 0, end) >= 0 or not self._read_head(end + 4):
                self._hand_over()
                return
            # Still waited for under the head's deadline: the body's replaces it just below (or the
            # hand-over, or the dispatch, ends the wait), in this same call.
            if not self._admit():
                # Refused, a preflight or no valid key: aiohttp's guard or key check answers from the
                # headers, before a byte of the body is read (and closes what it does not read).
                self._hand_over()
                return
            self.state = State.BODY
        if self.state is State.BODY:
            if len(buffer) < self._body_end:
                limits = self.server.source.config.security.limits
                if not self._body_by:
                    self._body_by = asyncio.get_running_loop().time() + limits.body_deadline
                self.server.wait(self, limits.body_timeout, self._body_by)
                return
            self.server.unwait(self)
            self._dispatch()

    def _read_head(self, size: int) -> bool:
        """Parse the head (`size` bytes); whether the lane takes its request."""
        self._url = b""
        self._headers = []
        self._length = 0
        self._plain = True
        self._singletons = 0
        parser = httptools.HttpRequestParser(self)
        try:
            parser.feed_data(bytes(self.buffer[:size]))
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):  # malformed, or an upgrade: aiohttp's
            return False
        if not self._plain or self._length < 0 or parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            return False
        if not self._singletons & _HOST:  # HTTP/1.1 without `Host`: aiohttp's 400
            return False
        if parser.should_upgrade() or self._length > self.server.source.config.security.limits.large_body_bytes:
            return False
        if not self._url.isascii() or self._url.partition(b"?")[0].decode() not in LANE_ROUTES:
            return False
        self.keep_alive = parser.should_keep_alive()
        if not self.keep_alive and len(self.buffer) > size + self._length:
            return False  # bytes after a request that closes: aiohttp's parser refuses the read (400)
        self._body_at = size
        self._body_end = size + self._length
        return True

    def _admit(self) -> bool:
        """The head is read: whether the policy and the keys let its request on (then it waits for its body)."""
        config = self.server.source.config
        request = LaneRequest(
            "POST", self._url.decode(), CIMultiDictProxy(CIMultiDict(self._headers)), b"", self.remote, self,
        )
        verdict = self.server.verdict(request, config.security)
        if not verdict.goes_on:
            return False
        keys = config.api_keys
        if keys and not key_matches(presented_key(request), keys):  # type: ignore[arg-type]
            return False
        if not self.server.held.take(self._length, config.security.limits.max_held_body_bytes):
            return False  # no room for its body now: aiohttp's guard waits for room, or answers 503
        self._holding = self._length
        request[VERDICT] = verdict
        self._request = request
        return True

    def _dispatch(self) -> None:
        """The whole request is here: serve it."""
        request, self._request = self._request, None
        assert request is not None  # admitted with its head
        request.body = bytes(self.buffer[self._body_at:self._body_end])
        del self.buffer[:self._body_end]
        self._body_by = 0.0
        self.server.served += 1
        self.state = State.SERVING
        self.written = 0
        self.task = asyncio.get_running_loop().create_task(self._serve(request))

    async def _serve(self, request: LaneRequest) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        logged: _Logged | None = None
        try:
            try:
                response = await self.server.handler(request)
            except web.HTTPException as refusal:  # raised as an answer, as aiohttp takes it
                response = refusal
            if isinstance(response, LaneResponse):
                if not response.prepared:
                    await response.prepare(request)
                await response.write_eof()
                self.keep_alive = self.keep_alive and response.keep_alive
                logged = _Logged(response.status, response.body_length)
            else:
                logged = self._answer(request, response)  # type: ignore[arg-type]
            # The next request sent ahead waits until this answer has left (as aiohttp's writer drains).
            if self._writing_paused:
                await self.drain()
        except asyncio.CancelledError:
            # The client left, or the request was cancelled (`POST /api/inflight/{id}/cancel` while
            # it waited): as aiohttp's server, the connection ends.
            self.close()
            return
        except ConnectionError:  # the client's socket went while an answer was written
            self.close()
            return
        except Exception:
            log.exception("Error handling request from %s", self.remote)
            if self.written or self.transport is None:
                self.close()
                return
            self.keep_alive = False
            logged = self._answer(request, _internal_error())
        finally:
            self.task = None
            self._let_go()
        if self.server.access_log is not None and logged is not None:
            try:
                self.server.access_log.log(request, logged, loop.time() - began)  # type: ignore[arg-type]
            except Exception:
                log.exception("the request log failed")
        self._next()

    def _answer(self, request: LaneRequest, response: web.Response) -> _Logged:
        """A whole answer the handler returned unsent (an error, a refusal), written as aiohttp would."""
        apply_cors(request, response)  # type: ignore[arg-type]
        self.keep_alive = self.keep_alive and response.keep_alive is not False
        data = answer_bytes(response, self.keep_alive)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
        return _Logged(response.status, len(response.body or b""))  # type: ignore[arg-type]

    def _next(self) -> None:
        """The answer is written: close, or wait for the next request (perhaps read already)."""
        if self.transport is None or self.transport.is_closing():
            return
        if not self.keep_alive:
            self.transport.close()
            return
        self.state = State.HEAD
        self.server.wait(self, self.server.source.config.security.limits.header_timeout)
        if self.buffer:
            self._advance()
        if self._writing_paused or self._reading_paused or len(self.buffer) > READ_AHEAD:
            self._pace_reading()  # once the next request sent ahead is taken: more than READ_AHEAD of them stay unread

    def expire(self) -> None:
        """Its deadline passed: a head that never ended closes the connection; a body that stalled, or took
        too long in all, is answered 408."""
        if self.transport is None or self.state not in (State.HEAD, State.BODY):
            return
        if self.state is State.BODY:
            limits = self.server.source.config.security.limits
            late = self.deadline >= self._body_by
            response = body_late(limits) if late else body_stalled(limits)
            self.transport.write(answer_bytes(response, keep_alive=False))
        self.close()

    def _let_go(self) -> None:
        """The request's body no longer counts in what the router holds."""
        if self._holding:
            self.server.held.give(self._holding)
            self._holding = 0

    def _hand_over(self) -> None:
        """From here on the connection is aiohttp's: its protocol gets every byte read so far."""
        transport = self.transport
        self.server.unwait(self)
        self.server.connections.discard(self)
        self._let_go()
        self.state = State.GONE
        if transport is None or transport.is_closing():
            return
        self.server.handed_over += 1
        data, self.buffer = bytes(self.buffer), bytearray()
        protocol = self.server.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._reading_paused:
            transport.resume_reading()
        if data:
            protocol.data_received(data)

