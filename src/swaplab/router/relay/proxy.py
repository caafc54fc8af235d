"""Relaying one request to an upstream server, byte for byte, with backpressure.

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
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from swaplab.config.model import Timeouts
from swaplab.router.door.dialect import dialect_of
from swaplab.router.relay.keepalive import KeepAlive, error_event
from swaplab.router.watch.observe import RequestObservation
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


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    observation: RequestObservation | None = None,
    keepalive: KeepAlive | None = None,
    explain_break: Callable[[], Awaitable[str]] | None = None,
    explain_error: ExplainError | None = None,
) -> tuple[web.StreamResponse, bool]:
    """Copy the upstream's response to the client as it arrives; close the upstream on any exit.

    Returns the client's response and whether the upstream's response arrived in full.
    `observation`, when given, sees the status and every chunk (and any error event the
    router adds), and is finished on every way out (a client that went away included). `keepalive` is the client's heartbeat:
    if it already committed an event stream, the upstream's events continue it (and an
    upstream that answers anything but an event stream ends it with an error event);
    otherwise it may still beat into the upstream's own event stream until the first
    chunk. `explain_break` says, in the router's words, why an upstream broke off;
    `explain_error` may add what to change to a small error answer (`contextlimit`), which
    is then read whole: a success never meets it.
    """
    content_type = upstream.content_type
    is_event_stream = content_type == "text/event-stream"
    dialect = keepalive.dialect if keepalive is not None else dialect_of(request.path)
    if observation is not None:
        observation.on_headers(upstream.status, content_type)
    completed = False
    disconnected = False
    failure = None
    response: web.StreamResponse | None = keepalive.response if keepalive is not None else None
    try:
        if response is not None and (upstream.status != 200 or not is_event_stream):
            await keepalive.stop()  # type: ignore[union-attr]
            answer = await upstream.content.read(4096)
            if observation is not None:
                observation.on_chunk(answer)
            if explain_error is not None:
                answer = explain_error(upstream.status, answer) or answer
            failure = f"the backend answered HTTP {upstream.status}: {error_text(answer)}"
            event = error_event(failure, dialect, upstream.status)
            if observation is not None:
                observation.wrote(event)
            await response.write(event)
            await response.write_eof()
            return response, False
        whole = None
        if explain_error is not None and response is None and upstream.status >= 400:
            whole = await _read_error(upstream, explain_error)
        if response is None:
            response = stream_response(request, status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            response.headers["X-Accel-Buffering"] = "no"
            if upstream.content_length is not None:
                response.content_length = upstream.content_length if whole is None else len(whole)
            if keepalive is not None:
                keepalive.hold()
            # The headers go out with the body's first bytes (or a heartbeat, or the end), in one
            # write, as Go's ReverseProxy (llama-swap) sends them: aiohttp's StreamResponse would
            # send them alone at once, a system call more per request.
            response._send_headers_immediately = False
            await response.prepare(request)
            if observation is not None:
                observation.response = response  # the in-flight view shows its headers
                observation.upstream = upstream  # what a cancel closes
            if keepalive is not None:
                if upstream.status == 200 and is_event_stream:
                    keepalive.adopt(response)
                elif not keepalive.quiet():
                    await keepalive.stop()
        content = upstream.content
        try:
            chunk = await content.readany() if whole is None else whole
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()  # the first byte is here: no heartbeat may come between chunks
            last = b""
            if chunk and isinstance(upstream, WireResponse) and request.transport is not None and (
                response.headers.get("Transfer-Encoding") == "chunked"
            ):
                if observation is not None:
                    observation.on_chunk(chunk)
                if upstream.complete and not upstream.buffered:  # all of it is here: headers, body and end in one write
                    last = chunk
                else:
                    await response.write(chunk)  # with the headers, in one write
                    # The rest goes from the upstream's socket to the client's in the read callback.
                    last = await upstream.splice(
                        request.transport, request.writer.drain,
                        observation.on_chunk if observation is not None else None,
                    )
                chunk = b""
            while chunk:
                if observation is not None:
                    observation.on_chunk(chunk)
                await response.write(chunk)  # awaits the client's socket: backpressure
                chunk = await content.readany()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as error:
            # The backend broke off mid-response. A stream gets a final error event rather
            # than a silent hang or a truncated body that looks complete.
            if observation is None or not observation.cancelled:
                log.warning("upstream %s broke off mid-response: %s", upstream.url, error)
            if keepalive is not None:
                await keepalive.stop()
            if observation is not None and observation.cancelled:
                failure = observation.cancelled
            elif explain_break is not None:
                failure = await explain_break()
            else:
                failure = "the upstream broke off mid-response"
            if not is_event_stream:
                if request.transport is not None:
                    request.transport.close()  # a truncated body must not look complete
                return response, False
            event = error_event(failure, dialect)
            if observation is not None:
                observation.wrote(event)
            await response.write(event)
            await response.write_eof()
            return response, False
        await response.write_eof(last)
        completed = True
        return response, True
    except (asyncio.CancelledError, ConnectionResetError):
        # aiohttp cancels the handler when its client disconnects; a write to a
        # closed client raises ConnectionResetError.
        disconnected = True
        raise
    finally:
        if completed:
            upstream.release()
        else:
            upstream.close()  # drop the connection: the upstream sees its client go away
        if observation is not None:
            observation.response = response  # what the client got, for a capture
            observation.end(completed=completed, disconnected=disconnected, error=failure)


# An upstream's error answer is read this far for its message.
ERROR_BODY_BYTES = 64 * 1024

ExplainError = Callable[[int, bytes], bytes | None]
"""Given an upstream's error status and body, the body with what to change added, or None to keep it."""


