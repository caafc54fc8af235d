"""Ollama's API over the fleet (issue 26), through the real `ollama` Python client against sims.

The client parses every answer into its pydantic models, so a shape it cannot read fails
here. The llama.cpp side is tests/test_ollama_llamacpp.py; the pairs from Ollama's own
docs are tests/test_ollama_docs.py.
"""

from __future__ import annotations


import base64
import json
import re

from datetime import datetime, timezone
from importlib import metadata

import aiohttp
import ollama
import pytest

from procs import SIM, Sim, eventually
from routerclient import running

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a given city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# aiohttp labels a bytes body application/octet-stream, which Ollama's routes (as the OpenAI ones) refuse.
JSON = {"Content-Type": "application/json"}
SCRIPT = {
    "rules": [
        {"match": "weather", "replies": [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]}],
         "then": {"content": "It is 11 degrees in Tokyo."}},
        {"match": "think", "replies": [{"reasoning": "Let me think it over.", "content": "Forty-two."}]},
    ],
    "default": {"content": "Hello from the sim."},
}


def config(script_path, extra: str = "") -> str:
    return f"""
heartbeatInterval: 0.2
models:
  sim:
    cmd: {SIM} --port ${{PORT}} --model sim --script {script_path} --timings
    aliases: [sim-alias]
  "org/tagged:q4":
    cmd: {SIM} --port ${{PORT}} --model tagged
    ttl: 300
{extra}"""


@pytest.fixture
def router(router_factory, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return router_factory(config(script))


def client(router) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=router.url)


async def test_list_shows_every_model_with_its_tag_and_ollamas_fields(router):
    listed = await client(router).list()
    names = sorted(model.model for model in listed.models)
    assert names == ["org/tagged:q4", "sim:latest"]  # a name without a tag gets Ollama's `:latest`
    for model in listed.models:
        assert len(model.digest) == 64 and int(model.digest, 16) >= 0  # Ollama's CLI prints digest[:12]
        assert model.modified_at is not None and model.details is not None


