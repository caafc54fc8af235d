"""The rest of llama-swap's surface: keys, filters, limits, listing, preload, load, log streaming."""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import pytest

from procs import PYTHON, SIM, eventually, wait_until

ECHO_SCRIPT = """
import json, sys
from aiohttp import web
# Answers every POST with what it received: the body and the credential headers.
async def echo(request):
    body = await request.read()
    return web.json_response({
        "body": json.loads(body) if body else None,
        "authorization": request.headers.get("Authorization"),
        "x_api_key": request.headers.get("x-api-key"),
        "path": request.path_qs,
    })
app = web.Application()
app.router.add_get("/health", lambda r: web.Response(text="ok"))
app.router.add_post("/{tail:.*}", echo)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


@pytest.fixture
def echo_script(tmp_path):
    path = tmp_path / "echo.py"
    path.write_text(ECHO_SCRIPT)
    return path


async def post(session, url, body, headers=None):
    async with session.post(url, json=body, headers=headers) as response:
        return response.status, await response.json(content_type=None), response.headers


async def test_api_keys_guard_every_route_but_health(router_factory, echo_script):
    router = router_factory(f"""
apiKeys: [sk-one, sk-two]
models:
  echo:
    cmd: {PYTHON} {echo_script} ${{PORT}}
""")
    url = f"{router.url}/v1/chat/completions"
    body = {"model": "echo", "messages": []}
    basic = "Basic " + base64.b64encode(b"anyone:sk-two").decode()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/health") as response:
            assert response.status == 200
        for path in ("/v1/models", "/running", "/logs"):
            async with session.get(router.url + path) as response:
                assert response.status == 401, path
        status, error, headers = await post(session, url, body, {"Authorization": "Bearer sk-wrong"})
        assert status == 401 and error["error"]["type"] == "authentication_error"
        # Basic is not offered unless security.basicAuth asks: a browser would remember it and send it cross-site.
        assert headers.getall("WWW-Authenticate") == ['Bearer realm="swaplab"']
        async with session.get(f"{router.url}/ui") as response:
            assert response.status == 200  # the page itself is open; it sends the key for data
        # The streams a browser opens without headers (EventSource) take the key as ?api_key=, and only they.
        async with session.get(f"{router.url}/api/events?api_key=sk-one") as response:
            assert response.status == 200
        async with session.get(f"{router.url}/api/events?api_key=sk-wrong") as response:
            assert response.status == 401
        async with session.get(f"{router.url}/running?api_key=sk-one") as response:
            assert response.status == 401
        async with session.options(url) as response:
            assert response.status == 401  # an OPTIONS that is no CORS preflight needs the key like any method
        preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
        async with session.options(url, headers=preflight) as response:
            assert response.status == 204  # a preflight carries no credentials: the router answers it
        for credentials in ({"Authorization": "Bearer sk-one"}, {"x-api-key": "sk-two"}, {"Authorization": basic}):
            status, echoed, _ = await post(session, url, body, credentials)
            assert status == 200, credentials
            # The router's key stays with the router: the backend never sees it.
            assert echoed["authorization"] is None and echoed["x_api_key"] is None
    assert "sk-one" not in router.output() and "sk-two" not in router.output()


async def test_use_model_name_and_filters_rewrite_the_body(router_factory, echo_script):
    router = router_factory(f"""
models:
  echo:
    cmd: {PYTHON} {echo_script} ${{PORT}}
    useModelName: served-name
    filters:
      stripParams: "temperature, top_p, model"
      setParams:
        max_tokens: 7
        chat_template_kwargs: {{enable_thinking: false}}
""")
    async with aiohttp.ClientSession() as session:
        status, echoed, _ = await post(session, f"{router.url}/v1/chat/completions", {
            "model": "echo", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.9, "top_p": 0.5,
            "max_tokens": 1000, "seed": 3,
        })
    assert status == 200
    assert echoed["body"] == {
        "model": "served-name",  # never stripped, renamed by useModelName
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 7,
        "seed": 3,
        "chat_template_kwargs": {"enable_thinking": False},
    }


RAW_ECHO_SCRIPT = """
import sys
from aiohttp import web
async def echo(request):  # the bytes received, whatever their type
    return web.json_response({"raw": (await request.read()).decode(errors="replace")})
