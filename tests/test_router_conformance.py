"""What clients of OpenAI's API and llama-swap's web page ask that the router answers as they expect (issue 22):
`GET /v1/models/{id}` through the `openai` SDK, 404 for an unknown route and 405 only for another method of a
known one, a `checkEndpoint` without its `/`, and the exact requests llama-swap's page makes (its Load button,
a selector's label, a model's log)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from swaplab.fleet.engineapi import check_url
from swaplab.router.path.targets import Tracking, upstream_tracking

from procs import SIM, Sim, eventually, run_swaplab
from routerclient import chat
from test_llama_swap_api import EventStream

MESSAGES = [{"role": "user", "content": "hi"}]


def two_models(extra: str = "") -> str:
    return f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
  "org/b:q4":
    cmd: {SIM} --port ${{PORT}} --model b
    name: Bee
{extra}"""


async def test_models_retrieve_answers_the_lists_record_and_a_404_for_an_unknown_id(router_factory, tmp_path):
    peer = Sim(tmp_path, model="remote-model")
    try:
        router = router_factory(two_models(f"""
peers:
  far:
    proxy: {peer.url}
    models: [remote-model]
"""))
        client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused")
        try:
            listed = {model.id: model for model in (await client.models.list()).data}
            # A slash (a peer's model, an org's), a llama-swap-style `:`: the SDK sends them as %2F and `:`.
            for model_id in ("a", "org/b:q4", "far/remote-model"):
                retrieved = await client.models.retrieve(model_id)
                assert retrieved.id == model_id and retrieved.object == "model"
                assert retrieved.model_dump() == listed[model_id].model_dump()
            assert (await client.models.retrieve("org/b:q4")).model_extra["name"] == "Bee"
            with pytest.raises(openai.NotFoundError) as missing:
                await client.models.retrieve("nope")
            assert missing.value.status_code == 404
            assert "model 'nope' not found" in missing.value.body["message"]
        finally:
            await client.close()
    finally:
        peer.close()


@pytest.mark.parametrize("include_aliases", [False, True])
async def test_models_retrieve_answers_an_alias_as_the_list_names_it(router_factory, include_aliases):
    """A name a chat can use is one retrieve answers: an alias's record is the one `/v1/models` lists
    under it with `includeAliasesInList` (its own id, `alias_of` its model), whether or not that is on."""
    router = router_factory(f"""
includeAliasesInList: {str(include_aliases).lower()}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
    name: Ay
    aliases: [fast, "team/a:latest"]
  hidden:
    cmd: {SIM} --port ${{PORT}} --model hidden
    unlisted: true
    aliases: [secret]
""")
    client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused")
    try:
        listed = {model.id: model for model in (await client.models.list()).data}
        assert ("fast" in listed) is include_aliases
        for alias in ("fast", "team/a:latest"):
            retrieved = await client.models.retrieve(alias)
            assert (retrieved.id, retrieved.object, retrieved.model_extra["alias_of"]) == (alias, "model", "a")
            assert retrieved.model_extra["name"] == "Ay"
            assert retrieved.model_extra["meta"]["llamaswap"] == {"type": "alias", "modelID": "a"}
            if include_aliases:
                assert retrieved.model_dump() == listed[alias].model_dump()
        assert (await client.models.retrieve("a")).model_dump() == listed["a"].model_dump()
        for unlisted in ("hidden", "secret"):  # a model kept out of the list stays out, by id and by alias
            with pytest.raises(openai.NotFoundError):
                await client.models.retrieve(unlisted)
        # the name retrieve answers is one a chat uses; the record then says its model is loaded
        chatted = await client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=2)
        assert chatted.choices[0].message.content
        assert (await client.models.retrieve("fast")).model_extra["status"]["value"] == "loaded"
    finally:
        await client.close()


