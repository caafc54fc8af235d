"""The lane (router/door/lane.py): model requests on the common path served without aiohttp's server, the rest handed to it.

Each test runs real `swaplab serve` processes against a real upstream on loopback and
talks raw HTTP/1.1 where the bytes matter. The lane must answer what aiohttp's server
answered (the same router with `SWAPLAB_LANE=off` is the reference), and every request it
does not take must reach aiohttp whole, on the same connection.
"""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest
from aiohttp import web

from procs import PYTHON, SIM, eventually, free_port, run_swaplab
from routerclient import running, sim_stats, wait_for_stats
from swaplab.errors import SwaplabError
from swaplab.router.door.lane import lane_enabled

CONFIG = f"""
models:
  m:
    cmd: {SIM} --port ${{PORT}} --model m
"""
BODY = json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode()
STREAM_BODY = json.dumps(
    {"model": "m", "stream": True, "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}
).encode()


def post(body: bytes, *extra: bytes, path: bytes = b"/v1/chat/completions", version: bytes = b"1.1") -> bytes:
    head = [b"POST " + path + b" HTTP/" + version, b"Host: 127.0.0.1", b"Content-Type: application/json",
            b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def lane_counts(url: str, since: tuple[int, int] | None = None, key: str | None = None) -> tuple[int, int]:
    """The lane's counters on /metrics: (requests served, connections handed over); with `since` (an earlier
    reading), what changed since, less this reading's own request (a GET, handed to aiohttp)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics", headers=headers) as response:
        text = await response.text()
    served = re.search(r"^swaplab:lane_requests_total (\S+)$", text, re.M)
    handed = re.search(r"^swaplab:lane_handovers_total (\S+)$", text, re.M)
    assert served and handed, "the lane's counters are on /metrics"
    counts = int(float(served.group(1))), int(float(handed.group(1)))
    return counts if since is None else (counts[0] - since[0], counts[1] - since[1] - 1)


class Wire:
    """One client connection, read answer by answer with llhttp-free framing: enough for these tests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Wire:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The next answer: status, headers (lower-case names), body (chunks joined)."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 30)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, body

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 30) == b""

    def close(self) -> None:
        self.writer.close()


def comparable(answer: tuple[int, dict[str, str], bytes]) -> tuple:
    """An answer less what differs between two routers and two runs: the date, ids and times in the body."""
    status, headers, body = answer
    headers = {k: v for k, v in headers.items() if k not in ("date",)}
    body = re.sub(rb'"(id|created|system_fingerprint)":\s*("[^"]*"|\d+)', b"", body)
    body = re.sub(rb'"\w+_(ms|per_second|time)":\s*[\d.e+-]+', b"", body)
    return status, headers, body


async def test_the_lane_answers_as_aiohttps_server_did(router_factory, tmp_path):
    (tmp_path / "lane").mkdir()
    (tmp_path / "aiohttp").mkdir()
    fast = router_factory(CONFIG, workdir=tmp_path / "lane")
    plain = router_factory(CONFIG, workdir=tmp_path / "aiohttp", env={"SWAPLAB_LANE": "off"})
    before = await lane_counts(fast.url)
    cases = [
        post(BODY),  # a whole answer with its length
        post(STREAM_BODY),  # an event stream, chunked
        post(json.dumps({"model": "nope", "messages": []}).encode()),  # the router's own 404
        post(b"{not json"),  # the router's own 400
        post(BODY, b"Origin: http://localhost:3000"),  # a loopback page: the router's CORS headers
        post(BODY, path=b"/v1/chat/completions?model=m"),  # a query
    ]
    answers = {}
    for router in (fast, plain):
        wire = await Wire.open(router.port)
        answers[router.port] = []
        for case in cases:  # one connection, kept alive across them
            await wire.send(case)
            answers[router.port].append(comparable(await wire.answer()))
        wire.close()
    for case, lane, reference in zip(cases, answers[fast.port], answers[plain.port], strict=True):
        assert lane == reference, case
    assert await lane_counts(fast.url, before) == (len(cases), 0)
    cors = answers[fast.port][4][1]
    assert cors["access-control-allow-origin"] == "http://localhost:3000"


async def test_what_the_lane_does_not_take_reaches_aiohttp_whole(router_factory):
    router = router_factory(CONFIG + "apiKeys: [sk-lane]\n")
    before = await lane_counts(router.url, key="sk-lane")
    key = b"Authorization: Bearer sk-lane"
    cases = [
        # (request, status aiohttp answers it with)
        (post(BODY, key), 200),  # the lane's
        (post(BODY), 401),  # no key: aiohttp's key check, with its challenges
        (post(BODY, key, b"Origin: https://evil.example"), 403),  # the Origin policy
        (b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost:3000\r\n"
         b"Access-Control-Request-Method: POST\r\n\r\n", 204),  # a preflight
        (post(BODY, key, version=b"1.0"), 200),  # HTTP/1.0
        (post(BODY, key, b"Expect: 100-continue"), 100),  # aiohttp's interim answer first
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         b"Authorization: Bearer sk-lane\r\nTransfer-Encoding: chunked\r\n\r\n"
         + b"%x\r\n%b\r\n0\r\n\r\n" % (len(BODY), BODY), 200),  # a chunked body
        (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk-lane\r\n\r\n", 200),  # another route
        (b"POST /v1/chat/completions HTTP/1.1\nHost: 127.0.0.1\n\n", 400),  # bare line feeds: aiohttp's parser
    ]
    for request, status in cases:
        wire = await Wire.open(router.port)
        await wire.send(request)
        assert (await wire.answer())[0] == status, request[:60]
        wire.close()
    assert await lane_counts(router.url, before, key="sk-lane") == (1, len(cases) - 1)


async def test_a_connection_goes_on_with_aiohttp_after_lane_requests(router_factory):
    router = router_factory(CONFIG)
    before = await lane_counts(router.url)
    wire = await Wire.open(router.port)
    await wire.send(post(BODY))
    assert (await wire.answer())[0] == 200
    await wire.send(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # not the lane's: handed over here
    status, _, body = await wire.answer()
    assert status == 200 and json.loads(body)["data"][0]["id"] == "m"
    await wire.send(post(BODY))  # the connection is aiohttp's from now on, and still answers
    assert (await wire.answer())[0] == 200
    wire.close()
    assert await lane_counts(router.url, before) == (1, 1)


async def test_requests_sent_ahead_are_answered_in_turn(router_factory):
    router = router_factory(CONFIG)
    before = await lane_counts(router.url)
    wire = await Wire.open(router.port)
    await wire.send(post(STREAM_BODY) + post(BODY) + post(STREAM_BODY))  # one write: pipelined
    first, second, third = [await wire.answer() for _ in range(3)]
    assert first[0] == second[0] == third[0] == 200
    assert first[2].rstrip().endswith(b"data: [DONE]") and third[2].rstrip().endswith(b"data: [DONE]")
    assert json.loads(second[2])["object"] == "chat.completion"
    wire.close()
    assert (await lane_counts(router.url, before))[0] == 3


async def test_a_body_in_pieces_and_connection_close(router_factory):
    router = router_factory(CONFIG)
    before = await lane_counts(router.url)
    wire = await Wire.open(router.port)
    request = post(BODY, b"Connection: close")
    head, body = request.split(b"\r\n\r\n", 1)
    await wire.send(head + b"\r\n")  # the head, in two writes, then the body in three
    await wire.send(b"\r\n")
    for start in range(0, len(body), len(body) // 3 + 1):
        await wire.send(body[start:start + len(body) // 3 + 1])
    status, headers, answer = await wire.answer()
    assert status == 200 and headers["connection"] == "close"
    assert json.loads(answer)["choices"][0]["message"]["content"]
    assert await wire.closed()
    assert await lane_counts(router.url, before) == (1, 0)


async def test_a_client_leaving_mid_stream_cancels_its_upstream(router_factory):
    router = router_factory(f"""
models:
  slow:
    cmd: {SIM} --port ${{PORT}} --model slow --tokens-per-second 20
""")
    before = await lane_counts(router.url)
    body = json.dumps({"model": "slow", "stream": True, "max_tokens": 2000,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    wire = await Wire.open(router.port)
    await wire.send(post(body))
    await asyncio.wait_for(wire.reader.readuntil(b"data: "), 30)  # the stream has begun
    async with aiohttp.ClientSession() as session:
        proxy = (await running(session, router.url))["slow"]["proxy"]
        assert (await sim_stats(session, proxy))["active"] == 1
        wire.writer.transport.abort()  # the client goes away mid-stream
        stats = await wait_for_stats(session, proxy, lambda stats: stats["cancelled"] == 1, timeout=30)
        assert stats["active"] == 0 and stats["completed"] == 0
    assert (await lane_counts(router.url, before))[0] == 1


@pytest.fixture
async def flood():
    """An upstream whose answer is 192 MiB of events, with what it has sent and whether it stalled.

    Past what the sockets between it and a client can hold: loopback's buffers grow to 32 MiB
    a receiving socket and 4 MiB a sending one here (tcp_rmem, tcp_wmem), 72 MiB over two hops."""
    total = 192 * 1024 * 1024
    block = b"data: " + b"x" * (64 * 1024 - 8) + b"\n\n"
    state = {"sent": 0, "stalled": asyncio.Event(), "total": total}

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while state["sent"] < total:
            if request.transport is not None and request.transport.get_write_buffer_size() > 0:
                state["stalled"].set()  # the socket to the router is full: the router stopped reading
            await response.write(block)
            state["sent"] += len(block)
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    state["url"] = f"http://127.0.0.1:{port}"
    yield state
    await runner.cleanup()


async def test_a_client_that_reads_nothing_holds_the_upstream_back(router_factory, flood):
    router = router_factory(f"""
captureBuffer: 0
models:
  flood:
    cmd: {PYTHON} -c "import time; time.sleep(100000)"
    proxy: {flood['url']}
    checkEndpoint: /health
""")
    before = await lane_counts(router.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port, limit=1024)
    writer.write(post(json.dumps({"model": "flood", "stream": True}).encode()))
    await writer.drain()
    await asyncio.wait_for(flood["stalled"].wait(), 60)
    # The router holds back: what the upstream has sent beyond what the client has read is
    # bounded by the sockets' buffers, at every read, far short of the 192 MiB a router that
    # ignored its client's full socket would take in (it reads the upstream dry, whatever the client does).
    received = 0
    ahead = flood["sent"]
    while chunk := await reader.read(1 << 20):  # now read it all: nothing was lost
        received += len(chunk)
        ahead = max(ahead, flood["sent"] - received)
        if received >= flood["total"]:
            break
    assert received >= flood["total"]
    assert ahead < flood["total"] // 2, f"the upstream got {ahead} bytes ahead of the client"
    writer.close()
    assert (await lane_counts(router.url, before))[0] >= 1


async def test_the_request_log_has_a_lane_request(router_factory):
    router = router_factory("logRequests: true\n" + CONFIG)
    before = await lane_counts(router.url)
    wire = await Wire.open(router.port)
    await wire.send(post(BODY, b"User-Agent: lane-test"))
    assert (await wire.answer())[0] == 200
    wire.close()
    assert await lane_counts(router.url, before) == (1, 0)
    line = await eventually(
        lambda: next((line for line in router.output().splitlines() if "lane-test" in line), None), 10,
        "the request's log line",
    )
    assert re.search(r'Request 127\.0\.0\.1 "POST /v1/chat/completions HTTP/1\.1" 200 \d+ "lane-test" \S+$', line), line


def test_swaplab_lane_says_on_or_off(monkeypatch):
    for value, wanted in (("", True), ("on", True), ("1", True), ("off", False), ("OFF", False), ("0", False)):
        monkeypatch.setenv("SWAPLAB_LANE", value)
        assert lane_enabled() is wanted, value
    monkeypatch.setenv("SWAPLAB_LANE", "fast")
    with pytest.raises(SwaplabError, match="say on or off"):
        lane_enabled()
    done = run_swaplab("serve", "--listen", f"127.0.0.1:{free_port()}", env={"SWAPLAB_LANE": "fast"}, timeout=60)
    assert done.returncode != 0 and "SWAPLAB_LANE='fast': say on or off" in done.stderr + done.stdout
