"""The router end to end: a real `swaplab serve` in front of real `swaplab sim` backends."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from procs import PYTHON, SIM, Router, SwaplabProcess, alive, eventually, free_port, wait_until
from routerclient import chat, running, sim_stats, wait_for_state, wait_for_stats


def two_sims(extra_a: str = "", extra_b: str = "", top: str = "") -> str:
    return f"""
healthCheckTimeout: 30
{top}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a {extra_a}
    aliases: [alpha]
  b:
    cmd: {SIM} --port ${{PORT}} --model b {extra_b}
"""


async def test_swap_a_b_a_runs_one_backend_at_a_time(router_factory):
    router = router_factory(two_sims())
    async with aiohttp.ClientSession() as session:
        pids = []
        for model in ("a", "b", "alpha"):
            status, body = await chat(session, router.url, model)
            assert status == 200, body
            state = await running(session, router.url)
            ready = [m for m, entry in state.items() if entry["state"] == "ready"]
            assert ready == [{"alpha": "a"}.get(model, model)], state
            pids.append(state[ready[0]]["pid"])
        # Each swap stopped the previous backend before the next one served.
        assert not alive(pids[0]) and not alive(pids[1])
        assert alive(pids[2]) and len(set(pids)) == 3


async def test_unknown_model_is_404_listing_models(router_factory):
    router = router_factory(two_sims())
    async with aiohttp.ClientSession() as session:
        status, body = await chat(session, router.url, "nope")
    assert status == 404
    assert "'nope' not found" in body["error"]["message"]
    assert body["error"]["available"] == ["a", "alpha", "b"]


async def test_requests_held_during_a_slow_start_are_all_answered(router_factory):
    router = router_factory(two_sims(extra_a="--load-seconds 1.5"))
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(chat(session, router.url, "a", max_tokens=3) for _ in range(8)))
        state = await running(session, router.url)
    assert [status for status, _ in results] == [200] * 8, results
    assert all(body["choices"][0]["message"]["content"] for _, body in results)
    assert state["a"]["state"] == "ready"


async def test_generate_readiness_does_not_trust_a_lying_health(router_factory, tmp_path):
    # The sim answers /health 200 during its load while generation fails, as the
    # seed's SGLang did for five minutes.
    lying = "--load-seconds 2 --health-before-ready"
    config = f"""
healthCheckTimeout: 30
models:
  trusting:
    cmd: {SIM} --port ${{PORT}} --model trusting {lying}
  careful:
    cmd: {SIM} --port ${{PORT}} --model careful {lying}
    checkEndpoint: generate