async def test_chat_plain_answers_in_ollamas_shape_with_counts_and_durations(router):
    answer = await client(router).chat("sim:latest", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert answer.message.role == "assistant"
    assert answer.message.content == "Hello from the sim."
    assert answer.done is True and answer.done_reason == "stop"
    assert answer.model == "sim:latest"  # the name as asked, as Ollama echoes it
    assert answer.prompt_eval_count and answer.eval_count == 4
    assert answer.total_duration >= answer.load_duration >= 0
    assert answer.eval_duration is not None and answer.eval_duration > 0  # measured: the sim gives no timings in ms
    created = datetime.fromisoformat(answer.created_at)
    assert abs((datetime.now(timezone.utc) - created).total_seconds()) < 600


async def test_chat_streams_one_line_per_token_then_a_done_line(router):
    parts = [part async for part in await client(router).chat(
        "sim", messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert all(not part.done for part in parts[:-1]) and parts[-1].done
    assert "".join(part.message.content for part in parts) == "Hello from the sim."
    assert len([part for part in parts if part.message.content]) == 4  # a line per streamed token
    final = parts[-1]
    assert final.done_reason == "stop" and final.eval_count == 4 and final.prompt_eval_count


async def test_chat_with_tools_returns_the_call_with_object_arguments_and_takes_its_result_back(router):
    messages = [{"role": "user", "content": "what is the weather in tokyo?"}]
    answer = await client(router).chat("sim", messages=messages, tools=[WEATHER_TOOL], stream=False)
    (call,) = answer.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Tokyo"}
    parts = [part async for part in await client(router).chat("sim", messages=messages, tools=[WEATHER_TOOL],
                                                                      stream=True)]
    streamed = [call for part in parts for call in part.message.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [("get_weather", {"city": "Tokyo"})]
    # The tool's result goes back as Ollama sends it (role tool, tool_name): the sim sees OpenAI's turn.
    messages += [answer.message, {"role": "tool", "content": "11 degrees celsius", "tool_name": "get_weather"}]
    final = await client(router).chat("sim", messages=messages, tools=[WEATHER_TOOL], stream=False)
    assert final.message.content == "It is 11 degrees in Tokyo."
    sent = await last_request(router, "sim")
    assistant, tool = sent["body"]["messages"][1:]
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Tokyo"}'}
    assert tool["role"] == "tool" and tool["tool_call_id"] == assistant["tool_calls"][0]["id"]


async def test_thinking_comes_back_as_ollamas_thinking_field(router):
    answer = await client(router).chat("sim", messages=[{"role": "user", "content": "think"}], think=True, stream=False)
    assert answer.message.thinking == "Let me think it over." and answer.message.content == "Forty-two."
    sent = await last_request(router, "sim")
    assert sent["body"]["chat_template_kwargs"] == {"enable_thinking": True}


async def test_generate_is_a_chat_turn_and_raw_generate_a_completion(router):
    answer = await client(router).generate("sim", "Why is the sky blue?", system="Be brief.", stream=False)
    assert answer.response == "Hello from the sim." and answer.done
    sent = await last_request(router, "sim")
    assert sent["path"] == "/v1/chat/completions"
    assert [m["role"] for m in sent["body"]["messages"]] == ["system", "user"]
    parts = [part async for part in await client(router).generate("sim", "[INST] hi [/INST]", raw=True,
                                                                          stream=True)]
    assert parts[-1].done and "".join(part.response for part in parts)
    sent = await last_request(router, "sim")
    assert sent["path"] == "/v1/completions" and sent["body"]["prompt"] == "[INST] hi [/INST]"


async def test_generate_to_a_model_whose_capabilities_say_it_does_not_chat_is_a_completion(router_factory, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    router = router_factory(config(script, f"""
  base:
    cmd: {SIM} --port ${{PORT}} --model base
    capabilities: {{context: 4096}}
"""))
    answer = await client(router).generate("base", "Once upon a time", system="Be brief.", stream=False)
    assert answer.response and answer.done
    sent = await last_request(router, "base")
    # The prompt as it is: no chat turn, and no system (Ollama's default template, `{{ .Prompt }}`, drops it).
    assert sent["path"] == "/v1/completions" and sent["body"]["prompt"] == "Once upon a time"
    with pytest.raises(ollama.ResponseError) as refused:
        await client(router).generate("base", "Look", images=[base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(32))])
    assert refused.value.status_code == 400 and "chat template" in refused.value.error
    await client(router).generate("sim", "hi", stream=False)  # no capabilities written: says nothing, so a chat
    assert (await last_request(router, "sim"))["path"] == "/v1/chat/completions"


async def test_raw_generate_refuses_a_system_or_template_as_ollama_does(router):
    for extra in ({"system": "Be brief."}, {"template": "{{ .Prompt }}"}):
        with pytest.raises(ollama.ResponseError) as refused:
            await client(router).generate("sim", "[INST] hi [/INST]", raw=True, stream=False, **extra)
        assert refused.value.status_code == 400 and "raw mode does not support template or system" in refused.value.error


@pytest.mark.parametrize(("written", "chat"), [
    ({}, None),  # nothing written says nothing
    ({"context": 4096}, False),  # the built-in Gemma-3-270M: a base model
    ({"input": ("text",), "output": ("text",)}, True),
    ({"input": ("text", "image"), "output": ("text",), "tools": True}, True),
    ({"input": ("audio",), "output": ("text",)}, False),
    ({"input": ("text",), "output": ("image",)}, False),
])
def test_a_model_chats_when_its_capabilities_say_text_in_and_text_out(written, chat):
    from swaplab.config.model import Capabilities

    assert Capabilities(**written).chat is chat


async def test_options_and_format_map_to_the_openai_parameters_they_mean(router):
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    await client(router).chat("sim", messages=[{"role": "user", "content": "hi"}], stream=False, format=schema, options={
        "temperature": 0.2, "top_k": 20, "num_predict": 7, "stop": ["\n"], "repeat_penalty": 1.1, "seed": 3,
        "num_ctx": 8192,  # a load-time option: the config's command sets it, so it is not sent
    })
    body = (await last_request(router, "sim"))["body"]
    assert body["temperature"] == 0.2 and body["top_k"] == 20 and body["max_tokens"] == 7 and body["seed"] == 3
    assert body["stop"] == ["\n"] and body["repeat_penalty"] == 1.1 == body["repetition_penalty"]
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "response", "schema": schema, "strict": True}}
    assert "num_ctx" not in body
    assert body["stream"] is True  # always streamed from the backend: its first token splits the durations
    await client(router).generate("sim", "hi", format="json", stream=False)
    assert (await last_request(router, "sim"))["body"]["response_format"] == {"type": "json_object"}


async def test_images_go_to_the_backend_as_data_urls_of_their_type(router, tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
    path = tmp_path / "pixel.png"
    path.write_bytes(png)
    await client(router).chat("sim", messages=[{"role": "user", "content": "what is this?", "images": [path]}],
                              stream=False)
    content = (await last_request(router, "sim"))["body"]["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "what is this?"}
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")


async def test_embed_and_the_older_embeddings_route(router):
    embedded = await client(router).embed("sim", input=["Why is the sky blue?", "Why is the grass green?"])
    assert len(embedded.embeddings) == 2 and all(len(vector) == 8 for vector in embedded.embeddings)
    assert embedded.embeddings[0] != embedded.embeddings[1] and embedded.prompt_eval_count == 10
    single = await client(router).embeddings("sim", prompt="Why is the sky blue?")
    assert list(single.embedding) == list(embedded.embeddings[0])
    assert list((await client(router).embeddings("sim", prompt="")).embedding) == []


async def test_ps_shows_loaded_models_with_their_expiry_and_keep_alive_sets_it(router):
    ollama_client = client(router)
    assert (await ollama_client.ps()).models == []
    await ollama_client.chat("org/tagged:q4", messages=[{"role": "user", "content": "hi"}], stream=False)
    (loaded,) = (await ollama_client.ps()).models
    assert loaded.model == "org/tagged:q4" and loaded.size > 0
    left = (loaded.expires_at - datetime.now(timezone.utc)).total_seconds()
    assert 200 < left <= 300  # its ttl of 300 s, counted from the request's end
    await ollama_client.chat("org/tagged:q4", messages=[{"role": "user", "content": "hi"}], stream=False,
                             keep_alive="2h")
    left = ((await ollama_client.ps()).models[0].expires_at - datetime.now(timezone.utc)).total_seconds()
    assert 7000 < left <= 7200
    await ollama_client.chat("org/tagged:q4", messages=[{"role": "user", "content": "hi"}], stream=False, keep_alive=-1)
    forever = (await ollama_client.ps()).models[0].expires_at
    assert forever.year > datetime.now().year + 20  # Ollama's CLI says "Forever"


async def test_keep_alive_zero_unloads_the_model_after_the_request(router):
    ollama_client = client(router)
    answer = await ollama_client.chat("sim", messages=[{"role": "user", "content": "hi"}], stream=False, keep_alive=0)
    assert answer.message.content == "Hello from the sim."
    async with aiohttp.ClientSession() as session:
        await eventually(lambda: _stopped(session, router.url, "sim"), 10, "sim to stop after keep_alive 0")
    assert (await ollama_client.ps()).models == []


async def _stopped(session, url, model) -> bool:
    return model not in await running(session, url)


async def test_an_empty_request_loads_the_model_and_keep_alive_zero_unloads_it(router):
    ollama_client = client(router)
    loaded = await ollama_client.generate("sim")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert [model.model for model in (await ollama_client.ps()).models] == ["sim:latest"]
    unloaded = await ollama_client.chat("sim", messages=[], keep_alive=0)
    assert unloaded.done_reason == "unload" and unloaded.message.content == ""
    assert (await ollama_client.ps()).models == []


async def test_show_answers_what_the_config_knows_and_404s_an_unknown_model(router):
    shown = await client(router).show("sim")
    assert shown.capabilities == ["completion"] and shown.modelinfo == {}
    assert "entry 'sim'" in shown.modelfile
    with pytest.raises(ollama.ResponseError) as missing:
        await client(router).show("nope")
    assert missing.value.status_code == 404 and "model 'nope' not found" in missing.value.error
    with pytest.raises(ollama.ResponseError) as missing:
        await client(router).chat("nope:7b", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404 and "GET /api/tags" in missing.value.error


@pytest.mark.parametrize("call", ["pull", "push", "create", "copy", "delete"])
async def test_model_management_says_where_models_come_from(router, call):
    ollama_client = client(router)
    calls = {
        "pull": lambda: ollama_client.pull("llama3.2"),
        "push": lambda: ollama_client.push("me/llama3.2"),
        "create": lambda: ollama_client.create("mine", from_="sim"),
        "copy": lambda: ollama_client.copy("sim", "sim-backup"),
        "delete": lambda: ollama_client.delete("sim"),
    }
    with pytest.raises(ollama.ResponseError) as refused:
        await calls[call]()
    assert refused.value.status_code == 400
    assert "config.yaml" in refused.value.error and "edit that file" in refused.value.error


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "the body is not JSON"),
    (b"[1]", "must be a JSON object"),
    (b'{"messages": []}', "model is required"),
    (b'{"model": "sim", "messages": "hi"}', "messages must be a list"),
    (b'{"model": "sim", "messages": [{"role": "robot", "content": "x"}]}', "messages[0].role must be"),
    (b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "keep_alive": "soon"}', "keep_alive 'soon'"),
    (b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "options": {"temperature": "hot"}}',
     "options.temperature must be a number"),
    (b'{"model": "sim", "messages": [{"role": "user", "content": "x", "images": ["%%%"]}]}', "not valid base64"),
    (b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "format": 3}', "format must be"),
    (b'{"model": "sim", "messages": [{"role": "user", "content": "x"}], "think": "very"}', "think must be"),
])
async def test_bad_requests_get_a_400_in_ollamas_shape_saying_why(router, body, message):
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/api/chat", data=body, headers=JSON) as response:
            assert response.status == 400
            answer = await response.json()
    assert set(answer) == {"error"} and message in answer["error"]


@pytest.mark.parametrize(("path", "content_type", "message"), [
    ("/api/chat", "text/plain", "the body's Content-Type is text/plain, which this route does not read: "
     "send JSON as application/json"),
    ("/api/generate", "text/plain;charset=UTF-8", "the body's Content-Type is text/plain"),
    ("/api/embed", "application/octet-stream", "the body's Content-Type is application/octet-stream"),
    ("/api/show", "text/plain", "the body's Content-Type is text/plain"),
    ("/api/chat", "application/x-www-form-urlencoded", "curl -H 'Content-Type: application/json'"),
])
async def test_a_body_whose_content_type_is_not_json_is_refused_as_on_the_openai_routes(
    router, path, content_type, message,
):
    # What a page may send cross-site without a preflight is never read as JSON (docs/security.md);
    # Ollama's clients send application/json, and a script that sends no Content-Type is read.
    body = b'{"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": false}'
    async with aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as session:
        async with session.post(f"{router.url}{path}", data=body, headers={"Content-Type": content_type}) as response:
            assert response.status == 415
            answer = await response.json()
        async with session.post(f"{router.url}/v1/chat/completions", data=body,
                                headers={"Content-Type": content_type}) as response:
            openai = (await response.json())["error"]["message"]
        async with session.post(f"{router.url}/api/chat", data=body) as response:
            assert response.status == 200
            assert (await response.json())["message"]["content"] == "Hello from the sim."
    assert set(answer) == {"error"} and message in answer["error"]
    assert openai.startswith(answer["error"])  # the OpenAI routes' words, less the forms they also read
    assert ollama.AsyncClient(host=router.url)._client.headers["Content-Type"] == "application/json"


async def test_a_chat_is_an_activity_row_under_its_ollama_path_with_the_backends_counts(router):
    await client(router).chat("sim", messages=[{"role": "user", "content": "hi"}], stream=False)
    async with aiohttp.ClientSession() as session:
        async def row():
            async with session.get(f"{router.url}/api/activity") as response:
                rows = (await response.json())["activity"]
            return rows[0] if rows else None
        found = await eventually(row, 10, "the chat's activity row")
        async with session.get(f"{router.url}/metrics") as response:
            metrics = await response.text()
    assert found["path"] == "/api/chat" and found["model"] == "sim" and found["status"] == 200
    assert found["completion_tokens"] == 4
    assert 'swaplab:requests_total{model="sim",status="200"} 1.0' in metrics


async def test_version_is_an_ollama_release_version_gated_clients_accept_beside_llama_swaps_fields(router):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/api/version") as response:
            answer = await response.json()
    # Codex parses `version` as semver (a leading "v" allowed) and refuses an Ollama below 0.13.4.
    assert re.fullmatch(r"\d+\.\d+\.\d+", answer["version"])
    assert tuple(int(part) for part in answer["version"].split(".")) >= (0, 13, 4)
    for field in ("version", "commit", "build_date"):  # llama-swap's page shows these (Settings.svelte)
        assert isinstance(answer[field], str) and answer[field]
    assert answer["swaplab_version"] == metadata.version("swaplab")  # swaplab's page header
    assert answer["server"] == "swaplab" and "ollama" in answer["apis"].split()


async def test_a_slow_first_token_gets_ollama_heartbeats_the_client_reads_as_empty_chunks(router_factory):
    router = router_factory(f"""
heartbeatInterval: 0.05
models:
  slow:
    cmd: {SIM} --port ${{PORT}} --model slow --ttft-ms 600
""")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/api/chat", json={
            "model": "slow", "messages": [{"role": "user", "content": "hi"}]}) as response:
            assert response.headers["Content-Type"].startswith("application/x-ndjson")
            lines = [json.loads(line) async for line in response.content if line.strip()]
    beats = [line for line in lines if not line["done"] and not line["message"]["content"]]
    assert beats and lines.index(beats[0]) == 0  # heartbeats came first, while the sim prefilled
    parts = [part async for part in await client(router).chat("slow", messages=[{"role": "user", "content": "hi"}],
                                                                       stream=True)]
    assert parts[-1].done and "".join(part.message.content for part in parts)


