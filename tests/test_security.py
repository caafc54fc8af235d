"""Safe on a workstation (docs/security.md), tried as an attacker would over real HTTP: a hostile
page's requests, DNS rebinding, requests that stall, bodies and websocket messages too large."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
import pytest

from procs import PYTHON, SIM, free_port
from routerclient import chat, running, wait_for_state

# A backend that records every request it sees (GET /seen lists them) and, like llama.cpp's
# server, answers each with permissive CORS headers of its own.
RECORDER_SCRIPT = """
import sys
from aiohttp import web
seen = []
CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Credentials": "true"}
async def record(request):
    if request.path == "/seen":
        return web.json_response(seen)
    body = await request.read()
    seen.append({"method": request.method, "path": request.path_qs,
                 "authorization": request.headers.get("Authorization")})
    return web.json_response({"ok": True, "length": len(body)}, headers=CORS)
app = web.Application(client_max_size=2**30)
app.router.add_get("/health", lambda r: web.Response(text="ok"))
app.router.add_route("*", "/{tail:.*}", record)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""

EVIL = "http://evil.example"


@pytest.fixture
def recorder(tmp_path):
    path = tmp_path / "recorder.py"
    path.write_text(RECORDER_SCRIPT)
    return path


async def raw_exchange(port: int, data: bytes, *, bound: float = 60.0) -> bytes:
    """Send `data` on a fresh connection and read until the router closes it (within `bound`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), bound)
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


async def test_options_under_upstream_needs_the_key_and_preflights_are_never_forwarded(router_factory, recorder):
    remote = free_port()
    backend = subprocess.Popen([sys.executable, str(recorder), str(remote)])
    try:
        router = router_factory(f"""
apiKeys: [sk-router]
models:
  local:
    cmd: {PYTHON} {recorder} ${{PORT}}
peers:
  far:
    proxy: http://127.0.0.1:{remote}
    apiKey: sk-peer
    models: [m]
""")
        async with aiohttp.ClientSession() as session:
            for target in ("/upstream/local/anything", "/upstream/far/m/anything"):
                # Before: the key check skipped every OPTIONS and /upstream/ forwarded it, starting
                # the model, and sending the peer's key along to the peer.
                async with session.options(router.url + target) as response:
                    assert response.status == 401, target
                preflight = {"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"}
                async with session.options(router.url + target, headers=preflight) as response:
                    assert response.status == 204, target
                    assert response.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
                async with session.options(router.url + target, headers={**preflight, "Origin": EVIL}) as response:
                    assert response.status == 403, target
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-router"}) as keyed:
                assert "local" not in await running(keyed, router.url)
            async with session.get(f"http://127.0.0.1:{remote}/seen") as response:
                assert await response.json() == []  # the peer never heard of it
            # With the key, an OPTIONS is a request like any other, and goes through.
            async with session.options(f"{router.url}/upstream/far/m/anything",
                                       headers={"Authorization": "Bearer sk-router"}) as response:
                assert response.status == 200
            async with session.get(f"http://127.0.0.1:{remote}/seen") as response:
                assert [entry["method"] for entry in await response.json()] == ["OPTIONS"]
    finally:
        backend.terminate()
        backend.wait(10)


ROUTES_WITH_SECRETS = (
    "/api/metrics/activity", "/api/captures/1", "/api/activity", "/logs", "/running", "/api/models",
    "/v1/models", "/api/events", "/logs/stream", "/metrics", "/ui/", "/catalog/",
)


async def test_a_rebinding_host_reads_nothing(router_factory):
    router = router_factory(f"""
security:
  allowedHosts: [mybox.lan]
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    port = router.port
    async with aiohttp.ClientSession() as session:
        assert (await chat(session, router.url, "a", max_tokens=2))[0] == 200
        for path in ROUTES_WITH_SECRETS:
            # A page on attacker.example whose name now resolves to 127.0.0.1 sends its own name.
            async with session.get(router.url + path, headers={"Host": f"attacker.example:{port}"}) as response:
                assert response.status == 403, path
                assert "security.allowedHosts" in (await response.json())["error"]["message"]
        async with session.post(f"{router.url}/v1/chat/completions", headers={"Host": "attacker.example"},
                                json={"model": "a", "messages": []}) as response:
            assert response.status == 403
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "mybox.lan", f"mybox.lan:{port}"):
            async with session.get(f"{router.url}/running", headers={"Host": host}) as response:
                assert response.status == 200, host