async def _read_error(upstream: aiohttp.ClientResponse | WireResponse, explain_error: ExplainError) -> bytes | None:
    """A small error answer of known length, read whole and given as `explain_error` rephrases it (else as
    it came); None when it is large, unsized or encoded (relayed as it comes), or broke off (the relay
    then meets the break as any other)."""
    length = upstream.content_length
    if length is None or length > ERROR_BODY_BYTES or upstream.headers.get("Content-Encoding", "identity") != "identity":
        return None
    try:
        body = await upstream.content.read()
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        return None
    return explain_error(upstream.status, body) or body


async def relay_reshaped(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    reshape: Reshape,
    observation: RequestObservation | None = None,
    keepalive: KeepAlive | None = None,
    explain_break: Callable[[], Awaitable[str]] | None = None,
    explain_error: ExplainError | None = None,
) -> tuple[web.StreamResponse, bool]:
    """`relay`, with the client's reply in another API's shape (`reshape`), e.g. Ollama's over OpenAI's.

    The observation sees the upstream's own bytes. A streamed reply is committed once the
    upstream's answer is known to be one to reshape (or by a heartbeat before that); a
    non-streamed one is answered whole at the end, so an upstream that breaks off, or answers
    an error, still gets its status to the client.
    """
    content_type = upstream.content_type
    if observation is not None:
        observation.on_headers(upstream.status, content_type)
        observation.upstream_route(upstream.url.path)
    completed = disconnected = False
    failure = None
    response: web.StreamResponse | None = keepalive.response if keepalive is not None else None
    try:
        if not reshape.accepts(upstream.status, content_type):
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()
            response = keepalive.response if keepalive is not None else None
            answer = await upstream.content.read(ERROR_BODY_BYTES)
            if observation is not None:
                observation.on_chunk(answer)
            if explain_error is not None and upstream.status >= 400:
                answer = explain_error(upstream.status, answer) or answer
            failure = f"the backend answered HTTP {upstream.status}: {error_text(answer)}"
            if response is None:
                status = upstream.status if upstream.status >= 400 else 502
                whole = reshape.error_response(status, error_text(answer) if upstream.status >= 400 else failure)
                return await send_whole(request, whole.status, whole.body, whole.content_type), False  # type: ignore[arg-type]
            event = reshape.error(failure)
            if observation is not None:
                observation.wrote(event)
            await response.write(event)
            await response.write_eof()
            return response, False
        if observation is not None:
            observation.upstream = upstream  # what a cancel closes
        content = upstream.content
        try:
            chunk = await content.readany()
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()  # the first byte is here: no heartbeat may come between chunks
            response = keepalive.response if keepalive is not None else None
            if response is None and reshape.streaming:
                response = stream_response(
                    request, headers={"Content-Type": reshape.content_type, "X-Accel-Buffering": "no"}
                )
                await response.prepare(request)
            if observation is not None:
                observation.response = response
            while chunk:
                if observation is not None:
                    observation.on_chunk(chunk)
                out = reshape.feed(chunk)
                if out and response is not None:
                    await response.write(out)  # awaits the client's socket: backpressure
                chunk = await content.readany()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as error:
            if observation is None or not observation.cancelled:
                log.warning("upstream %s broke off mid-response: %s", upstream.url, error)
            if keepalive is not None:
                await keepalive.stop()
                response = response or keepalive.response
            if observation is not None and observation.cancelled:
                failure = observation.cancelled
            elif explain_break is not None:
                failure = await explain_break()
            else:
                failure = "the upstream broke off mid-response"
            if response is None:
                whole = reshape.error_response(502, failure)
                return await send_whole(request, whole.status, whole.body, whole.content_type), False  # type: ignore[arg-type]
            event = reshape.error(failure)
            if observation is not None:
                observation.wrote(event)
            await response.write(event)
            await response.write_eof()
            return response, False
        tail = reshape.finish()
        if response is None:
            response = await send_whole(request, reshape.status, tail, reshape.content_type)
        else:
            if tail:
                await response.write(tail)
            await response.write_eof()
        completed = True
        return response, True
    except (asyncio.CancelledError, ConnectionResetError):
        disconnected = True
        raise
    finally:
        if completed:
            upstream.release()
        else:
            upstream.close()
        if observation is not None:
            observation.response = response
            observation.end(completed=completed, disconnected=disconnected, error=failure)


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