async def test_loading_state_streams_as_thinking_while_the_model_starts(router_factory):
    router = router_factory(f"""
sendLoadingState: true
models:
  late:
    cmd: {SIM} --port ${{PORT}} --model late --startup-seconds 2
""")
    parts = [part async for part in await client(router).chat("late", messages=[{"role": "user", "content": "hi"}],
                                                                       stream=True)]
    thoughts = [part.message.thinking for part in parts if part.message.thinking]
    assert thoughts and "[swaplab] loading late" in thoughts[0]
    assert parts[-1].done and parts[-1].load_duration > 0


async def test_a_client_that_leaves_mid_stream_cancels_the_backends_generation(router_factory, tmp_path):
    router = router_factory(f"""
models:
  long:
    cmd: {SIM} --port ${{PORT}} --model long --tokens-per-second 20 --default-max-tokens 400
""")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/api/generate", json={"model": "long", "prompt": "go"}) as response:
            first = json.loads(await response.content.readline())
            assert first["response"]
        # the client is gone: the router closes the backend's stream, the sim counts a cancel
        status = (await running(session, router.url))["long"]
        async with aiohttp.ClientSession() as probe:
            async def cancelled():
                async with probe.get(f"{status['proxy']}/sim/stats") as reply:
                    stats = await reply.json()
                return stats["cancelled"] >= 1 and stats["active"] == 0
            await eventually(cancelled, 10, "the sim to see its stream cancelled")


