"""llama-swap's upstream `timeouts` as the router's connection pools apply them, against a real loopback server."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from procs import free_port
from swaplab.config.model import Timeouts
from swaplab.router.relay.proxy import connect_limit, forward_headers, new_upstream_session, open_upstream


@pytest.mark.parametrize("url, timeouts, expected", [
    ("http://127.0.0.1:1", Timeouts(connect=30.0, tls_handshake=10.0), 30.0),
    ("https://api.example", Timeouts(connect=30.0, tls_handshake=10.0), 40.0),  # aiohttp's limit covers TLS too
    ("https://api.example", Timeouts(connect=30.0), 30.0),
    ("http://127.0.0.1:1", Timeouts(connect=None), None),  # connect: 0 = no limit
])
def test_connect_limit(url, timeouts, expected):
    assert connect_limit(url, timeouts) == expected


@pytest.fixture
async def upstream():
    """A loopback server: `/held` keeps its response open (so the connection is the client's to
    inspect) until the test ends; anything else answers with the `Expect` header it got. Its port."""
    done = asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"open")
        await done.wait()
        return response

    async def echo(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"expect": request.headers.get("Expect")})

    app = web.Application()
    app.router.add_get("/held", held)
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield port
    done.set()
    await runner.cleanup()


async def test_keepalive_turns_on_tcp_keepalive_probes(upstream):
    url = f"http://127.0.0.1:{upstream}"
    session = new_upstream_session(url, Timeouts(connect=5.0, keepalive=7.0, idle_conn=90.0))
    try:
        response = await open_upstream(session, "GET", f"{url}/held", forward_headers({}), b"")
        sock = response.connection.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 7
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 9
        response.close()
    finally:
        await session.close()
    plain = new_upstream_session(url, Timeouts(connect=5.0))  # keepalive: 0 = none
    try:
        response = await open_upstream(plain, "GET", f"{url}/held", forward_headers({}), b"")
        assert response.connection.transport.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        response.close()
    finally:
        await plain.close()


async def test_a_client_expecting_100_continue_does_not_make_the_upstream_wait(upstream):
    url = f"http://127.0.0.1:{upstream}"
    session = new_upstream_session(url, Timeouts(connect=5.0, expect_continue=1.0))
    try:
        headers = forward_headers({"Expect": "100-continue", "Content-Type": "application/json"})
        response = await asyncio.wait_for(open_upstream(session, "POST", f"{url}/x", headers, b"{}"), 5)
        assert (await response.json())["expect"] is None  # the body was read already: nothing to wait for
    finally:
        await session.close()
