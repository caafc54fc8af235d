"""Peers: two real routers, one the peer of the other; a probe that notices a retired model."""

from __future__ import annotations

import aiohttp
import pytest

from procs import PYTHON, SIM, eventually
from swaplab.router.path.peers import verdict

RETIRING_SCRIPT = """
import os, sys
from aiohttp import web
# A cloud tag: answers normally until the flag file exists, then HTTP 410 like a retired tag.
flag = sys.argv[2]
async def chat(request):
    body = await request.json()
    if os.path.exists(flag):
        return web.json_response({"error": "model 'cloud' has been retired"}, status=410)
    return web.json_response({"object": "chat.completion", "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})
app = web.Application()
app.router.add_get("/health", lambda r: web.Response(text="ok"))
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


@pytest.fixture
def two_routers(router_factory, tmp_path):
    script = tmp_path / "retiring.py"
    script.write_text(RETIRING_SCRIPT)
    flag = tmp_path / "retired"
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    remote = router_factory(f"""
apiKeys: [sk-peer]
models:
  x:
    cmd: {SIM} --port ${{PORT}} --model x
  cloud:
    cmd: {PYTHON} {script} ${{PORT}} {flag}
  slow:
    cmd: {SIM} --port ${{PORT}} --model slow --ttft-ms 5000
""", workdir=tmp_path / "b")
    local = router_factory(f"""
models:
  here:
    cmd: {SIM} --port ${{PORT}} --model here
peers:
  b:
    proxy: {remote.url}
    apiKey: sk-peer
    probe: 0.2
    models: [x, cloud]
  b-slow:
    proxy: {remote.url}
    apiKey: sk-peer
    timeouts:
      responseHeader: 1
    models: [slow]
""", workdir=tmp_path / "a")
    return local, remote, flag


async def get_json(session, url):
    async with session.get(url) as response:
        return await response.json()


async def chat(session, url, model):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        return response.status, await response.json(content_type=None)


async def test_peer_traffic_goes_to_the_peer_with_its_key(two_routers):
    local, remote, _ = two_routers
    async with aiohttp.ClientSession() as session:
        await chat(session, local.url, "here")  # a local model is running
        for name in ("b/x", "x"):
            status, body = await chat(session, local.url, name)
            assert status == 200, body  # the remote router demands sk-peer: the key was injected
            assert body["model"] == "x"
        local_running = await get_json(session, f"{local.url}/running")
    assert [e["model"] for e in local_running["running"]] == ["here"]  # peer traffic touched no local backend
    assert "sk-peer" not in str(local_running) and "sk-peer" not in local.output()


async def test_probe_marks_a_retired_model_unavailable_and_notices_recovery(two_routers):
    local, _, flag = two_routers

    async def status_of(session, model):
        listing = await get_json(session, f"{local.url}/v1/models")
        return next(entry for entry in listing["data"] if entry["id"] == model)

    async def until(session, model, wanted, timeout=20):
        seen = [None]

        async def became():
            seen[0] = await status_of(session, model)
            return seen[0] if seen[0]["status"]["state"] == wanted else None

        return await eventually(became, timeout, lambda: f"{model} to become {wanted}, last {seen[0]}", interval=0.05)

    async with aiohttp.ClientSession() as session:
        await until(session, "b/cloud", "available")
        flag.write_text("retired")
        entry = await until(session, "b/cloud", "unavailable")
        assert "410" in entry["unavailable_reason"] and "retired" in entry["unavailable_reason"]
        status, body = await chat(session, local.url, "b/cloud")
        assert status == 503 and "410" in body["error"]["message"]
        running = await get_json(session, f"{local.url}/running")
        assert {"peer": "b", "model": "cloud", "available": False} .items() <= next(
            p for p in running["peers"] if p["model"] == "cloud"
        ).items()
        assert (await status_of(session, "b/x"))["status"] == {"value": "unloaded", "state": "available"}  # only the retired one
        flag.unlink()
        await until(session, "b/cloud", "available")
        status, _ = await chat(session, local.url, "b/cloud")
        assert status == 200


async def test_response_header_timeout_is_honoured(two_routers):
    local, _, _ = two_routers
    async with aiohttp.ClientSession() as session:
        status, body = await chat(session, local.url, "b-slow/slow")
    assert status == 504
    assert "no response header within 1 s" in body["error"]["message"]


@pytest.mark.parametrize(
    "status, body, available, reason",
    [
        (200, "{}", True, ""),
        (429, "slow down", True, ""),  # rate-limited is alive
        (410, '{"error": "model retired"}', False, 'HTTP 410 (gone: retired): {"error": "model retired"}'),
        (404, "", False, "HTTP 404 (not found)"),
        (400, "extra usage balance is empty", False, "HTTP 400: extra usage balance is empty"),
        (502, "bad\n  gateway", False, "HTTP 502: bad gateway"),
    ],
)
def test_probe_verdicts(status, body, available, reason):
    health = verdict(status, body)
    assert (health.available, health.reason) == (available, reason)
