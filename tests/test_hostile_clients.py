"""Clients that hold the router's resources or send what it does not expect, on both front doors (the lane and aiohttp's)."""

from __future__ import annotations

import asyncio

import pytest

from procs import SIM

MIB = 1024 * 1024
KEYED = f"""
apiKeys: [sk-router]
security:
  limits: {{maxBodyMB: 32, largeBodyMB: 16, bodyTimeout: 60}}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
"""
BOTH_PATHS = pytest.mark.parametrize("lane", ["on", "off"])


async def _answer_head(reader: asyncio.StreamReader, bound: float) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), bound)


@BOTH_PATHS
async def test_a_keyless_request_is_refused_on_its_headers_before_its_body_is_read(router_factory, lane):
    router = router_factory(KEYED, env={"SWAPLAB_LANE": lane})
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (15 * MIB))
    connections = [await asyncio.open_connection("127.0.0.1", router.port) for _ in range(20)]
    try:
        for _, writer in connections:
            writer.write(head + b'{"model": "a", "messages": [' + b" " * 4096)
            await writer.drain()
        # Each is answered while almost all of its 15 MiB is still unsent (before: only after the
        # whole body, or at bodyTimeout), and its connection ends: what follows is only drained,
        # never kept, for aiohttp's lingering time (so the client can read its 401), then closed.
        for reader, _ in connections:
            answer = await _answer_head(reader, 10)
            assert answer.startswith(b"HTTP/1.1 401 "), answer
            assert b"connection: close" in answer.lower()
            length = int(answer.lower().partition(b"content-length: ")[2].partition(b"\r\n")[0])
            body = await asyncio.wait_for(reader.readexactly(length), 10)
            assert b"invalid or missing API key" in body
    finally:
        for _, writer in connections:
            writer.close()
    assert "Traceback" not in router.output()


@BOTH_PATHS
async def test_a_key_that_is_not_utf8_is_a_401_not_a_500(router_factory, lane):
    router = router_factory(KEYED, env={"SWAPLAB_LANE": lane})
    body = b'{"model": "a", "messages": [{"role": "user", "content": "hi"}]}'
    for credential in (b"Bearer sk-\xff\xfe", b"Basic " + b"\xff" * 8):
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Authorization: " + credential + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            answer = await _answer_head(reader, 10)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 401 "), answer
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    try:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: \xff\r\n\r\n")
        await writer.drain()
        assert (await _answer_head(reader, 10)).startswith(b"HTTP/1.1 401 ")
    finally:
        writer.close()
    assert "Traceback" not in router.output()