async def test_a_foreign_page_changes_nothing(router_factory, tmp_path):
    router = router_factory(f"""
security:
  cors:
    allowedOrigins: [https://app.example]
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --tokens-per-second 5
  b:
    cmd: {SIM} --port ${{PORT}} --model b
groups:
  both:
    swap: false
    members: [a, b]
profiles:
  work:
    pins: {{x: a}}
""")
    url = router.url
    chat_body = json.dumps({"model": "b", "messages": [{"role": "user", "content": "hi"}]})
    async with aiohttp.ClientSession() as session:
        assert (await chat(session, url, "a", max_tokens=1))[0] == 200
        # A stream in flight whose id a page could guess.
        stream = await session.post(f"{url}/v1/chat/completions", json={
            "model": "a", "stream": True, "max_tokens": 30, "messages": [{"role": "user", "content": "hi"}]})
        await stream.content.readline()
        text_plain = {"Origin": EVIL, "Content-Type": "text/plain"}
        attempts = [
            ("POST", "/api/models/unload", ""), ("POST", "/api/models/unload/a", ""), ("GET", "/unload", ""),
            ("POST", "/unload", ""), ("POST", "/load?model=b", ""), ("POST", "/v1/chat/completions", chat_body),
            ("POST", "/api/inflight/1/cancel", ""), ("POST", "/api/inflight/2/cancel", ""),
            ("PUT", "/api/profiles/active", '{"name": "work"}'), ("POST", "/api/models/sleep/a", ""),
            ("GET", "/upstream/b/v1/models", ""),
        ]
        for method, path, body in attempts:
            async with session.request(method, url + path, data=body, headers=text_plain) as response:
                assert response.status == 403, (method, path)
                assert "security.cors.allowedOrigins" in (await response.json())["error"]["message"]
                assert "Access-Control-Allow-Origin" not in response.headers
        # The same from an <img> or a form, which sends no Origin but says it is cross-site.
        async with session.get(f"{url}/unload", headers={"Sec-Fetch-Site": "cross-site"}) as response:
            assert response.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(f"{url}/upstream/a/sim/ws", headers={"Origin": EVIL})
        assert refused.value.status == 403
        state = await running(session, url)
        assert state["a"]["state"] == "ready" and "b" not in state
        async with session.get(f"{url}/api/profiles") as response:
            assert (await response.json())["active"] is None
        # The stream nobody may cancel went on to its end.
        body = await stream.read()
        assert body.rstrip().endswith(b"data: [DONE]")
        # A read goes on, but without a CORS grant the page cannot see it.
        async with session.get(f"{url}/v1/models", headers={"Origin": EVIL}) as response:
            assert response.status == 200 and "Access-Control-Allow-Origin" not in response.headers

        # The router's own page (same origin) and a configured origin still work.
        same = {"Origin": url, "Content-Type": "application/json"}
        async with session.ws_connect(f"{url}/upstream/a/sim/ws", headers={"Origin": url}) as socket:
            await socket.send_str("ping")
            assert (await socket.receive()).data == "ping"
        async with session.post(f"{url}/load?model=b", headers=same) as response:
            assert response.status == 200
        app = {"Origin": "https://app.example"}
        async with session.post(f"{url}/v1/chat/completions", data=chat_body,
                                headers={**app, "Content-Type": "application/json"}) as response:
            assert response.status == 200
            assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "Access-Control-Allow-Credentials" not in response.headers
        async with session.post(f"{url}/api/models/unload", headers=same) as response:
            assert response.status == 200
        await wait_for_state(session, url, "a", "stopped")


