"""The router's own upstream client (router/relay/wire.py) and the splice relay, over real loopback sockets.

Upstreams here are aiohttp servers or raw asyncio servers (for what aiohttp would never
send: interim answers, connections dropped at chosen moments); the front is an aiohttp
app whose handler does what the router's does: `UpstreamPools.open`, then `answer` (the relay).
"""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from aiohttp import web

from procs import eventually, free_port
from swaplab.config.model import Timeouts
from swaplab.router.relay import wire
from swaplab.router.watch.observe import RequestObservation
from swaplab.router.relay.answer import answer
from swaplab.router.relay.proxy import UpstreamError, UpstreamPools, forward_headers
from swaplab.router.relay.wire import WireResponse

EVENTS = 2000


def event(i: int) -> bytes:
    return b'data: {"choices":[{"delta":{"content":"t%d "}}]}\n\n' % i


async def serve(app: web.Application, **kwargs) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, **kwargs)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


class Front:
    """An aiohttp app relaying every request to `upstream` as the router does; what it saw, per request."""

    def __init__(self, upstream: str, timeouts: Timeouts | None = None):
        self.upstream = upstream
        self.timeouts = timeouts or Timeouts()
        self.pools = UpstreamPools()
        self.observations: list[RequestObservation] = []
        self.ended = asyncio.Event()
        self.requests: list[web.Request] = []
        self.answered = asyncio.Event()  # the upstream's headers are in, for the latest request

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        body = await request.read()
        observation = RequestObservation("m", request.path, on_end=lambda _: self.ended.set())
        self.observations.append(observation)
        try:
            upstream = await self.pools.open(
                request.method, self.upstream + request.path_qs, self.timeouts, forward_headers(request.headers), body
            )
        except UpstreamError as error:
            return web.json_response({"error": str(error), "unreachable": error.unreachable}, status=error.status)
        self.answered.set()
        response, _ = await answer(request, upstream, observation)
        return response

    async def __aenter__(self) -> Front:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner, self.port = await serve(app, handler_cancellation=True)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *_) -> None:
        await self.pools.close()
        await self.runner.cleanup()


@pytest.fixture
async def streaming():
    """An aiohttp upstream: POST /stream answers EVENTS events, each its own chunk (a few sent per write);
    POST /whole answers one JSON body with a Content-Length; GET /whole too."""

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(EVENTS):
            await response.write(event(i))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def whole(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"echo": body.decode(), "ua": request.headers.get("User-Agent")})

    app = web.Application()
    app.router.add_post("/stream", stream)
    app.router.add_route("*", "/whole", whole)
    runner, port = await serve(app)
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def expected_stream() -> bytes:
    return b"".join(event(i) for i in range(EVENTS)) + b"data: [DONE]\n\n"


async def test_posts_to_plain_http_go_on_the_wire_and_the_rest_on_aiohttp(streaming):
    pools = UpstreamPools()
    try:
        posted = await pools.open("POST", streaming + "/whole", Timeouts(), forward_headers({}), b"hi")
        assert isinstance(posted, WireResponse)
        assert json.loads(await posted.read()) == {"echo": "hi", "ua": None}
        posted.release()
        got = await pools.open("GET", streaming + "/whole", Timeouts(), forward_headers({}), b"")
        assert isinstance(got, aiohttp.ClientResponse)
        got.release()
    finally:
        await pools.close()


async def test_a_stream_is_spliced_whole_in_order_and_observed(streaming, monkeypatch):
    splices = []
    original = WireResponse.splice

    async def counted(self, *args):
        splices.append(self)
        return await original(self, *args)

    monkeypatch.setattr(WireResponse, "splice", counted)
    async with Front(streaming) as front, aiohttp.ClientSession() as client:
        for _ in range(3):  # the pooled connection carries the next ones
            async with client.post(front.url + "/stream", data=b"{}") as answer:
                assert answer.status == 200
                assert answer.headers["Content-Type"] == "text/event-stream"
                assert await answer.read() == expected_stream()
        assert len(splices) == 3
        await eventually(lambda: len(front.observations) == 3 and front.observations[-1]._ended_at is not None,
                         5, "the last observation to end")
        observation = front.observations[-1]
        assert observation.sent_bytes == len(expected_stream())
        assert observation.record().status == 200


