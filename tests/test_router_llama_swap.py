"""llama-swap's newer router features over real HTTP, with `swaplab sim` backends: setParamsByID, profiles,
selectors, capabilities, ignorePaths, websockets under /upstream/, the logging keys and store.path."""

from __future__ import annotations

import asyncio
import re
import signal
import sqlite3

import aiohttp

from swaplab.client import OpenAIClient
from swaplab.grill.runner import metadata_temperature

from procs import SIM, Sim, SwaplabProcess, eventually, free_port, free_port_block
from routerclient import chat, running, wait_for_state

MESSAGES = [{"role": "user", "content": "hi"}]


async def last_request(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(f"{url}/sim/last-request") as response:
        assert response.status == 200
        return await response.json()


async def test_set_params_by_id_names_route_and_their_params_reach_the_upstream(router_factory, tmp_path):
    peer = Sim(tmp_path, model="remote-model")
    try:
        router = router_factory(f"""
models:
  gemma:
    cmd: {SIM} --port ${{PORT}} --model gemma
    filters:
      setParams:
        temperature: 0.7
        chat_template_kwargs.enable_thinking: true
      setParamsByID:
        "${{MODEL_ID}}:no_think":
          chat_template_kwargs.enable_thinking: false
        "gemma:cold":
          temperature: 0.1
peers:
  far:
    proxy: {peer.url}
    models: [remote-model]
    filters:
      setParamsByID:
        far/remote-model:
          top_k: 5
""")
        async with aiohttp.ClientSession() as session:
            upstream = f"{router.url}/upstream/gemma"
            status, answer = await chat(session, router.url, "gemma:no_think", max_tokens=1)
            assert status == 200, answer
            sent = (await last_request(session, upstream))["body"]
            assert sent["chat_template_kwargs"] == {"enable_thinking": False} and sent["temperature"] == 0.7
            assert sent["model"] == "gemma:no_think"  # the name the client used, as llama-swap sends it

            await chat(session, router.url, "gemma:cold", max_tokens=1)
            sent = (await last_request(session, upstream))["body"]
            assert sent["temperature"] == 0.1 and sent["chat_template_kwargs"] == {"enable_thinking": True}

            await chat(session, router.url, "gemma", max_tokens=1)  # the model's own name: setParams alone
            assert (await last_request(session, upstream))["body"]["temperature"] == 0.7

            # A peer's setParamsByID applies by the requested name, and is not an alias.
            status, _ = await chat(session, router.url, "far/remote-model", max_tokens=1)
            assert status == 200
            assert (await last_request(session, peer.url))["body"]["top_k"] == 5

            async with session.get(f"{router.url}/v1/models") as response:
                listed = {entry["id"]: entry for entry in (await response.json())["data"]}
        assert set(listed["gemma"]["meta"]["llamaswap"]["aliases"]) == {"gemma:cold", "gemma:no_think"}
    finally:
        peer.close()


async def test_a_profile_switched_over_http_changes_where_a_name_routes(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
  b:
    cmd: {SIM} --port ${{PORT}} --model b
profiles:
  work:
    description: the big one
    pins:
      assistant: a
  home:
    pins:
      assistant: b
      a: ~
""")
    url = router.url
    async with aiohttp.ClientSession() as session:
        status, answer = await chat(session, url, "assistant")
        assert status == 404, answer  # no profile active: not a name

        async with session.put(f"{url}/api/profiles/active", json={"name": "work"}) as response:
            assert response.status == 200 and await response.json() == {"active": "work"}
        status, _ = await chat(session, url, "assistant", max_tokens=1)
        assert status == 200
        assert set(await running(session, url)) == {"a"}
        assert (await last_request(session, f"{url}/upstream/a"))["body"]["model"] == "a"
        # A name given as ?model= is rewritten there.
        async with session.post(f"{url}/v1/chat/completions?model=assistant", json={"messages": MESSAGES}) as response:
            assert response.status == 200
        assert (await last_request(session, f"{url}/upstream/a"))["path"] == "/v1/chat/completions?model=a"

        async with session.put(f"{url}/api/profiles/active", json={"name": "home"}) as response:
            assert await response.json() == {"active": "home"}
        status, _ = await chat(session, url, "assistant", max_tokens=1)
        assert status == 200
        assert set(await running(session, url)) == {"b"}
        # A disabled pin answers as llama-swap does.
        status, error = await chat(session, url, "a")
        assert status == 404 and error == {"src": "llama-swap", "error": {
            "message": "no model id could be identified", "type": "invalid_request_error", "param": None,
            "code": "not_found",
        }}
        # /upstream/<pin>/ follows the pin too.
        async with session.get(f"{url}/upstream/assistant/v1/models") as response:
            assert (await response.json())["data"][0]["id"] == "b"

        async with session.get(f"{url}/api/profiles") as response:
            assert await response.json() == {"active": "home", "profiles": [
                {"id": "home", "description": "", "pins": {"assistant": "b", "a": ""}},
                {"id": "work", "description": "the big one", "pins": {"assistant": "a"}},
            ]}
        async with session.get(f"{url}/v1/models") as response:
            listed = {entry["id"]: entry for entry in (await response.json())["data"]}
        assert listed["assistant"]["meta"] == {"llamaswap": {"type": "profile"}}

        for body, status, message in (
            ({"name": "nope"}, 404, 'profile "nope" not found'),
            ({}, 400, "profile name is required"),
            ({"name": 3}, 400, "profile name must be a string or null"),
        ):
            async with session.put(f"{url}/api/profiles/active", json=body) as response:
                assert response.status == status and (await response.json())["error"]["message"] == message

        # A reload starts with no profile active.
        router.signal(signal.SIGHUP)

        async def deactivated() -> bool:
            async with session.get(f"{url}/api/profiles") as response:
                return (await response.json())["active"] is None

        await eventually(deactivated, 30, "the reload to deactivate the profile")


async def test_a_urlencoded_form_names_its_model_and_is_renamed_as_llama_swap_renames_it(router_factory):
    """llama-swap reads `model` from a urlencoded form too: pins and `useModelName` rewrite the form field."""
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
    useModelName: served-a
profiles:
  work:
    pins:
      assistant: a
""")
    url = router.url
    async with aiohttp.ClientSession() as session:
        async with session.put(f"{url}/api/profiles/active", json={"name": "work"}) as response:
            assert response.status == 200
        async with session.post(f"{url}/v1/completions", data={"model": "assistant", "prompt": "a&b"}) as response:
            assert response.status == 400  # the sim speaks JSON only: what matters is what it was sent
        assert set(await running(session, url)) == {"a"}
        received = await last_request(session, f"{url}/upstream/a")
        assert received["content_type"] == "application/x-www-form-urlencoded"
        assert received["body"] == "model=served-a&prompt=a%26b"


async def test_a_spillover_selector_moves_to_its_next_target_while_the_first_is_busy(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --ttft-ms 1500
  b:
    cmd: {SIM} --port ${{PORT}} --model b --ttft-ms 1500
  c:
    cmd: {SIM} --port ${{PORT}} --model c
groups:
  together:
    swap: false
    members: [a, b, c]
selectors:
  fleet:
    strategy: spillover
    targets: [a, b, c]
    settings:
      spillover: 1
""")
    url = router.url
    async with aiohttp.ClientSession() as session:
        first = asyncio.ensure_future(chat(session, url, "fleet", max_tokens=1))

        async def a_busy() -> bool:
            return (await running(session, url)).get("a", {}).get("in_flight") == 1

        await eventually(a_busy, 30, "the first request to be in flight on a")
        second = asyncio.ensure_future(chat(session, url, "fleet", max_tokens=1))

        async def b_busy() -> bool:
            return (await running(session, url)).get("b", {}).get("in_flight") == 1

        await eventually(b_busy, 30, "the second request to spill over to b")
        assert [status for status, _ in await asyncio.gather(first, second)] == [200, 200]
        # Both reservations were given back: a is the least reserved ready target again, and
        # c (cold) is not woken.
        status, _ = await chat(session, url, "fleet", max_tokens=1)
        assert status == 200
        assert "c" not in await running(session, url)
        async with session.get(f"{url}/upstream/a/sim/stats") as response:
            assert (await response.json())["completed"] == 2
        async with session.get(f"{url}/v1/models") as response:
            listed = {entry["id"]: entry for entry in (await response.json())["data"]}
        assert listed["fleet"]["meta"]["llamaswap"] == {
            "type": "selector", "strategy": "spillover", "targets": ["a", "b", "c"], "spillover": 1,
        }
        assert listed["fleet"]["status"] == {"value": "loaded", "state": "ready"}


async def test_ignore_paths_answer_409_without_starting_the_model(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
upstream:
  ignorePaths: ['^/static/', '\\.map$']
""")
    url = router.url
    async with aiohttp.ClientSession() as session:
        for path in ("/static/app.js", "/bundle.js.map"):
            async with session.get(f"{url}/upstream/a{path}") as response:
                assert response.status == 409
                assert await response.json() == {"src": "llama-swap", "error": {
                    "message": "model a is not loaded; path matches upstream.ignorePaths",
                    "type": "invalid_request_error", "param": None, "code": "conflict",
                }}
        async with session.get(f"{url}/upstream/a/static/x.css", headers={"Accept": "text/plain"}) as response:
            assert await response.text() == "llama-swap: model a is not loaded; path matches upstream.ignorePaths"
        assert await running(session, url) == {}  # nothing was started
        # /upstream/<model> without its slash is redirected, as llama-swap does.
        async with session.get(f"{url}/upstream/a", allow_redirects=False) as response:
            assert response.status == 301 and response.headers["Location"] == "/upstream/a/"
        async with session.get(f"{url}/upstream/a/sim/stats") as response:  # not ignored: starts it
            assert response.status == 200
        async with session.get(f"{url}/upstream/a/static/app.js") as response:
            assert response.status == 404  # ready now: passed to the server (which has no such file)


async def test_websockets_pass_through_upstream_both_ways(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
  quiet:
    cmd: {SIM} --port ${{PORT}} --model quiet
    compat:
      ignoreWebsockets: true
groups:
  both:
    swap: false
    members: [a, quiet]
""")
    url = router.url
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/upstream/a/sim/ws") as socket:  # starts a, like any request
            await socket.send_str("hello")
            assert (await socket.receive()).data == "hello"
            await socket.send_bytes(b"\x00\xff")
            assert (await socket.receive()).data == b"\x00\xff"
            assert (await running(session, url))["a"]["in_flight"] == 1  # held for the socket's life
            await socket.send_str("close 4002")  # the upstream closes: the client sees its code
            message = await socket.receive()
            assert message.type is aiohttp.WSMsgType.CLOSE and message.data == 4002
        async with session.ws_connect(f"{url}/upstream/a/sim/ws") as socket:
            await socket.send_str("x")
            await socket.receive()
            await socket.close(code=4001)  # the client closes: the upstream sees its code

        async def upstream_saw_close() -> bool:
            async with session.get(f"{url}/logs", params={"source": "a"}) as response:
                return "closed by the client with code 4001" in await response.text()

        await eventually(upstream_saw_close, 10, "the sim to log the client's close code")

        # compat.ignoreWebsockets: never starts the model, never counts.
        try:
            async with session.ws_connect(f"{url}/upstream/quiet/sim/ws"):
                raise AssertionError("an ignored websocket started the model")
        except aiohttp.WSServerHandshakeError as refused:
            assert refused.status == 409
        assert "quiet" not in await running(session, url)
        async with session.post(f"{url}/load", params={"model": "quiet"}) as response:
            assert response.status == 200
        async with session.ws_connect(f"{url}/upstream/quiet/sim/ws") as socket:
            await socket.send_str("still here")
            assert (await socket.receive()).data == "still here"
            assert (await running(session, url))["quiet"]["in_flight"] == 0


async def test_capabilities_in_the_model_list(router_factory):
    router = router_factory(f"""
includeAliasesInList: true
models:
  vision:
    cmd: {SIM} --port ${{PORT}} --model vision
    aliases: [eyes]
    metadata:
      temperature: 0.6
      context_length: 1
    capabilities:
      in: [text, image]
      out: [text]
      tools: true
      context: 32000
""")
    async with aiohttp.ClientSession() as session:
        # A browser page on a loopback origin may read the list (a foreign one may not: test_security).
        async with session.get(f"{router.url}/v1/models", headers={"Origin": "http://localhost:5173"}) as response:
            assert response.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
            listed = {entry["id"]: entry for entry in (await response.json())["data"]}
    vision = listed["vision"]
    assert {key: vision[key] for key in ("architecture", "capabilities", "supported_parameters", "context_length",
                                         "meta")} == {
        "architecture": {"input_modalities": ["text", "image"], "output_modalities": ["text"],
                         "modality": "text+image->text"},
        "capabilities": {"vision": True, "function_calling": True},
        "supported_parameters": ["tools", "tool_choice"],
        "context_length": 32000,
        "meta": {"llamaswap": {"temperature": 0.6, "type": "model", "aliases": ["eyes"]}, "n_ctx": 32000},
    }
    assert listed["eyes"]["meta"]["llamaswap"] == {"temperature": 0.6, "type": "alias", "modelID": "vision"}
    assert listed["eyes"]["capabilities"] == vision["capabilities"]
    # grill's default temperature is the one the model's metadata gives, read where llama-swap lists it.
    async with OpenAIClient(router.url) as client:
        assert await metadata_temperature(client, await client.server_info("vision")) == 0.6


async def test_logging_keys_shape_what_reaches_stdout(router_factory):
    router = router_factory(f"""
logToStdout: both
logTimeFormat: rfc3339
logRequests: true
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    async with aiohttp.ClientSession() as session:
        status, _ = await chat(session, router.url, "a", max_tokens=1)
        assert status == 200
        async with session.get(f"{router.url}/metrics"):
            pass  # polled endpoints stay out of the request log

    def logged() -> str | None:
        output = router.output()
        return output if '"POST /v1/chat/completions HTTP/1.1" 200' in output else None

    output = await eventually(logged, 10, "the request line")
    line = next(line for line in output.splitlines() if "POST /v1/chat/completions" in line)
    assert re.fullmatch(
        r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d) INFO swaplab\.router: Request 127\.0\.0\.1 '
        r'"POST /v1/chat/completions HTTP/1\.1" 200 \d+ "[^"]*" [\d.]+(µs|ms|s)', line
    ), line
    assert "GET /metrics" not in output
    # the backend's output, under its name, after the time in the same layout
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d) \[a\] ", output, re.MULTILINE)

    quiet = router_factory(f"""
logToStdout: none
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    async with aiohttp.ClientSession() as session:
        await chat(session, quiet.url, "a", max_tokens=1)
        async with session.get(f"{quiet.url}/logs") as response:
            kept = await response.text()
    assert "[router]" in kept  # /logs keeps everything
    [line] = quiet.output().strip().splitlines()
    assert re.fullmatch(rf"{LOCAL_TIME} swaplab: listening on {quiet.url} \(.*\)", line), line


LOCAL_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
"""swaplab's console time when `logTimeFormat` is unset: `2026-12-07 17:40:22`, local."""


async def test_every_console_line_starts_with_the_local_time_unless_log_time_format_says_none(router_factory):
    router = router_factory(f"""
logToStdout: both
logRequests: true
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    async with aiohttp.ClientSession() as session:
        assert (await chat(session, router.url, "a", max_tokens=1))[0] == 200

    def logged() -> str | None:
        output = router.output()
        return output if '"POST /v1/chat/completions HTTP/1.1" 200' in output else None

    lines = (await eventually(logged, 10, "the request line")).strip().splitlines()
    untimed = [line for line in lines if not re.match(rf"{LOCAL_TIME} ", line)]
    assert not untimed, untimed
    kinds = {re.sub(rf"^{LOCAL_TIME} ", "", line).split(" ", 1)[0] for line in lines}
    assert {"swaplab:", "INFO", "[a]"} <= kinds, kinds  # the start line, the router's lines, the backend's

    bare = router_factory(f"""
logTimeFormat: none
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    started = await eventually(
        lambda: next((line for line in bare.output().splitlines() if "listening on" in line), None), 10, "the start line"
    )
    assert started.startswith("swaplab: listening on "), started
    assert not any(re.match(rf"{LOCAL_TIME} ", line) for line in bare.output().splitlines())


async def test_store_path_is_the_activity_store_without_db(tmp_path):
    store = tmp_path / "store" / "llama-swap.db"
    store.parent.mkdir()
    elsewhere = tmp_path / "env.db"
    config = tmp_path / "config.yaml"
    port = free_port()
    config.write_text(f"""
startPort: {free_port_block()}
store:
  path: {store}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    router = SwaplabProcess(
        ["serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"), "--config", str(config)],
        tmp_path / "router.log", env={"SWAPLAB_DB": str(elsewhere)},
    )
    try:
        router.wait_http(f"http://127.0.0.1:{port}/health")
        async with aiohttp.ClientSession() as session:
            status, _ = await chat(session, f"http://127.0.0.1:{port}", "a", max_tokens=1)
            assert status == 200
            await wait_for_state(session, f"http://127.0.0.1:{port}", "a", "ready")

        def recorded() -> bool:
            if not store.exists():
                return False
            with sqlite3.connect(store) as connection:
                return connection.execute("SELECT count(*) FROM activity WHERE model = 'a'").fetchone()[0] == 1

        await eventually(recorded, 10, "the request to be recorded in store.path")
        assert not elsewhere.exists()  # the config's store wins over $SWAPLAB_DB
    finally:
        router.close()
