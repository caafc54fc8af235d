"""What request bodies may take, on both front doors (the lane and aiohttp's server): a whole-body
deadline besides the idle one, and a bound on the bytes of bodies held at once (docs/security.md#limits).

Each test runs a real `swaplab serve` and speaks raw sockets. Nothing waits on a sleep for an
outcome: a trickling client sends its next byte only when no answer has come, and the held
bytes are read from the router's own gauge.
"""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.request

import pytest

from procs import SIM
from test_lane_hostile import read_to_end

MIB = 1024 * 1024
# Time enough for a trickling body to be cut at a deadline of one second, however busy the machine.
TRICKLE_BYTES = 600
TRICKLE_PACE = 0.05


def head(length: bytes, *headers: bytes) -> bytes:
    lines = [b"POST /v1/chat/completions HTTP/1.1", b"Host: 127.0.0.1", b"Content-Type: application/json",
             *((b"Content-Length: " + length,) if length else ()), *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def status_and_message(answer: bytes) -> tuple[int, str]:
    first, _, body = answer.partition(b"\r\n\r\n")
    status = int(first.split(b" ", 2)[1])
    try:
        return status, json.loads(body)["error"]["message"]
    except (ValueError, KeyError):
        return status, body.decode(errors="replace")


def trickle(port: int, first: bytes, piece: bytes) -> bytes:
    """Send `first`, then `piece` every TRICKLE_PACE seconds (each well within bodyTimeout) until the router
    answers or TRICKLE_BYTES pieces went; what it answered."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(first)
        for _ in range(TRICKLE_BYTES):
            readable, _, _ = select.select([sock], [], [], TRICKLE_PACE)
            if readable:
                break
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        return read_to_end(sock, 60)


TRICKLE_CONFIG = f"""
security:
  limits: {{bodyDeadline: 1}}
models:
  m:
    cmd: {SIM} --port ${{PORT}} --model m
"""


@pytest.mark.parametrize(("lane", "framing"), [("on", "length"), ("off", "length"), ("on", "chunked")],
                         ids=["lane", "aiohttp", "lane-router-chunked"])
def test_a_body_trickled_within_the_idle_timeout_is_cut_at_its_deadline(router_factory, tmp_path, lane, framing):
    """One byte every 50 ms never trips the 30 s idle timeout; before `bodyDeadline`, such a client held its
    connection (and a file) for as long as it liked: 1,100 of them kept /health failing."""
    router = router_factory(TRICKLE_CONFIG, env={"SWAPLAB_LANE": lane})
    if framing == "length":
        answer = trickle(router.port, head(b"%d" % TRICKLE_BYTES), b" ")
    else:  # a body of unknown length: aiohttp's server reads it, on the lane's router too
        answer = trickle(router.port, head(b"", b"Transfer-Encoding: chunked"), b"1\r\n \r\n")
    status, message = status_and_message(answer)
    assert (status, message) == (408, "the request body took more than 1 s in all (security.limits.bodyDeadline)")
    with urllib.request.urlopen(f"{router.url}/health", timeout=30) as response:
        assert response.status == 200


HELD_CONFIG = f"""
security:
  limits: {{maxBodyMB: 1, maxHeldBodiesMB: 1, bodyTimeout: 5}}
models:
  m:
    cmd: {SIM} --port ${{PORT}} --model m --tokens-per-second 20 --default-max-tokens 100000
"""
# 600 KiB: two do not fit in 1 MiB.
BIG = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 600 * 1024}]}).encode()


def held_bytes(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("swaplab:request_bodies_held_bytes "):
                return float(line.split()[1])
    raise AssertionError("no swaplab:request_bodies_held_bytes on /metrics")


def first_event(sock: socket.socket) -> bytes:
    """Read until the stream's first event: the request is being answered, its body held."""
    sock.settimeout(60)
    received = b""
    while b"data: " not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return received


@pytest.mark.parametrize("lane", ["on", "off"], ids=["lane", "aiohttp"])
def test_bodies_held_at_once_are_bounded_and_given_back(router_factory, tmp_path, lane):
    """A body read and waiting for its answer is held; past `maxHeldBodiesMB` the next waits, then is told to
    retry, and once the first is answered (its client gone) the same request goes through."""
    router = router_factory(HELD_CONFIG, env={"SWAPLAB_LANE": lane})
    assert held_bytes(router.url) == 0
    holder = socket.create_connection(("127.0.0.1", router.port))
    holder.sendall(head(b"%d" % len(BIG)) + BIG)
    assert first_event(holder).startswith(b"HTTP/1.1 200")
    assert held_bytes(router.url) == len(BIG)

    with socket.create_connection(("127.0.0.1", router.port)) as sock:
        sock.sendall(head(b"%d" % len(BIG)) + BIG)
        answer = read_to_end(sock, 60)
    status, message = status_and_message(answer)
    assert status == 503 and b"\r\nRetry-After: 1\r\n" in answer.partition(b"\r\n\r\n")[0], answer[:300]
    assert message == ("the router holds 0.6 MiB of request bodies already, and this one's 0.6 MiB would pass "
                       "security.limits.maxHeldBodiesMB (1); retry in a moment")

    holder.close()  # the first client leaves: its request is cancelled and its body let go
    deadline = time.monotonic() + 60
    while held_bytes(router.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held_bytes(router.url) == 0
    with socket.create_connection(("127.0.0.1", router.port)) as sock:
        sock.sendall(head(b"%d" % len(BIG)) + BIG)
        assert first_event(sock).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 60
    while held_bytes(router.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held_bytes(router.url) == 0


def test_held_bodies_must_fit_the_largest_body(tmp_path):
    from swaplab.config.loader import load_config_text
    from swaplab.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        load_config_text("security:\n  limits:\n    maxBodyMB: 512\n    maxHeldBodiesMB: 256\nmodels: {}\n", "c.yaml")
    assert str(refused.value.faults[0]) == (
        "c.yaml:4: security.limits.maxHeldBodiesMB (256) must be at least maxBodyMB (512): "
        "a body the router takes must fit in what it may hold")
    # Left out, it follows a larger maxBodyMB; set, it holds.
    raised = load_config_text("security:\n  limits:\n    maxBodyMB: 2048\nmodels: {}\n", "c.yaml").security.limits
    assert raised.max_held_body_bytes == 2048 * MIB
    assert load_config_text("models: {}\n").security.limits.max_held_body_bytes == 1024 * MIB
    assert load_config_text("models: {}\n").security.limits.body_deadline == 300


CROWD = 400
CROWD_CONFIG = f"""
models:
  m:
    cmd: {SIM} --port ${{PORT}} --model m
"""


def test_a_crowd_of_trickling_clients_past_the_inherited_file_limit_does_not_stop_health(router_factory):
    """The router raises its soft open-file limit to the hard one (as Go programs do): started under a soft
    limit of 256, it still takes /health while 400 clients hold a half-sent body each."""
    import resource

    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * CROWD:
        pytest.skip(f"the hard open-file limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        router = router_factory(CROWD_CONFIG)  # inherits the soft limit of 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert psutil.Process(router.pid).rlimit(psutil.RLIMIT_NOFILE)[0] == hard
    crowd = []
    try:
        for _ in range(CROWD):
            sock = socket.create_connection(("127.0.0.1", router.port))
            sock.sendall(head(b"100") + b'{"model": ')
            crowd.append(sock)
        with urllib.request.urlopen(f"{router.url}/health", timeout=30) as response:
            assert response.status == 200
    finally:
        for sock in crowd:
            sock.close()