"""
    router = router_factory(config)
    async with aiohttp.ClientSession() as session:
        status, _ = await chat(session, router.url, "trusting")
        assert status == 503  # /health said ready: the request reached a server that cannot serve
        status, body = await chat(session, router.url, "careful")
        assert status == 200, body  # held until a real one-token generation succeeded


async def test_client_disconnect_cancels_the_upstream_stream(router_factory):
    # The first token goes out at once, the second 125 s later (the sim paces token i at
    # TTFT + i / rate). A cancel seen within the 30 s waited for below came from the closed
    # connection: a write-triggered one could only come with the second token.
    router = router_factory(two_sims(extra_a="--tokens-per-second 0.008"))
    async with aiohttp.ClientSession() as session:
        body = {"model": "a", "stream": True, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
        response = await session.post(f"{router.url}/v1/chat/completions", json=body)
        assert response.status == 200
        await response.content.readline()  # the first bytes arrived: generation is under way
        proxy = (await running(session, router.url))["a"]["proxy"]
        assert (await sim_stats(session, proxy))["active"] == 1
        response.close()  # the client goes away mid-stream
        gone = time.monotonic()
        async with aiohttp.ClientSession() as probe:
            # Far below the 125 s to the next token write: no write can have triggered it.
            await wait_for_stats(probe, proxy, lambda stats: stats["cancelled"] == 1, timeout=30)
        print(f"upstream cancelled {(time.monotonic() - gone) * 1000:.1f} ms after the client left")
        stats = await sim_stats(session, proxy)
        assert stats["active"] == 0 and stats["completed"] == 0


async def test_client_disconnect_before_first_byte_cancels_upstream(router_factory):
    router = router_factory(two_sims(extra_a="--ttft-ms 60000"))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/upstream/a/health") as response:
            assert response.status == 200  # started and ready; generation now takes 60 s
        proxy = (await running(session, router.url))["a"]["proxy"]
        body = {"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        pending = asyncio.ensure_future(session.post(f"{router.url}/v1/chat/completions", json=body))
        await wait_for_stats(session, proxy, lambda stats: stats["active"] == 1)
        pending.cancel()  # the client gives up before any byte came back
        stats = await wait_for_stats(session, proxy, lambda stats: stats["cancelled"] == 1)
        assert stats["active"] == 0


async def test_queued_request_whose_client_left_is_dropped(router_factory):
    router = router_factory(two_sims(extra_a="--load-seconds 3"))
    async with aiohttp.ClientSession() as session:
        body = {"model": "a", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        pending = asyncio.ensure_future(session.post(f"{router.url}/v1/chat/completions", json=body))

        async def queued(count: int) -> bool:
            return (await running(session, router.url)).get("a", {}).get("queued", 0) == count

        await eventually(lambda: queued(1), 30, "the request to queue while a loads")
        pending.cancel()
        await eventually(lambda: queued(0), 10, "the abandoned request to leave the queue")


async def test_crash_mid_stream_ends_with_error_event_and_next_request_restarts(router_factory):
    router = router_factory(two_sims(extra_a="--crash-after-tokens 5"))
    async with aiohttp.ClientSession() as session:
        body = {"model": "a", "stream": True, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            events = [line for line in (await response.read()).decode().split("\n\n") if line.strip()]
        last = json.loads(events[-1].removeprefix("data: "))
        assert "error" in last, events[-3:]
        assert "[DONE]" not in events[-1]
        await wait_for_state(session, router.url, "a", "stopped")  # the crash is noticed, not hidden
        status, reply = await chat(session, router.url, "a", max_tokens=3)
        assert status == 200, reply
        assert (await running(session, router.url))["a"]["state"] == "ready"


async def test_a_busy_model_is_never_evicted(router_factory):
    router = router_factory(two_sims(extra_a="--tokens-per-second 20"))
    async with aiohttp.ClientSession() as session:
        body = {"model": "a", "stream": True, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            first = await response.content.readline()
            assert first.startswith(b"data:")
            b_request = asyncio.ensure_future(chat(session, router.url, "b"))
            rest = await response.read()
        assert rest.rstrip().endswith(b"data: [DONE]")  # a's stream completed untouched
        status, _ = await b_request
        assert status == 200


async def test_interleaved_requests_are_served_in_batches(router_factory):
    router = router_factory(two_sims(extra_a="--ttft-ms 300", extra_b="--ttft-ms 300"))
    async with aiohttp.ClientSession() as session:
        tasks = []

        async def all_arrived() -> bool:
            # Every request not yet answered is held (queued or in flight) by the router.
            held = sum(entry["in_flight"] + entry["queued"] for entry in (await running(session, router.url)).values())
            return held >= sum(not task.done() for task in tasks)

        for model in ("a", "b", "a", "b"):
            tasks.append(asyncio.ensure_future(chat(session, router.url, model, max_tokens=2)))
            # The next request leaves once the router holds this one: it sees them in this order.
            await eventually(all_arrived, 10, f"the router to hold request {len(tasks)} ({model})")
        results = await asyncio.gather(*tasks)
        async with session.get(f"{router.url}/logs") as response:
            logs = await response.text()
    assert [status for status, _ in results] == [200] * 4
    # A B A B was served A A then B B: each model started once.
    assert logs.count("a starting") == 1 and logs.count("b starting") == 1, logs


async def test_model_named_by_query_multipart_and_upstream_path(router_factory):
    router = router_factory(two_sims())
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{router.url}/v1/completions?model=b", json={"prompt": "one two", "max_tokens": 2}
        ) as response:
            assert response.status == 200 and (await response.json())["model"] == "b"
        form = aiohttp.FormData()
        form.add_field("model", "alpha")
        form.add_field("file", b"RIFF....", filename="a.wav", content_type="audio/wav")
        async with session.post(f"{router.url}/v1/audio/transcriptions", data=form) as response:
            # The sim has no transcription endpoint: a 404 from *the sim* proves the routing.
            assert response.status == 404
            state = await running(session, router.url)
            assert state["a"]["state"] == "ready"
        async with session.get(f"{router.url}/upstream/b/sim/stats") as response:
            assert response.status == 200 and "requests" in await response.json()
        async with session.get(f"{router.url}/v1/models") as response:
            listed = {entry["id"]: entry["status"]["state"] for entry in (await response.json())["data"]}
        assert listed == {"a": "stopped", "b": "ready"}


async def test_large_request_body_is_relayed(router_factory):
    router = router_factory(two_sims())
    prompt = "word " * (14 * 1024 * 1024)  # 70 MiB of prompt
    async with aiohttp.ClientSession() as session:
        status, body = await chat(session, router.url, "a", messages=[{"role": "user", "content": prompt}], max_tokens=1)
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == 14 * 1024 * 1024


def backend_pids(router: Router) -> list[int]:
    import urllib.request

    with urllib.request.urlopen(f"{router.url}/running") as response:
        return [entry["pid"] for entry in json.load(response)["running"] if entry["pid"]]


def load_model(router: Router, model: str) -> None:
    import urllib.request

    request = urllib.request.Request(
        f"{router.url}/v1/completions",
        data=json.dumps({"model": model, "prompt": "hi", "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        assert response.status == 200


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_no_backend_outlives_the_router(router_factory, how):
    router = router_factory(two_sims())
    load_model(router, "a")
    pids = backend_pids(router)
    assert len(pids) == 1 and alive(pids[0])
    router.signal(how)
    router.wait(30)
    wait_until(lambda: not alive(pids[0]), 15, f"backend {pids[0]} to exit after the router got {how.name}")


GRANDCHILD_SCRIPT = """
import subprocess, sys, time, os
from aiohttp import web
# A server that leaves a grandchild which ignores SIGTERM: what escapes the parent-death signal.
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
app = web.Application()
app.router.add_get("/health", lambda r: web.Response(text="ok"))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def test_leftovers_of_a_killed_router_are_reaped_at_next_start(router_factory, tmp_path):
    script = tmp_path / "server.py"
    script.write_text(GRANDCHILD_SCRIPT)
    marker = tmp_path / "grandchild.pid"
    config = f"""
models:
  leaky:
    cmd: {PYTHON} {script} ${{PORT}} {marker}
    checkEndpoint: /health
"""
    port = free_port()
    first = router_factory(config, port=port)
    async_load = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", f"{first.url}/upstream/leaky/health"], check=False
    )
    assert async_load.returncode == 0
    grandchild = int(wait_until(lambda: marker.exists() and marker.read_text(), 10, "the grandchild pid"))
    assert alive(grandchild)
    first.signal(signal.SIGKILL)
    first.wait(30)
    assert alive(grandchild)  # it ignores SIGTERM and sits in the backend's process group
    second = router_factory(config, port=port)
    assert not alive(grandchild), second.output()
    assert "reaping" in second.output()


