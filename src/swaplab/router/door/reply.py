"""A request the lane (`router.lane`) took from the wire, and the answer it writes, in the shapes the request path reads.

The request path (`exchange`, `answer`, `proxy`, `keepalive`, the observation, the in-flight
list) was written against aiohttp's `web.Request` and `web.StreamResponse`. A request the
lane serves is a `LaneRequest`, which has the attributes that path reads of one (headers,
method, path, query, transport, the writer's drain, per-request values), and its answer a
`LaneResponse`, which has what the path calls on a `StreamResponse` (`prepare`, `write`,
`write_eof`, its status and headers) and writes HTTP/1.1 bytes to the client's transport
itself: the head with the first bytes of the body in one write, chunked framing, one write
per call. `stream_response` makes the answer of the right kind for either request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web
from aiohttp.helpers import must_be_empty_body, rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from multidict import CIMultiDict, CIMultiDictProxy, MultiDictProxy
from yarl import URL

from swaplab.router.door.guard import apply_cors

# Reason phrases as aiohttp gives them: the standard library's, "" for a status it does not name.
_REASONS = {status.value: status.phrase for status in HTTPStatus}
_SERVER = f"Server: {SERVER_SOFTWARE}\r\n"


class Sink(Protocol):
    """What a lane response writes to: the client's connection (`lane.LaneConnection`)."""

    transport: asyncio.Transport | None
    keep_alive: bool
    written: int

    async def drain(self) -> None: ...


class LaneRequest:
    """A model request read by the lane: what the request path reads of aiohttp's `web.Request`."""

    __slots__ = (
        "method", "path", "raw_path", "headers", "body", "remote", "version", "writer", "_target", "_query_string",
        "_items", "_url", "get",
    )

    def __init__(
        self, method: str, target: str, headers: CIMultiDictProxy[str], body: bytes, remote: str | None, writer: Sink,
    ):
        self.method = method
        self.raw_path = target
        path, _, query = target.partition("?")
        self.path = path
        """Only plain ASCII paths take the lane (`lane.LANE_ROUTES`), so the decoded path is the raw one."""
        self._query_string = query
        self.headers = headers
        self.body = body
        self.remote = remote
        self.version = HttpVersion11
        self.writer = writer
        """The connection: `drain()` waits while the client's socket is full (the splice's backpressure)."""
        self._items: dict[Any, Any] = {}
        self._url: URL | None = None
        self.get = self._items.get
        """`request.get(key, default)`: the dict's own, bound here (a Python method would cost every request a call)."""

    # what aiohttp's request offers and the request path reads
    @property
    def transport(self) -> asyncio.Transport | None:
        return self.writer.transport

    @property
    def rel_url(self) -> URL:
        if self._url is None:
            self._url = URL(self.raw_path, encoded=True)
        return self._url

    @property
    def query(self) -> MultiDictProxy[str]:
        return self.rel_url.query

    @property
    def query_string(self) -> str:
        return self.rel_url.query_string

    @property
    def content_length(self) -> int:
        return len(self.body)

    @property
    def body_exists(self) -> bool:
        return bool(self.body)

    @property
    def keep_alive(self) -> bool:
        return self.writer.keep_alive

    async def read(self) -> bytes:
        return self.body

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._items[key] = value

    def __contains__(self, key: Any) -> bool:
        return key in self._items


