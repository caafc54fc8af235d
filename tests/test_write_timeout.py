"""`security.limits.writeTimeout`: a client that never reads its stream cannot hold a swap (issue 38)."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from procs import SIM
from swaplab.router.watch.writetimeout import Stall, next_stall, stalled_too_long

# Two models that swap with each other (one at a time); a's stream is unpaced and endless
# enough to fill any socket buffer long before it ends.
CONFIG = f"""
security:
  limits: {{writeTimeout: 1}}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --tokens-per-second 0 --default-max-tokens 100000000
  b:
    cmd: {SIM} --port ${{PORT}} --model b
"""
HANG_GUARD = 60  # not a timing assertion: before the fix, b's request waited here (and forever)


async def _inflight_streaming(url: str, model: str) -> None:
    """Returns once `/api/events` shows a request for `model` whose answer has started (its model is held)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/api/events") as events:
        lines: list[str] = []
        async for raw in events.content:
            line = raw.decode().rstrip("\n")
            if line:
                lines.append(line)
                continue
            data = next((item.removeprefix("data:") for item in lines if item.startswith("data:")), None)
            lines = []
            if data is None:
                continue
            envelope = json.loads(data)
            if envelope["type"] != "inflight":
                continue
            message = json.loads(envelope["data"])
            entries = message.get("requests", []) if message["operation"] == "snapshot" else [message.get("request")]
            if any(entry and entry["model"] == model and entry["resp_bytes"] > 0 for entry in entries):
                return


@pytest.mark.parametrize("lane", ["on", "off"])
async def test_a_client_that_never_reads_is_cut_and_another_model_is_served(router_factory, lane):
    router = router_factory(CONFIG, env={"SWAPLAB_LANE": lane})
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    silent.connect(("127.0.0.1", router.port))
    try:
        body = json.dumps({"model": "a", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
        silent.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        # ... and never reads a byte.
        await asyncio.wait_for(_inflight_streaming(router.url, "a"), HANG_GUARD)

        async with aiohttp.ClientSession() as session:
            request = {"model": "b", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(f"{router.url}/v1/chat/completions", json=request,
                                    timeout=aiohttp.ClientTimeout(total=HANG_GUARD)) as answer:
                assert answer.status == 200
                served = await answer.json()
            assert served["choices"][0]["message"]["content"]

            async with session.get(f"{router.url}/api/activity", params={"model": "a"}) as response:
                rows = (await response.json())["activity"]
    finally:
        silent.close()
    (row,) = [row for row in rows if row["model"] == "a"]
    assert row["error"] == "the client read nothing for 1 s: cut (security.limits.writeTimeout)", row
    assert row["client_disconnected"]
    assert "Traceback" not in router.output()


@pytest.mark.parametrize(
    "previous, sent, buffered, now, stall, cut",
    [
        (None, 1000, 0, 5.0, None, False),  # nothing waits: the kernel took it all
        (None, 1000, 200, 5.0, Stall(800, 5.0), False),  # bytes wait: a stall may begin
        (Stall(800, 5.0), 1000, 200, 5.9, Stall(800, 5.0), False),
        (Stall(800, 5.0), 1000, 200, 6.0, Stall(800, 5.0), True),  # nothing left for the limit: cut
        (Stall(800, 5.0), 1000, 100, 6.0, Stall(900, 6.0), False),  # a slow reader read: not cut
        (Stall(800, 5.0), 5000, 4000, 6.0, Stall(1000, 6.0), False),  # bytes left though more were added
        (Stall(800, 5.0), 1300, 500, 6.0, Stall(800, 5.0), True),  # more added, none left
        (Stall(800, 5.0), 1000, 0, 9.0, None, False),  # drained
    ],
)
def test_a_stall_is_time_without_bytes_leaving(previous, sent, buffered, now, stall, cut):
    assert next_stall(previous, sent, buffered, now) == stall
    assert stalled_too_long(stall, now, 1.0) is cut