async def test_backend_cors_headers_are_replaced_by_the_routers(router_factory, recorder):
    router = router_factory(f"""
models:
  rec:
    cmd: {PYTHON} {recorder} ${{PORT}}
""")
    body = {"model": "rec", "messages": []}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            assert not [name for name in response.headers if name.lower().startswith("access-control-")]
        async with session.post(f"{router.url}/v1/chat/completions", json=body,
                                headers={"Origin": "http://localhost:3000"}) as response:
            assert response.headers.getall("Access-Control-Allow-Origin") == ["http://localhost:3000"]
            assert "Access-Control-Allow-Credentials" not in response.headers
        async with session.get(f"{router.url}/upstream/rec/x", headers={"Origin": EVIL}) as response:
            assert response.status == 403


async def test_stalled_requests_are_closed_while_a_slow_stream_goes_on(router_factory):
    router = router_factory(f"""
security:
  limits: {{headerTimeout: 1, bodyTimeout: 1}}
models:
  slow:
    cmd: {SIM} --port ${{PORT}} --model slow --tokens-per-second 4
""")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json={
                "model": "slow", "stream": True, "max_tokens": 24,
                "messages": [{"role": "user", "content": "hi"}]}) as stream:
            assert stream.status == 200
            await stream.content.readline()
            # Headers that never end: closed (before, never: a crowd of these ran out of files).
            unfinished = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app"
            assert await raw_exchange(router.port, unfinished) == b""
            # A connection that sends nothing at all.
            assert await raw_exchange(router.port, b"") == b""
            # A body that stops halfway: 408, and the connection closed.
            stalled = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\": ")
            answer = await raw_exchange(router.port, stalled)
            assert status_of(answer) == 408 and b"security.limits.bodyTimeout" in answer
            # The stream, whose response had started, was never cut: every token arrives.
            events = [line for line in (await stream.read()).split(b"\n") if line.startswith(b"data: {")]
            assert len(events) >= 23
        async with session.get(f"{router.url}/health") as response:
            assert response.status == 200


async def test_size_limits(router_factory):
    router = router_factory(f"""
security:
  limits: {{maxBodyMB: 1, maxWebsocketMessageMB: 1, largeBodyMB: 0.25, maxLargeBodies: 1, bodyTimeout: 5}}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    port = router.port
    # A huge Content-Length is refused on its headers alone: not a byte of the body is read.
    answer = await raw_exchange(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n")
    assert status_of(answer) == 413 and b"security.limits.maxBodyMB" in answer
    async with aiohttp.ClientSession() as session:
        # A body of no declared length is counted as it comes.
        async def chunks():
            for _ in range(20):
                yield b" " * 100_000

        async with session.post(f"{router.url}/v1/chat/completions", data=chunks(),
                                headers={"Content-Type": "application/json"}) as response:
            assert response.status == 413
        # A body within the limit still goes through.
        padding = "x" * 900_000
        status, _ = await chat(session, router.url, "a", max_tokens=1, user=padding)
        assert status == 200
        # A websocket message past the limit closes the socket with 1009 (message too big).
        async with session.ws_connect(f"{router.url}/upstream/a/sim/ws", max_msg_size=0) as socket:
            await socket.send_str("small")
            assert (await socket.receive()).data == "small"
            await socket.send_bytes(b"x" * (2 * 1024 * 1024))
            closing = await socket.receive()
            # Never relayed (before, the sim echoed it back): the router closes with 1009, which the
            # client reads as such, or as 1006 when the close lands while it is still sending the frame.
            assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
            assert socket.close_code in (aiohttp.WSCloseCode.MESSAGE_TOO_BIG, aiohttp.WSCloseCode.ABNORMAL_CLOSURE)

        # One large body at a time: while a slow client holds the slot, the next large one waits,
        # then is told to retry; small bodies go by.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 600000\r\n\r\n")
        await writer.drain()
        second = asyncio.ensure_future(session.post(
            f"{router.url}/v1/chat/completions", data=b" " * 600_000, headers={"Content-Type": "application/json"}))
        assert (await chat(session, router.url, "a", max_tokens=1))[0] == 200
        while not second.done():  # the slow client's pace, well within bodyTimeout
            writer.write(b" ")
            await writer.drain()
            await asyncio.wait({second}, timeout=0.2)
        refused = second.result()
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert "security.limits.maxLargeBodies" in (await refused.json())["error"]["message"]
        refused.release()
        writer.close()