async def test_peers_models_are_listed_and_chatted_with_through_their_openai_routes(router_factory, tmp_path):
    peer = Sim(tmp_path, model="remote-model")
    try:
        router = router_factory(f"""
models:
  local:
    cmd: {SIM} --port ${{PORT}} --model local
peers:
  far:
    proxy: {peer.url}
    models: [remote-model]
""")
        listed = {model.model: model for model in (await client(router).list()).models}
        assert set(listed) == {"local:latest", "far/remote-model:latest"}
        answer = await client(router).chat("far/remote-model", messages=[{"role": "user", "content": "hi"}],
                                           stream=False)
        assert answer.message.content and answer.done
        assert (await client(router).show("far/remote-model")).modelfile.startswith("# far/remote-model")
    finally:
        peer.close()


async def test_the_origin_policy_and_the_api_keys_apply_to_ollamas_routes(router_factory):
    router = router_factory(f"""
apiKeys: [sekrit-key-1234]
models:
  sim:
    cmd: {SIM} --port ${{PORT}} --model sim
""")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/api/tags") as response:
            assert response.status == 401
        headers = {"Authorization": "Bearer sekrit-key-1234", "Origin": "http://evil.example"}
        async with session.post(f"{router.url}/api/chat", headers=headers, json={"model": "sim", "messages": []}) as r:
            assert r.status == 403
    keyed = ollama.AsyncClient(host=router.url, headers={"Authorization": "Bearer sekrit-key-1234"})
    assert [model.model for model in (await keyed.list()).models] == ["sim:latest"]