class LaneResponse:
    """An answer the lane writes itself: `web.StreamResponse`'s calls, as the request path makes them.

    `prepare` settles the head (the router's CORS headers in place of the backend's, `Date`,
    `Server`, chunked framing unless a length is set) and, unless told to wait
    (`_send_headers_immediately`, as aiohttp's), writes it; otherwise it goes with the first
    body bytes, or the end.
    """

    __slots__ = (
        "status", "reason", "headers", "prepared", "body_length", "_send_headers_immediately", "_sink", "_head",
        "_chunked", "_empty", "_eof_sent", "_closing",
    )

    def __init__(self, sink: Sink, status: int = 200, reason: str | None = None,
                 headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None):
        if reason is not None and ("\r" in reason or "\n" in reason):
            raise ValueError("a reason phrase holds a line break")
        self._sink = sink
        self.status = status
        self.reason = reason if reason is not None else _REASONS.get(status, "")
        self.headers: CIMultiDict[str] = CIMultiDict(headers or ())
        self.prepared = False
        self.body_length = 0
        self._send_headers_immediately = True
        self._head = b""
        self._chunked = False
        self._empty = False
        self._eof_sent = False
        self._closing = False

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None else None

    @content_length.setter
    def content_length(self, value: int | None) -> None:
        if value is None:
            self.headers.popall("Content-Length", None)
        else:
            self.headers["Content-Length"] = str(int(value))

    @property
    def keep_alive(self) -> bool:
        return self._sink.keep_alive and not self._closing

    def force_close(self) -> None:
        self._closing = True

    async def prepare(self, request: LaneRequest) -> LaneResponse:
        if self.prepared:
            return self
        apply_cors(request, self)  # type: ignore[arg-type]  # what the app's on_response_prepare does
        headers = self.headers
        self._empty = must_be_empty_body(request.method, self.status)
        if self._empty:
            headers.popall("Transfer-Encoding", None)
        elif "Content-Length" not in headers:
            self._chunked = True
            headers["Transfer-Encoding"] = "chunked"
        if not self._empty and self.content_length != 0:
            headers.setdefault("Content-Type", "application/octet-stream")
        if "Date" not in headers:
            headers["Date"] = rfc822_formatted_time()
        if not self.keep_alive:
            headers["Connection"] = "close"
        self._head = head_bytes(self.status, self.reason, headers, server="Server" not in headers)
        self.prepared = True
        if self._send_headers_immediately:
            self._send(b"")
        return self

    def _send(self, data: bytes, end: bool = False) -> None:
        transport = self._sink.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        head, self._head = self._head, b""
        if self._empty:
            data = b""
        self.body_length += len(data)
        if self._chunked:
            if data:
                data = b"%x\r\n%b\r\n" % (len(data), data)
            if end:
                data += b"0\r\n\r\n"
        if head or data:
            out = head + data if head else data
            transport.write(out)
            self._sink.written += len(out)

    async def write(self, data: bytes) -> None:
        if self._eof_sent:
            raise RuntimeError("Cannot call write() after write_eof()")
        if not self.prepared:
            raise RuntimeError("Cannot call write() before prepare()")
        if not data and not self._head:
            return
        self._send(data)
        await self._sink.drain()

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof_sent:
            return
        if not self.prepared:
            raise RuntimeError("Cannot call write_eof() before prepare()")
        self._eof_sent = True
        self._send(data, end=True)


def stream_response(
    request: web.BaseRequest | LaneRequest, status: int = 200, reason: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """A streamed answer to `request`: aiohttp's for aiohttp's requests, the lane's for the lane's."""
    if isinstance(request, LaneRequest):
        return LaneResponse(request.writer, status, reason, headers)  # type: ignore[return-value]
    return web.StreamResponse(status=status, reason=reason, headers=headers)


async def send_whole(
    request: web.BaseRequest | LaneRequest, status: int, body: bytes, content_type: str
) -> web.StreamResponse:
    """A whole answer the router made (a translated reply, an error in a route's shape), sent through the
    request's own kind of response, as `stream_response`."""
    response = stream_response(request, status=status, headers={"Content-Type": content_type})
    response.content_length = len(body)
    await response.prepare(request)  # type: ignore[arg-type]
    await response.write_eof(body)
    return response


def head_bytes(status: int, reason: str, headers: CIMultiDict[str], server: bool = True) -> bytes:
    """The status line and headers of an HTTP/1.1 answer; a header holding a line break is refused (injection)."""
    lines = [f"HTTP/1.1 {status} {reason}\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    if server:
        lines.append(_SERVER)
    lines.append("\r\n")
    return "".join(lines).encode("utf-8", "surrogateescape")


def answer_bytes(response: web.Response, keep_alive: bool, method: str = "POST") -> bytes:
    """A whole answer a handler returned unsent (`web.Response`: an error, the router's own JSON), as it goes on the wire."""
    body = response.body
    if body is None:
        body = b""
    elif not isinstance(body, (bytes, bytearray)):
        raise TypeError(f"an answer the lane cannot write: its body is a {type(body).__name__}")
    status = response.status
    headers = CIMultiDict(response.headers)
    empty = must_be_empty_body(method, status)
    headers.popall("Transfer-Encoding", None)
    if empty:
        headers.popall("Content-Length", None)
        body = b""
    else:
        headers["Content-Length"] = str(len(body))
        if body:
            headers.setdefault("Content-Type", "application/octet-stream")
    if "Date" not in headers:
        headers["Date"] = rfc822_formatted_time()
    if not keep_alive:
        headers["Connection"] = "close"
    return head_bytes(status, response.reason, headers, "Server" not in headers) + bytes(body)
