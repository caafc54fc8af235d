"""The engine contracts (src/swaplab/engines/contracts/*.yaml, read from the engines' releases) and
the sim held to them: what `swaplab sim --engine E` answers is what the contract says E answers.

A change to a contract (a newer release read) that the sim does not follow fails here; so does a
change to the sim that the contract does not say. Each check speaks real HTTP to a real sim.
"""

from __future__ import annotations

import re

import aiohttp
import pytest

from swaplab.engines import ENGINES, contract

SIM_ENGINES = ("vllm", "sglang", "llamacpp", "tabby")
# The routes the sim has at all (it serves no engine's every route); the contract decides which answer.
SIM_ROUTES = (
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"), ("GET", "/v1/models"), ("POST", "/tokenize"), ("POST", "/detokenize"),
    ("GET", "/tokenizer_info"), ("POST", "/v1/embeddings"), ("GET", "/health"),
)
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
ORIGIN = re.compile(r"[\w./-]+\.(?:py|cpp|h|yml|go):\d+")


@pytest.mark.parametrize("engine", ENGINES)
def test_every_fact_says_where_it_comes_from(engine):
    facts = contract(engine)
    assert facts.release and facts.read_from
    for route in facts.routes:
        assert ORIGIN.search(route.origin), (engine, route.path)
    assert ORIGIN.search(facts.auth.origin), engine
    if facts.served_name.unknown_model is not None:
        assert ORIGIN.search(facts.served_name.unknown_model.origin), engine
    for line in facts.startup.lines:
        assert ORIGIN.search(line.origin) and line.example, (engine, line.format)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_report_format_reads_its_own_example(engine):
    facts = contract(engine)
    reports = [*facts.memory.reports, *(facts.sleep.reports if facts.sleep is not None else ())]
    for report in reports:
        if report.example:
            assert report.pattern().search(report.example), (engine, report.format)


def test_the_contracts_differ_where_the_engines_do():
    # The facts this project acts on, as the releases have them (each with its origin in the fixture).
    vllm, sglang, llamacpp, tabby = (contract(name) for name in ("vllm", "sglang", "llamacpp", "tabby"))
    assert vllm.served_name.unknown_model is not None and vllm.served_name.unknown_model.status == 404
    assert sglang.served_name.any_name_accepted and llamacpp.served_name.any_name_accepted
    assert vllm.memory.utilization is not None and vllm.memory.utilization.default is None  # all the free memory
    assert vllm.sleep is not None and vllm.sleep.requires.env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert sglang.sleep is not None and sglang.sleep.requires.flags == ("--enable-memory-saver",)
    assert not sglang.serves("/tokenizer_info") and vllm.serves("/tokenizer_info")
    assert not tabby.serves("/v1/messages") and not tabby.serves("/v1/responses")
    assert "/tokenizer_info" in sglang.absent and "/v1/messages" in tabby.absent
    ping = llamacpp.stream.ping  # llama.cpp's ":" into a silent stream; the others send nothing before a token
    assert ping is not None and ping.flags == ("--sse-ping-interval",) and ping.default_seconds == 30
    assert ORIGIN.search(ping.origin) and vllm.stream.ping is None and sglang.stream.ping is None


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as client:
        yield client


async def status_body(session, method: str, url: str, **kwargs) -> tuple[int, object]:
    async with session.request(method, url, **kwargs) as response:
        text = await response.text()
        try:
            return response.status, await response.json(content_type=None)
        except ValueError:
            return response.status, text


def body_for(path: str) -> dict | None:
    return {
        "/v1/chat/completions": {**CHAT}, "/v1/completions": {"prompt": "hi", "max_tokens": 1},
        "/v1/messages": {**CHAT, "model": "sim-model"}, "/v1/messages/count_tokens": {**CHAT, "model": "sim-model"},
        "/tokenize": {"content": "hi"}, "/detokenize": {"tokens": [104]}, "/v1/embeddings": {"input": "hi"},
    }.get(path)