UNKNOWN_ROUTES = [
    ("GET", "/api/nothing"),  # neither llama-swap's /api/* nor Ollama's
    ("POST", "/api/chats"),
    ("GET", "/v2/models"),
    ("PATCH", "/nowhere/at/all"),
    ("OPTIONS", "/api/nothing"),
]
OTHER_METHOD = [
    ("GET", "/v1/chat/completions", "POST"),
    ("DELETE", "/v1/models", "GET, HEAD"),
    ("POST", "/health", "GET, HEAD"),
    ("PUT", "/logs/stream/a", "GET, HEAD"),
    ("POST", "/v1/models/a", "GET, HEAD"),
    ("DELETE", "/api/show", "POST"),  # Ollama's routes (issue 26)
    ("GET", "/api/chat", "POST"),
]


async def test_an_unknown_route_is_a_json_404_and_only_a_known_path_answers_405(router_factory):
    router = router_factory(two_models())
    async with aiohttp.ClientSession() as session:
        for method, path in UNKNOWN_ROUTES:
            async with session.request(method, f"{router.url}{path}") as response:
                assert response.status == 404, (method, path)
                assert (await response.json())["error"]["message"] == f"unknown route {method} {path}"
        for method, path, allowed in OTHER_METHOD:
            async with session.request(method, f"{router.url}{path}") as response:
                assert response.status == 405, (method, path)
                assert response.headers["Allow"] == allowed
                assert "method not allowed" in (await response.json())["error"]["message"]
        # Every method of /upstream/ reaches the model, and an unknown model there is the model's 404.
        async with session.delete(f"{router.url}/upstream/nope/x") as response:
            assert response.status == 404 and "model 'nope' not found" in (await response.json())["error"]["message"]


@pytest.mark.parametrize(("proxy", "check", "url"), [
    ("http://127.0.0.1:8200", "health", "http://127.0.0.1:8200/health"),
    ("http://127.0.0.1:8200", "/health", "http://127.0.0.1:8200/health"),
    ("http://127.0.0.1:8200/", "/health", "http://127.0.0.1:8200/health"),
    ("http://h:1/v1", "health", "http://h:1/v1/health"),
    ("http://h:1/v1/", "health", "http://h:1/v1/health"),
    ("http://h:1", "/", "http://h:1/"),
    ("http://h:1", "http://elsewhere/health", "http://h:1/health"),  # the host is the proxy's, as in Go
    ("http://h:1?k=1", "/ready?full=1", "http://h:1/ready?k=1&full=1"),
])
def test_check_url_joins_as_go_single_joining_slash(proxy, check, url):
    assert check_url(proxy, check) == url


async def test_a_check_endpoint_without_its_slash_gets_ready_and_config_check_warns(router_factory, tmp_path):
    router = router_factory(f"""
healthCheckTimeout: 15
models:
  h:
    cmd: {SIM} --port ${{PORT}} --model h
    checkEndpoint: health
""")
    async with aiohttp.ClientSession() as session:
        began = time.monotonic()
        async with session.post(f"{router.url}/load", params={"model": "h"}) as response:
            assert response.status == 200, await response.text()
        assert time.monotonic() - began < 10
        assert (await chat(session, router.url, "h", max_tokens=1))[0] == 200
    checked = run_swaplab("config", "check", str(tmp_path / "config.yaml"))
    assert checked.returncode == 0
    assert "models.h: checkEndpoint 'health' has no leading '/': asked as '/health'" in checked.stderr
    assert run_swaplab("config", "check", "--strict", str(tmp_path / "config.yaml")).returncode == 1