async def last_request(router, model: str) -> dict:
    async with aiohttp.ClientSession() as session:
        status = (await running(session, router.url))[model]
        async with session.get(f"{status['proxy']}/sim/last-request") as response:
            return await response.json()


def test_keep_alive_reads_as_ollama_reads_it():
    from swaplab.router.ollama.translate import BadRequest, keep_alive_seconds

    assert keep_alive_seconds("5m") == 300 and keep_alive_seconds("1h30m") == 5400
    assert keep_alive_seconds("500ms") == 0.5 and keep_alive_seconds(90) == 90 and keep_alive_seconds("3600") == 3600
    assert keep_alive_seconds(0) == 0 == keep_alive_seconds("0")
    assert keep_alive_seconds(-1) == -1 == keep_alive_seconds("-1m") == keep_alive_seconds("-1")
    assert keep_alive_seconds(None) is None
    for bad in ("soon", "5 minutes", "m", True, [1], {"s": 1}):
        with pytest.raises(BadRequest):
            keep_alive_seconds(bad)





async def test_a_chat_is_captured_with_the_request_and_reply_the_backend_saw(router_factory):
    router = router_factory(f"""
captureBuffer: 1
models:
  sim:
    cmd: {SIM} --port ${{PORT}} --model sim
""")
    await client(router).chat("sim", messages=[{"role": "user", "content": "hi there"}], stream=False)
    async with aiohttp.ClientSession() as session:
        async def row():
            async with session.get(f"{router.url}/api/activity") as response:
                rows = (await response.json())["activity"]
            return rows[0] if rows and rows[0]["has_capture"] else None
        found = await eventually(row, 10, "the chat's captured activity row")
        async with session.get(f"{router.url}/api/captures/{found['id']}") as response:
            capture = await response.json()
    assert capture["req_path"] == "/api/chat" and capture["resp_status"] == 200
    sent = json.loads(base64.b64decode(capture["req_body"]))
    assert sent["messages"] == [{"role": "user", "content": "hi there"}] and sent["stream"] is True
    assert base64.b64decode(capture["resp_body"]).startswith(b"data: ")  # the backend's own stream


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show"])
async def test_a_bomb_of_brackets_is_never_a_500(router, path):
    """Found by tests/test_fuzz_http.py: Python's json recursed past its limit on nested lists (a 500)."""
    nested = b'{"model": "sim", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}{path}", data=nested, headers=JSON) as response:
            assert response.status < 500, await response.text()
            await response.json()  # an answer in Ollama's JSON, whichever it is (an unknown field is ignored)
        # nested where it must be sent on (a tool call's arguments): past what can be encoded, a 400
        deep = ('{"model": "sim", "messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": '
                '{"name": "f", "arguments": {"a": ' + "[" * 400 + "]" * 400 + '}}}]}]}').encode()
        async with session.post(f"{router.url}/api/chat", data=deep, headers=JSON) as response:
            assert response.status == 400 and "cannot be sent on" in (await response.json())["error"]