def test_serve_refuses_a_broken_config_with_file_line_errors(tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text(
        """models:
  a:
    cmd: echo ${nope} ${PORT}
    aliases: [x]
  b:
    cmd: echo ${PORT}
    aliases: [x]
"""
    )
    result = subprocess.run(
        [sys.executable, "-m", "swaplab", "serve", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    check = subprocess.run(
        [sys.executable, "-m", "swaplab", "config", "check", str(config)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 2
    assert result.stderr.splitlines() == check.stdout.splitlines()  # the same lines as `config check`
    assert [line.split(": ")[0] for line in check.stdout.splitlines()] == [f"{config}:3", f"{config}:7"]


def test_missing_binary_fails_that_model_with_a_clear_error(router_factory):
    config = f"""
models:
  elsewhere:
    cmd: /opt/not/on/this/box/llama-server --port ${{PORT}}
  here:
    cmd: {SIM} --port ${{PORT}} --model here
"""
    router = router_factory(config)
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{router.url}/v1/chat/completions",
        data=json.dumps({"model": "elsewhere", "messages": []}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request)
    assert raised.value.code == 503
    message = json.load(raised.value)["error"]["message"]
    assert "/opt/not/on/this/box/llama-server" in message and "does not exist" in message
    load_model(router, "here")


async def test_peer_models_are_relayed_without_touching_local_backends(router_factory, tmp_path):
    sim_port = free_port()
    remote = SwaplabProcess(["sim", "--port", str(sim_port), "--model", "remote-model"], tmp_path / "peer.log")
    try:
        remote.wait_http(f"http://127.0.0.1:{sim_port}/health")
        router = router_factory(two_sims(top=f"""
peers:
  far:
    proxy: http://127.0.0.1:{sim_port}
    apiKey: sk-peer-secret
    models: [m1]
"""))
        async with aiohttp.ClientSession() as session:
            status, body = await chat(session, router.url, "a")  # a local model is running
            assert status == 200
            for name in ("far/m1", "m1"):  # the bare name is unambiguous here
                status, body = await chat(session, router.url, name, max_tokens=2)
                assert status == 200, body
                assert body["model"] == "m1"  # the peer saw its own name for the model
            state = await running(session, router.url)
            async with session.get(f"{router.url}/v1/models") as response:
                listed = [entry["id"] for entry in (await response.json())["data"]]
        assert state["a"]["state"] == "ready" and "b" not in state  # no swap for peer traffic
        assert "far/m1" in listed
        assert "sk-peer-secret" not in json.dumps(state)
    finally:
        remote.close()


async def test_a_crash_loop_backs_off_visibly(router_factory):
    router = router_factory(two_sims(extra_a="--crash-after-tokens 1"))
    body = {"model": "a", "stream": True, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # each request restarts the backend, which crashes again
            async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                assert b'"error"' in await response.read()
            await wait_for_state(session, router.url, "a", "stopped")
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 503
            assert int(response.headers["Retry-After"]) >= 1
            assert "failed 2 times in a row" in (await response.json())["error"]["message"]
        entry = (await running(session, router.url))["a"]
    assert entry["consecutive_failures"] == 2 and entry["backoff_seconds"] > 0
    assert "exited with code 1" in entry["last_error"]


async def test_a_second_failed_start_quotes_its_own_output_once(router_factory):
    # The log buffer spans runs: the second failure used to quote the first one's line too.
    router = router_factory(f"""
healthCheckTimeout: 30
models:
  doomed:
    cmd: >-
      {PYTHON} -c "raise SystemExit('CUDA error: out of memory')" --port ${{PORT}}
""")
    async with aiohttp.ClientSession() as session:

        async def failed_start() -> str:
            async with session.post(f"{router.url}/load?model=doomed") as response:
                assert response.status == 503
                message = (await response.json())["error"]["message"]
            return "" if "times in a row" in message else message  # the backoff refused it: again

        first = await eventually(failed_start, 30, "a failed start")
        second = await eventually(failed_start, 30, "a second failed start")
        entry = (await running(session, router.url))["doomed"]
    assert entry["consecutive_failures"] == 2
    for message in (first, second, entry["last_error"]):
        assert message.count("CUDA error: out of memory") == 1, message


STUBBORN_SCRIPT = """
import signal, sys
from aiohttp import web
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops it
app = web.Application()
app.router.add_get("/health", lambda r: web.Response(text="ok"))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, handle_signals=False)
"""


# post_json gives up on a server that sends nothing for this long.
ANSWER_TIMEOUT_S = 120


def post_json(url: str, body: dict | None = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_stop_escalates_to_sigkill_after_unload_timeout(router_factory, tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_SCRIPT)
    router = router_factory(f"""
models:
  stubborn:
    cmd: {PYTHON} {script} ${{PORT}}
    unloadTimeout: 1
""")
    load = subprocess.run(["curl", "-sf", f"{router.url}/upstream/stubborn/health"], capture_output=True, text=True)
    assert load.stdout == "ok"
    (pid,) = backend_pids(router)
    status, body = post_json(f"{router.url}/unload?model=stubborn")
    assert status == 200 and body == {"unloaded": ["stubborn"]}
    assert not alive(pid)  # SIGTERM was ignored; SIGKILL after unloadTimeout was not
    assert "did not exit within 1 s: SIGKILL" in router.output()


def test_cmd_stop_runs_with_the_pid(router_factory, tmp_path):
    marker = tmp_path / "stopped-pid"
    stopper = f"import os, sys; open({str(marker)!r}, 'w').write(sys.argv[1]); os.kill(int(sys.argv[1]), 15)"
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
    cmdStop: {PYTHON} -c "{stopper}" ${{PID}}
""")
    load_model(router, "a")
    (pid,) = backend_pids(router)
    status, body = post_json(f"{router.url}/unload")
    assert status == 200 and body == {"unloaded": ["a"]}
    assert marker.read_text() == str(pid)
    assert not alive(pid)


def test_a_backend_that_exits_while_starting_fails_fast_with_its_output(router_factory):
    # healthCheckTimeout is five times post_json's ANSWER_TIMEOUT_S: a router that waited for it
    # would have the request time out, so an answer at all is an answer that did not wait.
    router = router_factory(f"""
healthCheckTimeout: {5 * ANSWER_TIMEOUT_S}
models:
  broken:
    cmd: |
      {PYTHON} -c "import sys; print('CUDA error: out of memory', flush=True); sys.exit(3)"
    proxy: http://127.0.0.1:9
""")
    status, body = post_json(f"{router.url}/v1/chat/completions", {"model": "broken", "messages": []})
    assert status == 503  # answered within ANSWER_TIMEOUT_S: it did not wait for healthCheckTimeout
    message = body["error"]["message"]
    assert "exited with code 3 while starting" in message and "CUDA error: out of memory" in message


def test_a_backend_never_ready_gives_up_after_health_check_timeout(router_factory):
    router = router_factory(f"""
healthCheckTimeout: 15
models:
  slow:
    cmd: {SIM} --port ${{PORT}} --model slow --load-seconds 600
""")
    status, body = post_json(f"{router.url}/v1/chat/completions", {"model": "slow", "messages": []})
    assert status == 503
    assert "not ready after 15 s" in body["error"]["message"]
    assert backend_pids(router) == []  # the half-started server was stopped