async def test_a_whole_answer_keeps_its_length(streaming):
    async with Front(streaming) as front, aiohttp.ClientSession() as client:
        async with client.post(front.url + "/whole", data=b"x" * 200_000) as answer:  # the body goes in two writes
            assert answer.status == 200
            assert answer.content_length is not None
            assert json.loads(await answer.read())["echo"] == "x" * 200_000


async def test_a_client_that_reads_nothing_holds_the_upstream_back():
    """Without backpressure the front would read the upstream's 64 MiB into its client's buffer."""
    total = 64 * 1024 * 1024
    block = b"data: " + b"x" * (64 * 1024 - 8) + b"\n\n"
    sent = {"bytes": 0}
    stalled = asyncio.Event()
    finished = asyncio.Event()

    async def flood(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while sent["bytes"] < total:
            if request.transport is not None and request.transport.get_write_buffer_size() > 0:
                stalled.set()  # the socket to the front is full: the front stopped reading
            await response.write(block)
            sent["bytes"] += len(block)
        finished.set()
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/flood", flood)
    runner, port = await serve(app)
    try:
        async with Front(f"http://127.0.0.1:{port}") as front:
            reader, writer = await asyncio.open_connection("127.0.0.1", front.port, limit=1024)
            writer.write(b"POST /flood HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            await asyncio.wait_for(stalled.wait(), 30)
            # A front that ignored its client's full buffer would take all 64 MiB in well under this.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(finished.wait(), 2)
            client_side = front.requests[-1].transport
            assert client_side is not None and client_side.get_write_buffer_size() < 4 * 1024 * 1024
            assert sent["bytes"] < total
            received = 0
            while chunk := await reader.read(1 << 20):  # now read it all: nothing was lost
                received += len(chunk)
                if received >= total:
                    break
            assert received >= total
            writer.close()
    finally:
        await runner.cleanup()


class RawUpstream:
    """A raw asyncio server; `script(connection_number, request_bytes, transport)` answers each request."""

    def __init__(self, script):
        self.script = script
        self.connections = 0
        self.lost = asyncio.Event()

    async def __aenter__(self) -> str:
        outer = self

        class Protocol(asyncio.Protocol):
            def connection_made(self, transport):
                outer.connections += 1
                self.number = outer.connections
                self.transport = transport
                self.data = b""

            def data_received(self, data):
                self.data += data
                head, sep, rest = self.data.partition(b"\r\n\r\n")
                if not sep:
                    return
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if len(rest) < length:
                    return
                self.data = rest[length:]
                outer.script(self.number, head, self.transport)

            def connection_lost(self, error):
                outer.lost.set()

        self.server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_):
        self.server.close()


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_an_upstream_that_breaks_off_mid_stream_ends_it_with_an_error_event():
    def script(number, head, transport):
        transport.write(STREAM_HEAD + chunk(event(0)) + chunk(event(1)))
        asyncio.get_running_loop().call_soon(transport.write, chunk(event(2)))
        asyncio.get_running_loop().call_soon(transport.close)

    async with RawUpstream(script) as upstream, Front(upstream) as front, aiohttp.ClientSession() as client:
        async with client.post(front.url + "/v1/chat/completions", data=b"{}") as answer:
            body = await answer.read()
        assert body.startswith(event(0) + event(1))
        last = json.loads(body.rstrip().rsplit(b"\n\n", 1)[-1].removeprefix(b"data: "))
        assert last["error"]["message"] == "the upstream broke off mid-response"
        await asyncio.wait_for(front.ended.wait(), 5)
        assert front.observations[-1]._error == "the upstream broke off mid-response"


async def test_a_client_that_leaves_mid_stream_closes_the_upstream_connection():
    def script(number, head, transport):
        transport.write(STREAM_HEAD + chunk(event(0)))
        asyncio.get_running_loop().call_soon(transport.write, chunk(event(1)))  # spliced; then nothing more

    async with RawUpstream(script) as upstream, Front(upstream) as front:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        received = b""
        while event(1) not in received:
            received += await reader.read(4096)
        writer.close()
        await asyncio.wait_for(upstream_lost(front), 10)


async def upstream_lost(front: Front) -> None:
    await front.ended.wait()
    assert front.observations[-1]._disconnected


async def test_a_pooled_connection_the_upstream_dropped_is_retried_on_a_fresh_one():
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    seen = []

    def script(number, head, transport):
        seen.append(number)
        if number == 1 and seen.count(1) == 2:
            transport.close()  # the second request on the first connection: dropped before any byte
        else:
            transport.write(answer)

    async with RawUpstream(script) as upstream:
        pools = UpstreamPools()
        try:
            for _ in range(2):
                response = await pools.open("POST", upstream + "/x", Timeouts(), forward_headers({}), b"")
                assert response.status == 200 and await response.read() == b"{}"
                response.release()
        finally:
            await pools.close()
    assert seen == [1, 1, 2]


async def test_a_fresh_connection_closed_before_an_answer_is_unreachable_not_retried():
    seen = []

    def script(number, head, transport):
        seen.append(number)
        transport.close()

    async with RawUpstream(script) as upstream:
        pools = UpstreamPools()
        try:
            with pytest.raises(UpstreamError) as caught:
                await pools.open("POST", upstream + "/x", Timeouts(), forward_headers({}), b"")
        finally:
            await pools.close()
    assert caught.value.unreachable and caught.value.status == 502
    assert seen == [1]


async def test_nothing_listening_is_unreachable():
    pools = UpstreamPools()
    try:
        with pytest.raises(UpstreamError) as caught:
            await pools.open("POST", f"http://127.0.0.1:{free_port()}/x", Timeouts(), forward_headers({}), b"")
    finally:
        await pools.close()
    assert caught.value.unreachable and "cannot connect" in str(caught.value)


async def test_an_interim_answer_is_passed_over():
    def script(number, head, transport):
        transport.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
        asyncio.get_running_loop().call_later(
            0.01, transport.write, b"HTTP/1.1 201 Created\r\nX-Real: 1\r\nContent-Length: 2\r\n\r\nok")

    async with RawUpstream(script) as upstream:
        pools = UpstreamPools()
        try:
            response = await pools.open("POST", upstream + "/x", Timeouts(), forward_headers({}), b"")
            assert (response.status, response.headers.get("X-Real"), "Link" in response.headers) == (201, "1", False)
            assert await response.read() == b"ok"
            response.release()
        finally:
            await pools.close()


async def test_no_response_header_within_the_limit_is_a_504():
    async with RawUpstream(lambda *_: None) as upstream:
        pools = UpstreamPools()
        try:
            with pytest.raises(UpstreamError) as caught:
                await pools.open("POST", upstream + "/x", Timeouts(response_header=0.05), forward_headers({}), b"")
        finally:
            await pools.close()
    assert caught.value.status == 504 and "timeouts.responseHeader" in str(caught.value)


async def test_an_answer_that_is_not_http_is_a_502():
    async with RawUpstream(lambda n, h, transport: transport.write(b"SSH-2.0-OpenSSH\r\n\r\n")) as upstream:
        pools = UpstreamPools()
        try:
            with pytest.raises(UpstreamError) as caught:
                await pools.open("POST", upstream + "/x", Timeouts(), forward_headers({}), b"")
        finally:
            await pools.close()
    assert caught.value.status == 502


def test_a_header_with_a_line_break_is_refused_not_sent():
    from yarl import URL

    with pytest.raises(wire.WireError) as caught:
        wire.request_head("POST", URL("http://h:1/x"), {"X-Key": "a\r\nX-Injected: 1"}, 0)
    assert caught.value.status == 400
    head = wire.request_head("POST", URL("http://[::1]:8080/v1/x?q=1"), {"A": "b"}, 5)
    assert head == b"POST /v1/x?q=1 HTTP/1.1\r\nHost: [::1]:8080\r\nA: b\r\nContent-Length: 5\r\n\r\n"


async def test_keepalive_and_idle_limit_apply_to_wire_connections(streaming):
    sockets = []
    original = wire.WirePool.connection

    async def watched(self):
        connection, reused = await original(self)
        sockets.append(connection.transport.get_extra_info("socket"))
        return connection, reused

    pools = UpstreamPools()
    try:
        wire.WirePool.connection = watched
        timeouts = Timeouts(keepalive=7.0, idle_conn=0.05)
        response = await pools.open("POST", streaming + "/whole", timeouts, forward_headers({}), b"")
        await response.read()
        sock = sockets[0]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        connection = response.connection
        response.release()
        await eventually(lambda: connection.transport is None, 5, "the idle connection to close")
    finally:
        wire.WirePool.connection = original
        await pools.close()


async def test_a_body_without_a_length_ends_where_the_upstream_closes():
    def script(number, head, transport):
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + event(0))
        loop = asyncio.get_running_loop()
        loop.call_soon(transport.write, event(1))
        loop.call_soon(transport.close)

    async with RawUpstream(script) as upstream, Front(upstream) as front, aiohttp.ClientSession() as client:
        async with client.post(front.url + "/v1/chat/completions", data=b"{}") as answer:
            assert await answer.read() == event(0) + event(1)  # whole, no error event after it
        await asyncio.wait_for(front.ended.wait(), 5)
        assert front.observations[-1]._completed and front.observations[-1]._error is None