@pytest.mark.parametrize("engine", SIM_ENGINES)
async def test_the_sim_serves_the_routes_its_engine_serves_and_no_other(start_sim, session, engine):
    facts = contract(engine)
    sim = start_sim("--engine", engine, *(["--disable-auth", "true"] if engine == "tabby" else []))
    for method, path in SIM_ROUTES:
        status, _ = await status_body(session, method, sim.url + path, json=body_for(path))
        route = facts.route(method, path)
        required = route.requires.flags if route is not None and route.requires is not None else ()
        gated = [flag for flag in required if flag.startswith("--enable")]
        if path in facts.absent or gated:
            assert status == 404, (engine, path, "the contract says it is not there")
        else:
            assert status != 404, (engine, path, "the contract says it is there")


@pytest.mark.parametrize("engine", SIM_ENGINES)
async def test_before_its_first_token_a_stream_gets_the_engines_pings_and_nothing_else(start_sim, session, engine):
    ping = contract(engine).stream.ping
    flags = ["--ttft-ms", "300", *(["--disable-auth", "true"] if engine == "tabby" else [])]
    sim = start_sim("--engine", engine, *flags, *([ping.flags[0], "0.05"] if ping is not None else []))
    async with session.post(sim.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.status == 200
        before = (await response.read()).partition(b"data:")[0]
    if ping is None:
        assert before == b"", engine
    else:  # pings every 0.05 s of a 0.3 s wait: some, and only pings
        assert before and not before.replace(ping.event.encode(), b""), before


async def test_a_route_behind_a_flag_appears_with_it(start_sim, session):
    # vLLM's /tokenizer_info only with --enable-tokenizer-info-endpoint (vllm/entrypoints/serve/tokenize/api_router.py:87).
    route = contract("vllm").route("GET", "/tokenizer_info")
    assert route is not None and route.requires is not None
    sim = start_sim("--engine", "vllm", *route.requires.flags)
    assert (await status_body(session, "GET", sim.url + "/tokenizer_info"))[0] == 200


@pytest.mark.parametrize("engine", SIM_ENGINES)
async def test_another_model_name_gets_what_the_engine_answers(start_sim, session, engine):
    facts = contract(engine)
    sim = start_sim("--engine", engine, *(["--disable-auth", "true"] if engine == "tabby" else []), model="served")
    status, body = await status_body(session, "POST", sim.url + "/v1/chat/completions", json={**CHAT, "model": "other"})
    refused = facts.served_name.unknown_model
    if facts.served_name.any_name_accepted or refused is None:
        assert status == 200, (engine, body)
        return
    expected = str(refused.body).replace("{model}", "other").replace("{served_names}", "served")
    assert (status, str(body)) == (refused.status, expected)
    assert (await status_body(session, "POST", sim.url + "/v1/chat/completions", json={**CHAT, "model": "served"}))[0] == 200


@pytest.mark.parametrize("engine", ("vllm", "sglang", "llamacpp"))
async def test_a_key_guards_what_the_engine_guards(start_sim, session, engine):
    facts = contract(engine)
    assert "--api-key" in facts.auth.flags
    sim = start_sim("--engine", engine, "--api-key", "secret-key-1")
    refused = facts.auth.refused
    assert refused is not None
    assert await status_body(session, "POST", sim.url + "/v1/chat/completions", json=CHAT) == (refused.status, refused.body)
    headers = facts.auth.headers("secret-key-1")
    assert (await status_body(session, "POST", sim.url + "/v1/chat/completions", json=CHAT, headers=headers))[0] == 200
    wrong = facts.auth.headers("not-the-key")
    assert (await status_body(session, "POST", sim.url + "/v1/chat/completions", json=CHAT, headers=wrong))[0] == refused.status
    for path in facts.auth.unprotected:
        if ("GET", path) in SIM_ROUTES:
            assert (await status_body(session, "GET", sim.url + path))[0] != refused.status, (engine, path)


async def test_tabby_keys_come_from_its_tokens_file_and_its_admin_routes_want_the_admin_key(start_sim, session):
    import yaml

    facts = contract("tabby")
    sim = start_sim("--engine", "tabby", model="served")
    tokens = yaml.safe_load((sim.folder / "api_tokens.yml").read_text())
    assert facts.auth.refused is not None and facts.auth.admin is not None and facts.auth.admin.refused is not None
    assert await status_body(session, "POST", sim.url + "/v1/chat/completions", json=CHAT) == (
        facts.auth.refused.status, facts.auth.refused.body)
    for header in ("x-api-key", "Authorization"):
        value = tokens["api_key"] if header == "x-api-key" else f"Bearer {tokens['api_key']}"
        answer = await status_body(session, "POST", sim.url + "/v1/chat/completions", json=CHAT, headers={header: value})
        assert answer[0] == 200, header
    api = {"x-api-key": tokens["api_key"]}
    assert await status_body(session, "POST", sim.url + "/v1/model/unload", headers=api) == (
        facts.auth.admin.refused.status, facts.auth.admin.refused.body)
    admin = facts.auth.headers(tokens["admin_key"])
    assert (await status_body(session, "POST", sim.url + "/v1/model/unload", headers=admin))[0] == 200


async def test_sglang_admin_routes_take_only_the_admin_key_once_there_is_one(start_sim, session):
    facts = contract("sglang")
    assert facts.auth.admin is not None and "/release_memory_occupation" in facts.auth.admin.routes
    sim = start_sim("--engine", "sglang", "--api-key", "user-1", "--admin-api-key", "admin-2", "--enable-memory-saver")
    release = sim.url + "/release_memory_occupation"
    assert (await status_body(session, "POST", release, json={}, headers=facts.auth.headers("user-1")))[0] == 401
    assert (await status_body(session, "POST", release, json={}, headers=facts.auth.headers("admin-2")))[0] == 200
    # Normal routes take only the API key (sglang/srt/utils/auth.py:145-150).
    assert (await status_body(session, "POST", sim.url + "/v1/chat/completions", json=CHAT,
                              headers=facts.auth.headers("admin-2")))[0] == 401


@pytest.mark.parametrize("engine", ("vllm", "sglang", "tabby"))
async def test_the_sleep_calls_are_the_contracts(start_sim, session, engine):
    facts = contract(engine)
    assert facts.sleep is not None
    flags = [*facts.sleep.requires.flags, *(facts.sleep.weights_back_requires.flags
                                            if facts.sleep.weights_back_requires is not None else ())]
    extra = ["--disable-auth", "true"] if engine == "tabby" else []
    sim = start_sim("--engine", engine, *flags, *extra, env=facts.sleep.requires.env, model="served")
    sleep, wake = facts.sleep.calls["sleep"], facts.sleep.calls["wake"]
    body = {"model_name": "served"} if engine == "tabby" else {}
    assert (await status_body(session, sleep.method, sim.url + sleep.path, json={}))[0] == 200, engine
    assert (await status_body(session, wake.method, sim.url + wake.path, json=body))[0] == 200, engine
    # What the engine prints about it is its release's own line.
    printed = sim.output()
    for report in facts.sleep.reports:
        if "freed" in report.format or "flushed" in report.format or "unloaded" in report.format:
            assert report.pattern().search(printed), (engine, report.format)
            break


async def test_vllm_sleep_calls_need_its_dev_mode(start_sim, session):
    facts = contract("vllm")
    assert facts.sleep is not None
    sim = start_sim("--engine", "vllm", *facts.sleep.requires.flags)  # no VLLM_SERVER_DEV_MODE
    for call in facts.sleep.calls.values():
        assert (await status_body(session, call.method, sim.url + call.path))[0] == 404, call.path