app = web.Application()
app.router.add_get("/health", lambda r: web.Response(text="ok"))
app.router.add_post("/{tail:.*}", echo)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def test_use_model_name_renames_a_forms_model_field_too(router_factory, tmp_path):
    script = tmp_path / "raw_echo.py"
    script.write_text(RAW_ECHO_SCRIPT)
    router = router_factory(f"""
models:
  whisper:
    cmd: {PYTHON} {script} ${{PORT}}
    useModelName: served-name
""")
    form = aiohttp.FormData()
    form.add_field("model", "whisper")
    form.add_field("file", b"RIFF....", filename="a.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/audio/transcriptions", data=form) as response:
            assert response.status == 200
            raw = (await response.json())["raw"]
    # As llama-swap's ReplaceRequestModel: the upstream sees its own name, the file untouched.
    assert 'name="model"\r\n\r\nserved-name\r\n' in raw and "whisper" not in raw
    assert 'filename="a.wav"' in raw and "RIFF...." in raw


async def test_concurrency_limit_answers_429_with_retry_after(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --ttft-ms 1500
    concurrencyLimit: 2
""")
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        first = [asyncio.ensure_future(post(session, f"{router.url}/v1/chat/completions", body)) for _ in range(2)]

        async def both_held() -> bool:
            async with session.get(f"{router.url}/running") as response:
                entries = (await response.json())["running"]
            return sum(entry["in_flight"] + entry["queued"] for entry in entries) >= 2

        await eventually(both_held, 30, "both requests to be held against the limit")
        status, error, headers = await post(session, f"{router.url}/v1/chat/completions", body)
        assert status == 429 and headers["Retry-After"] == "1"
        assert "concurrencyLimit" in error["error"]["message"]
        assert [result[0] for result in await asyncio.gather(*first)] == [200, 200]


async def test_listing_honours_unlisted_and_include_aliases(router_factory):
    router = router_factory(f"""
includeAliasesInList: true
models:
  shown:
    cmd: {SIM} --port ${{PORT}} --model shown
    aliases: [shown-alias]
    name: Shown Model
  hidden:
    cmd: {SIM} --port ${{PORT}} --model hidden
    unlisted: true
""")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/v1/models") as response:
            listed = {entry["id"]: entry for entry in (await response.json())["data"]}
        async with session.get(f"{router.url}/api/models") as response:
            detailed = {entry["id"]: entry for entry in (await response.json())["models"]}
        status, _, _ = await post(session, f"{router.url}/v1/chat/completions", {"model": "hidden", "messages": [{"role": "user", "content": "hi"}]})
    assert set(listed) == {"shown", "shown-alias"}
    assert listed["shown-alias"]["alias_of"] == "shown" and listed["shown"]["name"] == "Shown Model"
    assert detailed["hidden"]["unlisted"] is True and detailed["shown"]["aliases"] == ["shown-alias"]
    assert status == 200  # unlisted is not unreachable


async def test_preload_starts_models_at_startup(router_factory):
    router = router_factory(f"""
hooks:
  on_startup:
    preload: [b-alias]
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
  b:
    cmd: {SIM} --port ${{PORT}} --model b
    aliases: [b-alias]
""")

    def b_ready():
        import urllib.request

        with urllib.request.urlopen(f"{router.url}/running") as response:
            return {e["model"]: e["state"] for e in json.load(response)["running"]}.get("b") == "ready"

    wait_until(b_ready, 30, "the preloaded model to be ready")


async def test_load_and_unload_endpoints(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/load?model=a") as response:
            assert response.status == 200 and await response.json() == {"loaded": "a"}
        async with session.get(f"{router.url}/running") as response:
            assert [e["state"] for e in (await response.json())["running"]] == ["ready"]
        async with session.post(f"{router.url}/load?model=zzz") as response:
            assert response.status == 404
        async with session.post(f"{router.url}/unload?model=a") as response:
            assert await response.json() == {"unloaded": ["a"]}
        async with session.get(f"{router.url}/running") as response:
            assert (await response.json())["running"] == []


async def test_a_model_without_cmd_loads_and_fails_only_when_started(router_factory):
    # llama-swap loads such a config and fails the model's start; so does swaplab, at once and saying why.
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
  nocmd:
    proxy: http://127.0.0.1:9
""")
    body = {"model": "nocmd", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        status, error, _ = await post(session, f"{router.url}/v1/chat/completions", body)
        assert status >= 500 and "model 'nocmd' has no cmd" in error["error"]["message"]
        status, _, _ = await post(session, f"{router.url}/v1/chat/completions", {**body, "model": "a"})
        assert status == 200


async def test_logs_stream_sends_backend_output_live(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/logs/stream") as stream:
            assert stream.headers["Content-Type"] == "text/event-stream"
            async with session.post(f"{router.url}/load?model=a") as response:
                assert response.status == 200
            seen = []
            async with asyncio.timeout(20):
                async for raw in stream.content:
                    if raw.startswith(b"data: "):
                        seen.append(json.loads(raw[6:]))
                    ready = any(e["source"] == "router" and "a ready" in e["text"] for e in seen)
                    # The backend's own output comes through its pipe, in its own time.
                    if ready and any(e["source"] == "a" and "listening" in e["text"] for e in seen):
                        break


async def test_ttl_unloads_a_model_after_its_last_request(router_factory):
    router = router_factory(f"""
globalTTL: 1
models:
  short:
    cmd: {SIM} --port ${{PORT}} --model short --tokens-per-second 4
  never:
    cmd: {SIM} --port ${{PORT}} --model never
    ttl: 0
groups:
  both:
    swap: false
    members: [short, never]
""")
    async with aiohttp.ClientSession() as session:

        async def states():
            async with session.get(f"{router.url}/running") as response:
                return {e["model"]: e["state"] for e in (await response.json())["running"]}

        for model in ("never", "short"):
            async with session.post(f"{router.url}/load?model={model}") as response:
                assert response.status == 200
        # A 2 s stream outlives the 1 s ttl: the ttl counts from the end of the last request.
        body = {"model": "short", "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert (await response.read()).rstrip().endswith(b"data: [DONE]")
        assert (await states())["short"] == "ready"

        async def short_unloaded() -> bool:
            return "short" not in await states()

        await eventually(short_unloaded, 30, "the ttl to unload short")
        assert await states() == {"never": "ready"}  # ttl: 0 overrides globalTTL


async def test_send_loading_state_streams_progress_until_the_model_is_ready(router_factory):
    router = router_factory(f"""
sendLoadingState: true
models:
  slow:
    cmd: {SIM} --port ${{PORT}} --model slow --load-seconds 2.5
  quiet:
    cmd: {SIM} --port ${{PORT}} --model quiet --load-seconds 1
    sendLoadingState: false
""")
    body = {"model": "slow", "stream": True, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200 and response.headers["Content-Type"] == "text/event-stream"
            raw = (await response.read()).decode()
        events = [block.removeprefix("data: ") for block in raw.split("\n\n") if block.startswith("data: ")]
        chunks = [json.loads(event) for event in events[:-1]]
        reasoning = [c["choices"][0]["delta"].get("reasoning_content") for c in chunks if c["choices"]]
        loading = [text for text in reasoning if text]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert len(loading) >= 2 and all("loading slow" in text for text in loading)  # about one a second
        assert content == " tok0 tok1 tok2" and events[-1] == "[DONE]"  # then the model's own stream

        # Not for a model that opts out, nor for a non-streaming request.
        async with session.post(f"{router.url}/v1/chat/completions", json={**body, "model": "quiet"}) as response:
            assert "reasoning_content" not in await response.text()
        async with session.post(f"{router.url}/v1/chat/completions", json={**body, "stream": False}) as response:
            assert response.headers["Content-Type"].startswith("application/json")


async def test_send_loading_state_ends_with_an_error_event_when_the_start_fails(router_factory):
    router = router_factory(f"""
sendLoadingState: true
models:
  broken:
    cmd: {PYTHON} -c "import sys; sys.exit(4)"
    proxy: http://127.0.0.1:9
""")
    body = {"model": "broken", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            raw = (await response.read()).decode()
    last = json.loads(raw.strip().split("\n\n")[-1].removeprefix("data: "))
    assert "exited with code 4 while starting" in last["error"]["message"]


@pytest.mark.parametrize(
    "content_type, body, model",
    [
        ("application/json", b'{"model": "a", "messages": []}', "a"),
        ("application/json", b'  {"model": "\xc3\xa9t\xc3\xa9"}', "\u00e9t\u00e9"),
        # What orjson refuses and json takes still names its model: NaN, integers beyond 64 bits.
        ("application/json", b'{"model": "a", "temperature": NaN}', "a"),
        ("application/json", b'{"model": "a", "seed": 123456789012345678901234567890}', "a"),
        ("application/json", b'{"model": 7}', None),
        ("application/json", b"[1, 2]", None),
        ("application/json", b"", None),
        ("text/plain", b"", None),  # no body: nothing to read, whatever the label
        (None, b'{"model": "a"}', "a"),
        ("application/problem+json", b'{"model": "a"}', "a"),
    ],
)
def test_the_model_is_read_from_any_json_body_a_client_sends(content_type, body, model):
    from swaplab.router.path.filters import encode
    from swaplab.router.path.targets import model_from_body

    name, document = model_from_body(content_type, body)
    assert name == model
    if name is not None:
        assert model_from_body(content_type, encode(document))[0] == model  # a rewritten body reads the same