@pytest.mark.parametrize(("method", "path", "tracking"), [
    ("GET", "/", Tracking(in_flight=False, activity=False)),  # the page's Load button
    ("GET", "/sim/stats", Tracking(in_flight=False, activity=False)),
    ("GET", "/v1/models", Tracking(in_flight=False, activity=False)),
    ("POST", "/v1/chat/completions", Tracking(in_flight=True, activity=True)),
    ("GET", "/v1/chat/completions", Tracking(in_flight=False, activity=False)),
    ("GET", "/props", Tracking(in_flight=True, activity=False)),  # llama-swap meters POSTs only
    ("POST", "/props", Tracking(in_flight=False, activity=True)),
    ("POST", "/v1/audio/transcriptions", Tracking(in_flight=True, activity=True)),
])
def test_upstream_tracking_is_llama_swaps(method, path, tracking):
    assert upstream_tracking(method, path) == tracking


def ui_config(extra: str = "") -> str:
    return two_models(f"""
groups:
  both:
    swap: false
    members: [a, "org/b:q4"]
selectors:
  pool:
    strategy: spillover
    targets: [a, "org/b:q4"]
  named:
    strategy: pin
    targets: [a]
    name: Named pool
{extra}""")


async def test_the_pages_load_button_leaves_no_activity_row_nor_in_flight_entry(router_factory):
    router = router_factory(ui_config())
    url = router.url
    async with aiohttp.ClientSession() as session, session.get(f"{url}/api/events") as events:
        stream = EventStream(events)
        await stream.until("inflight")  # the opening snapshot
        # llama-swap's ui/src/stores/api.ts loadModel: `fetch(`/upstream/${model}/?_=${Date.now()}`)`.
        async with session.get(f"{url}/upstream/a/?_={int(time.time() * 1000)}") as response:
            assert response.status == 404  # the sim has no page at / (llama.cpp has): it started all the same
        await stream.until("modelStatus", lambda models: any(m["id"] == "a" and m["state"] == "ready" for m in models))
        async with session.post(f"{url}/upstream/a/v1/chat/completions",
                                json={"model": "a", "messages": MESSAGES, "max_tokens": 1}) as response:
            assert response.status == 200
        upsert = await stream.until("inflight", lambda m: m["operation"] == "upsert")
        assert upsert["request"]["method"] == "POST"  # the chat's: the Load's came first and was never told
        assert not [m for kind, m in stream.seen if kind == "inflight" and m.get("request", {}).get("method") == "GET"]

        async def rows() -> list | None:
            async with session.get(f"{url}/api/activity") as response:
                found = (await response.json())["activity"]
            return found or None

        (row,) = await eventually(rows, 10, "the chat's activity row")
        assert row["path"] == "/v1/chat/completions"
        await asyncio.sleep(0.2)  # a batch later, still the one row
        assert len(await rows()) == 1


async def test_a_selector_without_a_name_has_none_in_the_list(router_factory):
    router = router_factory(ui_config())
    async with aiohttp.ClientSession() as session, session.get(f"{router.url}/v1/models") as response:
        records = {entry["id"]: entry for entry in (await response.json())["data"]}
    # llama-swap's page labels a selector `${id} - ${name}` when it has a name: "pool - pool" otherwise.
    assert "name" not in records["pool"]
    assert records["named"]["name"] == "Named pool"
    assert records["a"]["name"] == "a"  # a model's label falls back to its id (docs/config.md, Differences)


async def test_a_models_log_stream_is_its_raw_output(router_factory):
    router = router_factory(ui_config())
    url = router.url
    async with aiohttp.ClientSession() as session:
        assert (await chat(session, url, "org/b:q4", max_tokens=1))[0] == 200
        # llama-swap's ui/src/stores/modelLogs.ts: `fetch(`/logs/stream/${encodeURIComponent(modelId)}`)`.
        async with session.get(f"{url}/logs/stream/org%2Fb%3Aq4") as response:
            assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
            first = (await response.content.readline()).decode()
        assert first.strip() and not first.startswith("[org/b:q4] ")
        async with session.get(f"{url}/logs/stream/upstream") as response:
            mixed = (await response.content.readline()).decode()
        assert mixed == f"[org/b:q4] {first}"  # the mixed log says whose line it is (docs/config.md, Differences)