async def test_bytes_after_an_answer_are_not_taken_for_the_next_one():
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    def script(number, head, transport):
        transport.write(answer + answer)  # one request, two answers: the connection is not pooled

    async with RawUpstream(script) as upstream:
        pools = UpstreamPools()
        try:
            first = await pools.open("POST", upstream + "/x", Timeouts(), forward_headers({}), b"")
            assert await first.read() == b"ok"
            first.release()
            second = await pools.open("POST", upstream + "/x", Timeouts(), forward_headers({}), b"")
            assert await second.read() == b"ok"
            second.release()
        finally:
            await pools.close()


async def test_what_arrived_after_the_first_read_is_relayed_too(monkeypatch):
    """The relay may wait between its first read and the splice (a heartbeat being stopped): the answer
    can end meanwhile, its rest in the reader's buffer, and all of it must still reach the client."""
    pieces = [event(0), event(1), b"data: [DONE]\n\n"]

    def script(number, head, transport):  # one write per piece, so the reader holds them apart
        loop = asyncio.get_running_loop()
        transport.write(STREAM_HEAD + chunk(pieces[0]))
        for delay, piece in enumerate(pieces[1:], 1):
            loop.call_later(0.01 * delay, transport.write, chunk(piece))
        loop.call_later(0.05, transport.write, b"0\r\n\r\n")

    original = WireResponse.readany

    async def first_piece_only(self):  # the first read returned before the rest arrived
        while not self.complete:
            await self._wait()
        first = self._buffer.pop(0)
        self._buffered -= len(first)
        return first

    class Slow(Front):
        async def handle(self, request):
            monkeypatch.setattr(WireResponse, "readany", first_piece_only)
            try:
                return await super().handle(request)
            finally:
                monkeypatch.setattr(WireResponse, "readany", original)

    async with RawUpstream(script) as upstream, Slow(upstream) as front, aiohttp.ClientSession() as client:
        async with client.post(front.url + "/v1/chat/completions", data=b"{}") as answer:
            assert await answer.read() == b"".join(pieces)
