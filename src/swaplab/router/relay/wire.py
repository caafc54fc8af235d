"""The router's own HTTP/1.1 client for model requests to plain-http upstreams: one concept, a pooled connection that can splice.

aiohttp's client costs each request a `ClientRequest` (URL, cookies, tracing, headers
sorted and re-checked) and each relayed chunk a wake-up of the handler task: the parser
feeds a `StreamReader`, which resolves a future, which schedules the task, which reads
the chunk and writes it. With a few hundred streams that per-chunk round trip is most of
the router's CPU. Here a request is its head as bytes, written on a pooled connection,
and its answer is parsed by llhttp (httptools, the parser uvicorn uses) inside the
connection's `data_received`. Once the relay has sent the client its headers and the
first chunk, it hands the client's transport to the connection (`WireResponse.splice`):
from then on each read from the upstream's socket becomes one write to the client's, in
the same callback, with no task in between. Backpressure stays: a client's full buffer
pauses reading from the upstream until it drains.

What takes this path: POST to an `http://` upstream without credentials in its URL
(`UpstreamPools.open`); everything else (https, GET, websockets, peer probes) keeps
aiohttp's client. Errors come out as the same `UpstreamError` and aiohttp exception
types that `proxy.open_upstream` and `answer` handle, so the relay's recovery,
cancel and error events are the same code.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from swaplab.config.model import Timeouts

# Unanswered keep-alive probes before a connection counts as dead (Go's default, and Linux's is 9 too).
KEEPALIVE_PROBES = 9
NO_IDLE_LIMIT = 24 * 3600.0
ATTEMPTS = 3
# The reader (not spliced) stops reading from the upstream above this many buffered bytes.
READ_BUFFER_HIGH = 1024 * 1024
# A body this small goes out in one write with its head.
COALESCE_BODY_BYTES = 64 * 1024


class WireError(Exception):
    """The request could not be sent or answered; `proxy.UpstreamError`'s fields, raised as one by `open_wire`."""

    def __init__(self, message: str, status: int = 502, *, unreachable: bool = False):
        super().__init__(message)
        self.status = status
        self.unreachable = unreachable


class _Broken(Exception):
    """The connection closed (or failed to parse) before the response's headers were all read."""

    def __init__(self, message: str, *, before_any_byte: bool):
        super().__init__(message)
        self.before_any_byte = before_any_byte


def request_head(method: str, url: URL, headers: Mapping[str, str], body_length: int) -> bytes:
    """The request line and headers as they go on the wire; a line break in a header is refused (header injection)."""
    host = url.raw_host or ""
    if ":" in host:
        host = f"[{host}]"
    if url.explicit_port is not None:
        host = f"{host}:{url.explicit_port}"
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or "\0" in value:
            raise WireError(f"header {name!r} holds a line break or NUL; it is not sent", status=400)
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {body_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


class WirePool:
    """Idle keep-alive connections to one upstream address, with its timeouts (`proxy.new_upstream_session`'s)."""

    def __init__(self, host: str, port: int, timeouts: Timeouts, connect_limit: float | None):
        self.host = host
        self.port = port
        self.timeouts = timeouts
        self.connect_limit = connect_limit
        self.idle_limit = timeouts.idle_conn or NO_IDLE_LIMIT
        self._idle: list[Connection] = []
        """Idle connections, the longest idle first; each knows since when (`Connection.idle_since`)."""
        self._all: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None

    async def connection(self) -> tuple[Connection, bool]:
        """A connection to use, and whether it was pooled (so may have been closed by the upstream meanwhile)."""
        while self._idle:
            connection = self._idle.pop()  # the most recently used: the least likely to have been closed
            if connection.usable():
                return connection, True
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_limit):
                _, connection = await loop.create_connection(lambda: Connection(self), self.host, self.port)
        except TimeoutError:
            raise WireError(
                f"cannot connect to {self.host}:{self.port} (no connection within {self.connect_limit:g} s, "
                "timeouts.connect)", status=504, unreachable=True,
            ) from None
        except OSError as error:
            reason = error.strerror or str(error)
            raise WireError(f"cannot connect to {self.host}:{self.port} ({reason})", unreachable=True) from None
        if self.timeouts.keepalive:
            set_keepalive(connection.transport.get_extra_info("socket"), self.timeouts.keepalive)
        return connection, False

    def put(self, connection: Connection) -> None:
        """`connection` answered in full and may be used again; it closes after the idle limit.

        One timer per pool, not one per connection put back (a timer armed and cancelled for
        every request cost more than the rest of the pool's work): the sweep closes what has
        been idle for the limit and sets itself for the next one due.
        """
        connection.response = None
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        self._idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_at(connection.idle_since + self.idle_limit, self._expire)

    def _expire(self) -> None:
        self._sweep = None
        if not self._idle:
            return
        loop = asyncio.get_running_loop()
        # The clock's resolution: a timer may run a hair before its due time.
        cutoff = loop.time() - self.idle_limit + 1e-3
        idle = self._idle
        expired = 0
        while expired < len(idle) and idle[expired].idle_since <= cutoff:
            expired += 1
        stale, self._idle = idle[:expired], idle[expired:]
        for connection in stale:
            connection.close()
        if self._idle:
            self._sweep = loop.call_at(self._idle[0].idle_since + self.idle_limit, self._expire)

    def adopt(self, connection: Connection) -> None:
        self._all.add(connection)

    def forget(self, connection: Connection) -> None:
        self._all.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        """Close every connection, busy or idle (the router is stopping)."""
        for connection in list(self._all):
            connection.close()
        self._idle.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None


