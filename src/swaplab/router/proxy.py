"""Relaying one request to an upstream server, byte for byte, with backpressure.

The router's handler task is cancelled the moment its client disconnects (aiohttp's
handler cancellation), and cancellation closes the upstream connection here, so the
backend stops generating at once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

if TYPE_CHECKING:
    from swaplab.router.observe import RequestObservation

log = logging.getLogger("swaplab.router")

# Headers that describe one hop, not the message (RFC 9110 section 7.6.1), plus the
# ones aiohttp recomputes for the bytes it sends.
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length",
    }
)
# A pooled connection the upstream closed while idle fails on reuse before any
# response byte (llama.cpp's server closes idle keep-alive connections after 5 s);
# such a request never reached the model and is retried on a fresh connection.
RETRY_BEFORE_RESPONSE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
ATTEMPTS = 3
NO_IDLE_LIMIT = 24 * 3600.0


class UpstreamError(Exception):
    """The upstream could not be reached or gave no response header in time."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


def new_upstream_session(idle_seconds: float | None) -> aiohttp.ClientSession:
    """A connection pool for one upstream; idle connections close after `idle_seconds` (`timeouts.idleConn`)."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=idle_seconds or NO_IDLE_LIMIT)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,  # relay bytes as the upstream sent them
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
    )


def forward_headers(incoming: Mapping[str, str], extra: Mapping[str, str] | None = None) -> CIMultiDict[str]:
    headers = CIMultiDict((k, v) for k, v in incoming.items() if k.lower() not in HOP_BY_HOP)
    if extra:
        for key, value in extra.items():
            headers[key] = value
    return headers


@functools.lru_cache(maxsize=64)
def _timeout(connect_seconds: float | None) -> aiohttp.ClientTimeout:
    # No total limit: a generation may rightly stream for an hour.
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_seconds or 30)


async def open_upstream(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    headers: CIMultiDict[str],
    body: bytes,
    *,
    connect_timeout: float | None = None,
    response_header_timeout: float | None = None,
) -> aiohttp.ClientResponse:
    """Send the request and return once the upstream's response headers have arrived."""
    timeout = _timeout(connect_timeout)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            pending = session.request(
                method, url, headers=headers, data=body or None, timeout=timeout, allow_redirects=False
            )
            if response_header_timeout:
                return await asyncio.wait_for(pending, response_header_timeout)
            return await pending
        except aiohttp.ClientConnectorError as error:  # before its parent ClientOSError: no retry helps
            raise UpstreamError(f"cannot connect to upstream {url}: {error.os_error}") from None
        except RETRY_BEFORE_RESPONSE as error:
            if attempt == ATTEMPTS:
                raise UpstreamError(f"upstream {url} closed the connection: {error}") from None
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


def sse_error_event(message: str) -> bytes:
    payload = {"error": {"message": message, "type": "upstream_error", "code": 502}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    observation: RequestObservation | None = None,
    prepared: web.StreamResponse | None = None,
) -> tuple[web.StreamResponse, bool]:
    """Copy the upstream's response to the client as it arrives; close the upstream on any exit.

    Returns the client's response and whether the upstream's response arrived in full.
    `observation`, when given, sees the status and every chunk, and is finished on every
    way out (a client that went away included). `prepared` is an event stream already
    under way (loading progress): the upstream's events continue it, and an upstream
    that answers anything but an event stream ends it with an error event.
    """
    is_event_stream = upstream.content_type == "text/event-stream"
    if prepared is None:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in HOP_BY_HOP:
                response.headers.add(key, value)
        response.headers["X-Accel-Buffering"] = "no"
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
    else:
        response = prepared
    if observation is not None:
        observation.on_headers(upstream.status, upstream.content_type)
    completed = False
    disconnected = False
    failure = None
    try:
        if prepared is None:
            await response.prepare(request)
        elif upstream.status != 200 or not is_event_stream:
            answer = await upstream.content.read(4096)
            if observation is not None:
                observation.on_chunk(answer)
            failure = f"the backend answered HTTP {upstream.status}: {answer.decode(errors='replace')}"
            await response.write(sse_error_event(failure))
            await response.write_eof()
            return response, False
        try:
            async for chunk in upstream.content.iter_any():
                if observation is not None:
                    observation.on_chunk(chunk)
                await response.write(chunk)  # awaits the client's socket: backpressure
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as error:
            # The backend died mid-response. A stream gets a final error event rather
            # than a silent hang or a truncated body that looks complete.
            log.warning("upstream %s broke off mid-response: %s", upstream.url, error)
            failure = f"the backend stopped mid-stream: {error}"
            if not is_event_stream:
                if request.transport is not None:
                    request.transport.close()  # a truncated body must not look complete
                return response, False
            await response.write(sse_error_event(failure))
            await response.write_eof()
            return response, False
        await response.write_eof()
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
            observation.finish(completed=completed, disconnected=disconnected, error=failure)
