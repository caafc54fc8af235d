"""Many requests released at one instant, over connections opened and warmed beforehand.

A client library builds each request in Python before it writes it: aiohttp's client
takes a few milliseconds to send 64, so its "simultaneous" requests leave spread out
and the client's own work is measured with the proxy's. Here each request is a few
prebuilt bytes of HTTP/1.1, written to its own kept-alive socket, the 64 writes in one
step of the event loop; each response is read by a small HTTP/1.1 parser (status line,
headers, Content-Length or chunked body) that only notes when its first body byte came.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Reply:
    """One response: seconds from the burst's release to its first body byte and to its end."""

    status: int
    first_byte: float
    end: float
    events: int  # `data: ` lines in the body (a stream's events)


def chat_request(base_url: str, body: dict) -> bytes:
    """A POST to /v1/chat/completions as bytes, with the headers aiohttp's client sends (its own User-Agent)."""
    url = urlsplit(base_url)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\n"
        f"Host: {url.netloc}\r\n"
        "Accept: */*\r\n"
        "Accept-Encoding: gzip, deflate\r\n"
        "User-Agent: swaplab-burst\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "\r\n"
    )
    return head.encode() + payload


class _Connection(asyncio.Protocol):
    """One kept-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._reply: asyncio.Future[Reply] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, error: Exception | None) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(ConnectionError(f"the server closed the connection mid-response ({error})"))
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, request: bytes, released: float) -> asyncio.Future[Reply]:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the connection is closed")
        self._reply = asyncio.get_running_loop().create_future()
        self._released = released
        self._buffer = bytearray()
        self._status = 0
        self._head_done = False
        self._first: float | None = None
        self._remaining: int | None = None  # Content-Length left, or the current chunk's bytes left
        self._chunked = False
        self._events = 0
        self._tail = b""  # the end of the previous piece of body, so `data: ` split in two still counts
        self.transport.write(request)
        return self._reply

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self._reply is None or self._reply.done():
            return  # nothing asked: a stray byte after a response ends (none expected)
        self._buffer += data
        try:
            if not self._head_done:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._read_head(bytes(self._buffer[:end]).decode("latin-1"))
                del self._buffer[: end + 4]
            if self._first is None and self._buffer:
                self._first = now
            finished = self._read_chunked() if self._chunked else self._read_length()
        except ValueError as error:  # not the HTTP/1.1 this parser knows
            self._reply.set_exception(error)
            return
        if finished:
            self._reply.set_result(
                Reply(self._status, (self._first or now) - self._released, now - self._released, self._events)
            )

    def _read_head(self, head: str) -> None:
        lines = head.split("\r\n")
        self._status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self._head_done = True
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self._chunked = True
        elif "content-length" in headers:
            self._remaining = int(headers["content-length"])
        else:
            raise ValueError(f"a response with neither Content-Length nor chunked encoding: {lines[0]}")

    def _count_events(self, piece: bytes) -> None:
        joined = self._tail + piece
        self._events += joined.count(b"data: ") - self._tail.count(b"data: ")
        self._tail = joined[-5:]

    def _read_length(self) -> bool:
        take = bytes(self._buffer[: self._remaining])
        del self._buffer[: len(take)]
        self._remaining -= len(take)
        self._count_events(take)
        return self._remaining == 0

    def _read_chunked(self) -> bool:
        buffer = self._buffer
        while True:
            if self._remaining is None:  # at a chunk-size line
                line_end = buffer.find(b"\r\n")
                if line_end < 0:
                    return False
                size = int(bytes(buffer[:line_end]).split(b";")[0], 16)
                if size == 0:
                    # The last chunk, then (no trailers expected) the empty line that ends the body.
                    if len(buffer) < line_end + 4:
                        return False
                    del buffer[: line_end + 4]
                    return True
                del buffer[: line_end + 2]
                self._remaining = size + 2  # the data and its CRLF
            if not buffer:
                return False
            take = bytes(buffer[: self._remaining])
            del buffer[: len(take)]
            self._remaining -= len(take)
            self._count_events(take)  # a CRLF cannot form `data: `
            if self._remaining:
                return False
            self._remaining = None


class Burst:
    """`size` connections to one server; `fire` sends a request on all of them at the same instant."""

    def __init__(self, base_url: str, size: int):
        url = urlsplit(base_url)
        self.host, self.port = url.hostname, url.port
        self.size = size
        self._connections: list[_Connection] = []

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.size):
            _, connection = await loop.create_connection(_Connection, self.host, self.port)
            self._connections.append(connection)

    async def fire(self, request: bytes) -> list[Reply]:
        """Write `request` to every connection in one go; the replies once all have ended."""
        released = time.perf_counter()
        replies = [connection.send(request, released) for connection in self._connections]
        done = await asyncio.gather(*replies)
        failed = [reply for reply in done if reply.status != 200]
        if failed:
            raise RuntimeError(f"{self.host}:{self.port}: {len(failed)} of {self.size} answered HTTP {failed[0].status}")
        return done

    async def close(self) -> None:
        for connection in self._connections:
            if connection.transport is not None:
                connection.transport.close()
        await asyncio.gather(*(connection.closed for connection in self._connections))
        self._connections.clear()
