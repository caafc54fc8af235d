"""Clients that misuse a connection, met by both front doors alike: the lane (router/door/lane.py) and aiohttp's server.

Each test runs a real `swaplab serve` with the lane and another with `SWAPLAB_LANE=off` and
speaks raw sockets, where what matters is what the kernel accepts and when a socket ends.
"""

from __future__ import annotations

import json
import select
import socket
import time

import psutil
import pytest

from procs import SIM

CONFIG = f"""
models:
  m:
    cmd: {SIM} --port ${{PORT}} --model m
"""
MIB = 1024 * 1024


def request(body: bytes, *headers: bytes) -> bytes:
    head = [b"POST /v1/chat/completions HTTP/1.1", *headers, b"Content-Type: application/json",
            b"Content-Length: %d" % len(body)]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def read_to_end(sock: socket.socket, bound: float) -> bytes:
    """Everything the router sends until it closes the connection (or `bound` seconds pass)."""
    sock.settimeout(bound)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def send_unread(port: int, data: bytes, stall: float = 3.0) -> int:
    """Send `data` on one socket that never reads (a small receive buffer); the bytes the kernel accepted
    before the router stopped taking them (`stall` seconds without progress), or all of them."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    sent = 0
    try:
        while sent < len(data):
            _, writable, _ = select.select([], [sock], [], stall)
            if not writable:
                break
            try:
                sent += sock.send(data[sent:sent + MIB])
            except BlockingIOError:
                continue
        return sent
    finally:
        sock.close()


def peak_rss_growth(pid: int, before: int, settle: float = 3.0) -> int:
    """How far the router's memory rose above `before`, watched until it stops rising for `settle` seconds."""
    process = psutil.Process(pid)
    peak, last_rise = before, time.monotonic()
    while time.monotonic() - last_rise < settle:
        rss = process.memory_info().rss
        if rss > peak:
            peak, last_rise = rss, time.monotonic()
        time.sleep(0.1)
    return peak - before


def test_a_client_that_pipelines_without_reading_is_not_read_further(router_factory, tmp_path):
    # 20k requests the router answers itself (a 404 naming the 8 KB model name asked for): ~160 MiB
    # of answers that the client never reads. Before, the lane read and answered them all into its
    # transport's buffer (the kernel took every byte sent, the router grew by hundreds of MiB);
    # aiohttp's server waits for each answer to drain before the next request.
    body = json.dumps({"model": "x" * 8000, "messages": []}).encode()
    pipelined = request(body, b"Host: 127.0.0.1") * 20_000
    for lane in ("on", "off"):
        (tmp_path / lane).mkdir()
        router = router_factory(CONFIG, workdir=tmp_path / lane, env={"SWAPLAB_LANE": lane})
        before = psutil.Process(router.pid).memory_info().rss
        accepted = send_unread(router.port, pipelined)
        growth = peak_rss_growth(router.pid, before)
        assert accepted < 64 * MIB, f"lane {lane}: the router kept reading ({accepted / MIB:.0f} MiB of {len(pipelined) / MIB:.0f})"
        assert growth < 100 * MIB, f"lane {lane}: the router grew by {growth / MIB:.0f} MiB"
        router.close()


CHAT = json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode()


def answers_on_both_paths(router_factory, tmp_path, payload: bytes, *, half_close: bool = False) -> dict[str, bytes]:
    """What each front door (the lane, aiohttp's server) answers one connection that sends `payload`."""
    answers = {}
    for lane in ("on", "off"):
        (tmp_path / lane).mkdir()
        router = router_factory(CONFIG, workdir=tmp_path / lane, env={"SWAPLAB_LANE": lane})
        with socket.create_connection(("127.0.0.1", router.port)) as sock:
            sock.sendall(payload)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            answers[lane] = read_to_end(sock, 60)
        router.close()
    return answers


def test_a_client_that_half_closes_is_taken_to_have_left_on_both_front_doors(router_factory, tmp_path):
    """A FIN is how a client that left is told from one still reading: both front doors cancel the request it
    sent (cancel on disconnect rests on it, tests/test_router.py), and answer it the same way."""
    answers = answers_on_both_paths(router_factory, tmp_path, request(CHAT, b"Host: 127.0.0.1"), half_close=True)
    assert answers["on"] == answers["off"] == b"", answers


@pytest.mark.parametrize("hosts", [(), (b"Host: 127.0.0.1", b"Host: 127.0.0.1"), (b"Host: 127.0.0.1", b"host: localhost")],
                         ids=["no Host", "two Hosts", "two Hosts that differ"])
def test_host_rules_equal_aiohttps(router_factory, tmp_path, hosts):
    answers = answers_on_both_paths(router_factory, tmp_path, request(CHAT, *hosts))
    heads = {lane: answer.partition(b"\r\n\r\n") for lane, answer in answers.items()}
    assert (heads["on"][0].split(b"\r\n")[0], heads["on"][2]) == (heads["off"][0].split(b"\r\n")[0], heads["off"][2])
    assert heads["off"][0].split(b" ")[1] == b"400", answers
