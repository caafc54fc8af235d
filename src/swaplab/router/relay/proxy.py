"""The relay: one request to an upstream server and its answer back to the client, byte for byte, with backpressure.

The request goes on aiohttp's client or the router's own (`wire`), pooled per upstream
(`UpstreamPools`); its answer's head becomes the client's (`reply_head`) and its body is
copied as it arrives (`copy`, `copy_reshaped`). The relay knows nothing of heartbeats or of
the observation: `path.exchange` calls them around it, and gives it the observation's
`on_chunk` to call per chunk.

The router's handler task is cancelled the moment its client disconnects (aiohttp's
handler cancellation), and cancellation closes the upstream connection here, so the
backend stops generating at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from swaplab.config.model import Timeouts
from swaplab.router.door.reply import send_whole, stream_response
from swaplab.router.relay.reshape import Reshape
from swaplab.router.relay.wire import WireError, WirePool, WireResponse, open_wire, set_keepalive

log = logging.getLogger("swaplab.router")

# Headers of one hop, not the message (RFC 9110 7.6.1), and those aiohttp recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length",
        # The router reads the whole body before it picks the upstream, and aiohttp
        # answered the client's `100-continue` then; forwarded, it would make aiohttp
        # wait (without a limit) for a `100 Continue` the upstream may never send.
        "expect",
    }
)
# Not sent upstream with a request: those, and its body's encoding, which aiohttp's server undid.
NOT_FORWARDED = HOP_BY_HOP | {"content-encoding"}
# A pooled connection the upstream closed while idle fails on reuse before any
# response byte (llama.cpp's server closes idle keep-alive connections after 5 s);
# such a request never reached the model and is retried on a fresh connection.
RETRY_BEFORE_RESPONSE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
ATTEMPTS = 3
NO_IDLE_LIMIT = 24 * 3600.0


class UpstreamError(Exception):
    """The upstream could not be reached or gave no response header in time.

    `unreachable`: no response byte came back because the connection could not be made
    or was reset; for a backend the router owns, a sign that its server may be gone.
    """

    def __init__(self, message: str, status: int = 502, *, unreachable: bool = False):
        super().__init__(message)
        self.status = status
        self.unreachable = unreachable


def new_upstream_session(base_url: str | None = None, timeouts: Timeouts | None = None) -> aiohttp.ClientSession:
    """A connection pool for one upstream, with its `timeouts` (llama-swap's transport settings, as aiohttp has them).

    - `connect`: the limit on making a connection (aiohttp's `sock_connect`); for an
      https upstream it covers the TLS handshake too, so `tlsHandshake` is added to it.
    - `idleConn`: idle connections close after it (the connector's `keepalive_timeout`).
    - `keepalive`: TCP keep-alive probes on every connection it makes, first after that
      many idle seconds and then every that many (Go's dialer sets both the same).
    `responseHeader` is per request (`open_upstream`); `expectContinue` has nothing to wait
    for, as the body is read before the upstream is chosen (`HOP_BY_HOP` drops `Expect`).
    """
    timeouts = timeouts or Timeouts()
    connector = aiohttp.TCPConnector(
        limit=0,
        keepalive_timeout=timeouts.idle_conn or NO_IDLE_LIMIT,
        socket_factory=_keepalive_sockets(timeouts.keepalive) if timeouts.keepalive else None,
    )
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,  # relay bytes as the upstream sent them
        # No total limit: a generation may rightly stream for an hour.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_limit(base_url or "", timeouts)),
    )


def connect_limit(base_url: str, timeouts: Timeouts) -> float | None:
    """Seconds a new connection to `base_url` may take (None: no limit)."""
    if timeouts.connect is None:
        return None
    if base_url.startswith("https:") and timeouts.tls_handshake:
        return timeouts.connect + timeouts.tls_handshake
    return timeouts.connect


def _keepalive_sockets(interval: float) -> Callable[[tuple], socket.socket]:
    """A socket factory that turns TCP keep-alive on: probes after `interval` idle seconds, then every `interval`."""

    def make(address_info: tuple) -> socket.socket:
        family, kind, protocol = address_info[0], address_info[1], address_info[2]
        sock = socket.socket(family=family, type=kind, proto=protocol)
        set_keepalive(sock, interval)
        return sock

    return make


class UpstreamPools:
    """One connection pool per upstream address and timeouts, for requests and peer probes alike.

    Keyed by what defines the connections, so a reload that changes a model's proxy or
    timeouts gets a new pool while requests in flight finish on the old one.
    """

    def __init__(self, wire: bool = True) -> None:
        self._sessions: dict[tuple[str, Timeouts], aiohttp.ClientSession] = {}
        self._wires: dict[tuple[str, int, Timeouts], WirePool] = {}
        self.wire = wire
        """Model requests (POST to a plain-http upstream) go on the router's own client (`wire`)."""

    def session(self, base_url: str, timeouts: Timeouts) -> aiohttp.ClientSession:
        key = (base_url, timeouts)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = new_upstream_session(base_url, timeouts)
        return session

    async def open(
        self, method: str, url: str, timeouts: Timeouts, headers: CIMultiDict[str], body: bytes
    ) -> aiohttp.ClientResponse | WireResponse:
        """Send one request upstream and return its answer once its headers are in (`open_upstream`'s contract).

        A POST to an `http://` upstream goes on the router's own client (`wire`), the rest on aiohttp's.
        """
        target = URL(url)
        if self.wire and method == "POST" and target.scheme == "http" and not target.user and target.host:
            port = target.port or 80
            key = (target.host, port, timeouts)
            pool = self._wires.get(key)
            if pool is None:
                pool = self._wires[key] = WirePool(target.host, port, timeouts, connect_limit(url, timeouts))
            try:
                return await open_wire(pool, method, target, headers, body, timeouts.response_header)
            except WireError as error:
                raise UpstreamError(str(error), error.status, unreachable=error.unreachable) from None
        return await open_upstream(
            self.session(url, timeouts), method, url, headers, body, response_header_timeout=timeouts.response_header
        )

    async def close(self) -> None:
        """Drop every pool (the router is stopping)."""
        wires, self._wires = list(self._wires.values()), {}
        for pool in wires:
            pool.close()
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()


def forward_headers(incoming: Mapping[str, str], extra: Mapping[str, str] | None = None) -> CIMultiDict[str]:
    """The client's headers, less `NOT_FORWARDED` (the body goes decoded), plus `extra`.

    A client that asked for no encoding gets none: the relay passes bytes through as the
    upstream sent them, so aiohttp's own `Accept-Encoding: gzip` must not go out in its name
    (cheaper than the session's `skip_auto_headers`: a sorted copy of each request's headers).
    """
    headers = CIMultiDict([(k, v) for k, v in incoming.items() if k.lower() not in NOT_FORWARDED])
    if "Accept-Encoding" not in headers:
        headers["Accept-Encoding"] = "identity"
    if extra:
        for key, value in extra.items():
            headers[key] = value
    return headers


async def open_upstream(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    headers: CIMultiDict[str],
    body: bytes,
    *,
    response_header_timeout: float | None = None,
) -> aiohttp.ClientResponse:
    """Send the request and return once the upstream's response headers have arrived.

    The session's own timeout limits the connection (`new_upstream_session`);
    `response_header_timeout` (`timeouts.responseHeader`) limits the wait for the answer.
    """
    for attempt in range(1, ATTEMPTS + 1):
        try:
            pending = session.request(method, url, headers=headers, data=body or None, allow_redirects=False)
            if response_header_timeout:
                return await asyncio.wait_for(pending, response_header_timeout)
            return await pending
        except aiohttp.ClientConnectorError as error:  # before its parent ClientOSError: no retry helps
            number = error.os_error.errno
            reason = os.strerror(number) if number else str(error.os_error)
            raise UpstreamError(f"cannot connect to {url} ({reason})", unreachable=True) from None
        except RETRY_BEFORE_RESPONSE as error:
            if attempt == ATTEMPTS:
                raise UpstreamError(
                    f"{url} closed the connection before answering ({type(error).__name__})", unreachable=True
                ) from None
            log.debug("retrying %s on a fresh connection after: %s", url, error)
        except asyncio.TimeoutError:
            raise UpstreamError(
                f"upstream {url} sent no response header within {response_header_timeout:g} s "
                "(timeouts.responseHeader)",
                status=504,
            ) from None
        except aiohttp.ClientError as error:
            raise UpstreamError(f"upstream {url} failed: {error}") from None
    raise AssertionError("unreachable")


def reply_head(
    request: web.Request, upstream: aiohttp.ClientResponse | WireResponse, whole: bytes | None = None
) -> web.StreamResponse:
    """The client's response with the upstream's status and headers (less `HOP_BY_HOP`), not yet prepared;
    `whole` is the body when the router already read it (an error answer `read_error` rephrased).

    Its head goes out with the body's first bytes (or a heartbeat, or the end), in one write, as
    Go's ReverseProxy (llama-swap) sends it: aiohttp's StreamResponse would send it alone at
    once, a system call more per request.
    """
    response = stream_response(request, status=upstream.status, reason=upstream.reason)
    headers = response.headers
    for key, value in upstream.headers.items():
        if key.lower() not in HOP_BY_HOP:
            headers.add(key, value)
    headers["X-Accel-Buffering"] = "no"
    if upstream.content_length is not None:
        response.content_length = upstream.content_length if whole is None else len(whole)
    response._send_headers_immediately = False
    return response


async def copy(
    request: web.Request,
    upstream: aiohttp.ClientResponse | WireResponse,
    response: web.StreamResponse,
    chunk: bytes,
    on_chunk: Callable[[bytes], None],
) -> None:
    """The upstream's body, from `chunk` (its first bytes) on, to the client's prepared `response` as it
    arrives, then its end; `on_chunk` sees each chunk. Raises aiohttp's payload or connection error
    where the upstream breaks off.

    Each write awaits the client's socket (backpressure). A chunked body from the router's own
    client (`wire`) goes from the upstream's socket to the client's in the read callback, after
    its first chunk, which goes with the head in one write.
    """
    last = b""
    if chunk and isinstance(upstream, WireResponse) and request.transport is not None and (
        response.headers.get("Transfer-Encoding") == "chunked"
    ):
        on_chunk(chunk)
        if upstream.complete and not upstream.buffered:  # all of it is here: head, body and end in one write
            last = chunk
        else:
            await response.write(chunk)
            last = await upstream.splice(request.transport, request.writer.drain, on_chunk)
        chunk = b""
    content = upstream.content
    while chunk:
        on_chunk(chunk)
        await response.write(chunk)
        chunk = await content.readany()
    await response.write_eof(last)


async def copy_reshaped(
    request: web.Request,
    upstream: aiohttp.ClientResponse | WireResponse,
    response: web.StreamResponse | None,
    reshape: Reshape,
    chunk: bytes,
    on_chunk: Callable[[bytes], None],
) -> web.StreamResponse:
    """`copy`, with each chunk fed to `reshape` and what it gives written to the streamed `response`;
    without one (a reply answered whole), the whole reply at the end. Returns the client's response."""
    content = upstream.content
    while chunk:
        on_chunk(chunk)
        out = reshape.feed(chunk)
        if out and response is not None:
            await response.write(out)  # awaits the client's socket: backpressure
        chunk = await content.readany()
    tail = reshape.finish()
    if response is None:
        return await send_whole(request, reshape.status, tail, reshape.content_type)
    if tail:
        await response.write(tail)
    await response.write_eof()
    return response


# An upstream's error answer is read this far for its message.
ERROR_BODY_BYTES = 64 * 1024

async def read_error(upstream: aiohttp.ClientResponse | WireResponse) -> bytes | None:
    """A small error answer of known length, read whole (for the router to add what to change); None
    when it is large, unsized or encoded (relayed as it comes), or broke off (the relay then meets
    the break as any other)."""
    length = upstream.content_length
    if length is None or length > ERROR_BODY_BYTES or upstream.headers.get("Content-Encoding", "identity") != "identity":
        return None
    try:
        return await upstream.content.read()
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        return None


def error_text(body: bytes) -> str:
    """The message of an OpenAI- or Anthropic-style JSON error, else the body as text."""
    text = body.decode(errors="replace")
    try:
        document = json.loads(text)
    except ValueError:
        return text.strip()
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    return text.strip()