def set_keepalive(sock: socket.socket | None, interval: float) -> None:
    """TCP keep-alive on `sock`: probes after `interval` idle seconds, then every `interval` (Go's dialer's)."""
    if sock is None:
        return
    seconds = max(1, round(interval))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle_option = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)  # macOS
    if idle_option is not None:
        sock.setsockopt(socket.IPPROTO_TCP, idle_option, seconds)
    if hasattr(socket, "TCP_KEEPINTVL"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds)
    if hasattr(socket, "TCP_KEEPCNT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)


class Connection(asyncio.Protocol):
    """One TCP connection to an upstream: the protocol asyncio calls, and llhttp's callbacks for the answer on it."""

    def __init__(self, pool: WirePool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        # llhttp hands the body over piece by piece (an HTTP chunk each); the pieces of one
        # read are gathered by a C call and handled once, after the parser returns.
        self.bodies: list[bytes] = []
        self.on_body = self.bodies.append
        self.parser = httptools.HttpResponseParser(self)
        self.response: WireResponse | None = None
        self.idle_since = 0.0
        """When it was last put back in the pool (the loop's clock)."""
        self._headers: list[tuple[str, str]] = []
        self._reason = ""

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.pool.adopt(self)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:  # bytes after an answer: the connection cannot be trusted again
            self.close()
            return
        response.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.bodies.clear()
            response.broken(f"the upstream's answer is not valid HTTP ({error})")
            self.close()
            return
        if self.bodies:
            if response.complete:  # what came after the answer is no part of it
                self.bodies.clear()
            else:
                self._hand_over(response)

    def _hand_over(self, response: WireResponse) -> None:
        """The body read so far: to the client's socket when spliced, else to the reader."""
        bodies = self.bodies
        body = bodies[0] if len(bodies) == 1 else b"".join(bodies)
        bodies.clear()
        sink = response.sink
        if sink is None:
            response.feed(body)
            return
        if response.observe is not None:
            response.observe(body)
        if sink.is_closing():  # the client left; the handler's cancel closes this connection
            self.transport.pause_reading()  # type: ignore[union-attr]
            return
        sink.write(b"%x\r\n%b\r\n" % (len(body), body))  # one HTTP chunk per read
        if sink.get_write_buffer_size() > response.sink_limit:
            self.transport.pause_reading()  # type: ignore[union-attr]
            response.wake(drain=True)

    def connection_lost(self, error: Exception | None) -> None:
        self.pool.forget(self)
        response, self.response = self.response, None
        if response is not None and not response.complete and response.until_close and error is None and (
            not response.closed
        ):  # a body without a length ends where the upstream closes (llhttp is not told of the end)
            if self.bodies:
                self._hand_over(response)
            response.finished(False)
        elif response is not None and not response.complete:
            response.broken("the upstream closed the connection mid-response" if response.has_headers
                            else "the upstream closed the connection before answering", error)
        self.transport = None

    def pause_writing(self) -> None:  # a request body larger than the socket takes: asyncio buffers it
        pass

    def resume_writing(self) -> None:
        pass

    # llhttp's side
    def on_status(self, reason: bytes) -> None:
        self._reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        response = self.response
        status = self.parser.get_status_code()
        if response is not None and response.has_headers:  # a second answer to one request: not pooled
            self.close()
            return
        if response is None or status < 200:  # 1xx: an interim answer; the real one follows
            self._headers, self._reason = [], ""
            return
        response.headers_arrived(status, self._reason, self._headers)
        self._headers, self._reason = [], ""

    def on_message_complete(self) -> None:
        response = self.response
        if response is None or not response.has_headers:  # the end of a 1xx
            return
        if response.complete:  # the end of a second answer (the connection is closing)
            self.bodies.clear()
            return
        if self.bodies:
            if response.sink is not None:  # the body's last piece goes with the client's end of body, in one write
                bodies = self.bodies
                response.tail = bodies[0] if len(bodies) == 1 else b"".join(bodies)
                bodies.clear()
                if response.observe is not None:
                    response.observe(response.tail)
            else:
                self._hand_over(response)
        response.finished(self.parser.should_keep_alive())

    # the pool's side
    def start(self, response: WireResponse) -> None:
        self.response = response

    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class WireResponse:
    """The answer to one request on a `Connection`: what the relay reads of an aiohttp `ClientResponse`, and `splice`.

    `status`, `reason`, `headers`, `content_type`, `content_length`, `url`, `content`
    (`readany`, `read`), `release()`, `close()`, `closed`.
    """

    __slots__ = (
        "connection", "url", "status", "reason", "headers", "content_type", "content_length", "content",
        "has_headers", "complete", "received", "keep_alive", "sink", "sink_limit", "observe", "tail", "until_close",
        "_headers_waiter", "_error", "_buffer", "_buffered", "_waiter", "_drain", "_closed", "_paused",
    )

    def __init__(self, connection: Connection, url: URL):
        self.connection = connection
        self.url = url
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self.content_type = "application/octet-stream"
        self.content_length: int | None = None
        self.content = self
        self.has_headers = False
        self.complete = False
        self.received = False  # any byte of the answer came back
        self.keep_alive = False
        self.sink: asyncio.Transport | None = None
        self.sink_limit = 0
        self.observe: Callable[[bytes], None] | None = None
        self.until_close = False
        """The body has neither a length nor chunks: it ends when the upstream closes the connection."""
        self.tail = b""
        """The last piece of a spliced body, left for the relay to send with the end of the client's body."""
        self._headers_waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._error: BaseException | None = None
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._drain = False
        self._closed = False
        self._paused = False  # the reader stopped reading from the upstream (its buffer is full)

    # the connection's side
    def headers_arrived(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        self.status = status
        self.reason = reason
        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        content_type = self.headers.get("Content-Type")
        if content_type:
            self.content_type = content_type.partition(";")[0].strip().lower()
        length = self.headers.get("Content-Length")
        if length is not None and length.isdigit():
            self.content_length = int(length)
        self.until_close = (
            self.content_length is None and status not in (204, 304)
            and "chunked" not in self.headers.get("Transfer-Encoding", "").lower()
        )
        self.has_headers = True
        if not self._headers_waiter.done():
            self._headers_waiter.set_result(None)

    def feed(self, body: bytes) -> None:
        self._buffer.append(body)
        self._buffered += len(body)
        if self._buffered > READ_BUFFER_HIGH and not self._paused and self.connection.transport is not None:
            self._paused = True
            self.connection.transport.pause_reading()
        self.wake()

    def finished(self, keep_alive: bool) -> None:
        self.complete = True
        self.keep_alive = keep_alive
        self.wake()

    def broken(self, message: str, cause: BaseException | None = None) -> None:
        if not self.has_headers:
            error: BaseException = _Broken(message, before_any_byte=not self.received)
            if not self._headers_waiter.done():
                self._headers_waiter.set_exception(error)
                self._headers_waiter.exception()  # retrieved: a cancelled wait must not log it
        else:
            error = aiohttp.ClientPayloadError(message)
        self._error = error
        self.wake()

    def wake(self, drain: bool = False) -> None:
        if drain:
            self._drain = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # the relay's side
    async def wait_headers(self, limit: float | None) -> None:
        if limit:
            async with asyncio.timeout(limit):
                await self._headers_waiter
        else:
            await self._headers_waiter

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        await waiter

    async def readany(self) -> bytes:
        """What has arrived of the body ("" at its end), waiting for some."""
        while not self._buffer and not self.complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self._take()

    async def read(self, limit: int = -1) -> bytes:
        """At most `limit` bytes of the body as soon as some arrive; all of it if `limit` is -1."""
        if limit < 0:
            while not self.complete:
                if self._error is not None:
                    raise self._error
                await self._wait()
            return self._take()
        data = await self.readany() if limit else b""
        if len(data) > limit:  # the rest stays for the next read
            self._buffer.insert(0, data[limit:])
            self._buffered += len(data) - limit
            data = data[:limit]
        return data

    def _take(self) -> bytes:
        chunks, self._buffer, self._buffered = self._buffer, [], 0
        if self._paused:
            self._paused = False
            if self.connection.transport is not None:
                self.connection.transport.resume_reading()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def splice(
        self, sink: asyncio.Transport, drain: Callable[[], object], observe: Callable[[bytes], None] | None
    ) -> bytes:
        """Copy the rest of a chunked body straight to `sink` (the client's transport, its headers sent), in HTTP chunks.

        Returns at the body's end, with its last piece (`tail`), which is the caller's to
        send with the client's end of body (one write for both); raises `aiohttp.ClientPayloadError` if the upstream
        breaks off. `drain` is the client writer's (awaited while its buffer is full);
        `observe` sees every chunk as relayed.
        """
        limit = sink.get_write_buffer_limits()[1]
        self.sink_limit = limit if limit > 0 else 64 * 1024
        self.observe = observe
        if self._buffer:
            waiting = self._take()
            if observe is not None:
                observe(waiting)
            sink.write(b"%x\r\n%b\r\n" % (len(waiting), waiting))
        self.sink = sink
        try:
            while not self.complete:
                if self._error is not None:
                    raise self._error
                if self._drain:
                    self._drain = False
                    await drain()  # type: ignore[misc]
                    if self.connection.transport is not None:
                        self.connection.transport.resume_reading()
                    continue
                await self._wait()
        finally:
            self.sink = None
            self.observe = None
        tail, self.tail = self.tail, b""
        return tail

    @property
    def buffered(self) -> int:
        """Bytes of the body read from the upstream and not yet taken (a keep-alive's stop may have let more in)."""
        return self._buffered

    @property
    def closed(self) -> bool:
        return self._closed

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool if it can carry another."""
        if self._closed:
            return
        self._closed = True
        connection = self.connection
        if self.complete and self.keep_alive and connection.usable() and connection.response is self:
            connection.pool.put(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Drop the connection: the upstream sees its client go away (a cancel, a client that left)."""
        self._closed = True
        self.connection.close()


async def open_wire(
    pool: WirePool, method: str, url: URL, headers: Mapping[str, str], body: bytes, response_header_timeout: float | None
) -> WireResponse:
    """Send the request on a pooled connection and return once the answer's headers are in.

    A pooled connection that the upstream closed while it was idle fails before any byte
    of an answer; the request never reached the model and goes again on a fresh one
    (llama.cpp's server closes idle keep-alive connections after 5 s).
    """
    head = request_head(method, url, headers, len(body))
    for attempt in range(1, ATTEMPTS + 1):
        connection, reused = await pool.connection()
        response = WireResponse(connection, url)
        connection.start(response)
        transport = connection.transport
        assert transport is not None
        if len(body) <= COALESCE_BODY_BYTES:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        try:
            await response.wait_headers(response_header_timeout)
            return response
        except _Broken as error:
            connection.close()
            if reused and error.before_any_byte and attempt < ATTEMPTS:
                continue
            raise WireError(f"{url} closed the connection before answering ({error})", unreachable=True) from None
        except TimeoutError:
            connection.close()
            raise WireError(
                f"upstream {url} sent no response header within {response_header_timeout:g} s (timeouts.responseHeader)",
                status=504,
            ) from None
        except BaseException:
            connection.close()
            raise
    raise AssertionError("unreachable")
