"""Ollama's API on real llama.cpp servers (xllamacpp) and the built-in SmolLM2 GGUF, through the `ollama` client.

What the router says of the model file is checked against gguf's own reader of the same
file, and its embeddings against llama.cpp's own `/v1/embeddings` answer for the same text.
"""

from __future__ import annotations

import base64
import json
import math

import aiohttp
import ollama
import pytest

from conftest import write_config
from procs import PYTHON, Router, eventually
from routerclient import running

pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")
gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.llamacpp

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def smollm2_path() -> str:
    from swaplab.builtin.models import SMOLLM2, model_path

    path = model_path(SMOLLM2)
    if not path.is_file():
        pytest.skip(f"{path} is absent: `make models` fetches it")
    return str(path)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ollama-llamacpp")
    model = smollm2_path()
    wrapper = f"{PYTHON} -m swaplab.builtin.llamacpp --model {model} --host 127.0.0.1 --port ${{PORT}} --threads 2"
    config = write_config(folder, f"""
healthCheckTimeout: 120
models:
  smollm2:
    cmd: {wrapper} --ctx-size 2048 --parallel 1 --alias smollm2
    checkEndpoint: /health
    timeouts: {{idleConn: 4}}
  smollm2-embed:
    cmd: {wrapper} --ctx-size 2048 --parallel 1 --embedding --pooling mean --alias smollm2-embed
    checkEndpoint: /health
    timeouts: {{idleConn: 4}}
""")
    started = Router(config, folder)
    yield started
    started.close()


def client(router) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=router.url)


def gguf_fields(path: str) -> dict:
    """What gguf's own reader says of the file: the values the router must agree with."""
    reader = gguf.GGUFReader(path)
    fields = {}
    for key in ("general.architecture", "general.file_type", "tokenizer.chat_template", "llama.context_length",
                "llama.embedding_length"):
        field = reader.fields[key]
        fields[key] = field.contents()
    return fields


async def test_list_and_show_describe_the_gguf_as_ggufs_own_reader_does(router):
    path = smollm2_path()
    fields = gguf_fields(path)
    listed = {model.model: model for model in (await client(router).list()).models}
    assert {"smollm2:latest", "smollm2-embed:latest"} <= set(listed)
    model = listed["smollm2:latest"]
    import os

    assert model.size == os.path.getsize(path)
    assert model.details.format == "gguf" and model.details.family == fields["general.architecture"] == "llama"
    file_type = gguf.LlamaFileType(fields["general.file_type"]).name.removeprefix("MOSTLY_")
    assert model.details.quantization_level == file_type
    assert model.details.parameter_size.endswith("M")  # 135M parameters
    shown = await client(router).show("smollm2")
    assert shown.template == fields["tokenizer.chat_template"]
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == fields["llama.context_length"]
    assert shown.capabilities[0] == "completion"
    assert "num_ctx" in shown.parameters and "2048" in shown.parameters
    assert (await client(router).show("smollm2-embed")).capabilities == ["embedding"]


async def test_chat_plain_and_streamed_with_llama_cpps_counts_and_timings(router):
    messages = [{"role": "user", "content": "Say hello."}]
    answer = await client(router).chat("smollm2", messages=messages, stream=False, options={"num_predict": 12})
    assert answer.message.content.strip() and answer.done and answer.done_reason in ("stop", "length")
    assert 0 < answer.eval_count <= 12 and answer.prompt_eval_count > 0
    assert answer.eval_duration > 0 and answer.prompt_eval_duration > 0 and answer.total_duration > answer.eval_duration
    parts = [part async for part in await client(router).chat(
        "smollm2", messages=messages, stream=True, options={"num_predict": 12, "temperature": 0})]
    final = parts[-1]
    assert final.done and not any(part.done for part in parts[:-1])
    text = "".join(part.message.content for part in parts)
    assert text.strip() and 0 < final.eval_count <= 12
    # llama.cpp streams a token per chunk: Ollama's line per chunk carries as many
    assert abs(len([part for part in parts if part.message.content]) - final.eval_count) <= 1


async def test_a_tools_request_gets_what_llama_cpps_own_openai_route_answers_it(router):
    """The same tools request through Ollama's route and straight to llama.cpp's /v1/chat/completions: the
    same reply. (SmolLM2-135M's template has no tool calling, and this llama.cpp answers it in text, not a
    call, even with tool_choice required: the translation of calls is shown on the sim's scripted ones.)"""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    options = {"temperature": 0, "seed": 7, "num_predict": 24}
    answer = await client(router).chat("smollm2", messages=messages, tools=[WEATHER_TOOL], stream=False,
                                       options=options)
    body = {"model": "smollm2", "messages": messages, "tools": [WEATHER_TOOL], "temperature": 0, "seed": 7,
            "max_tokens": 24}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/upstream/smollm2/v1/chat/completions", json=body) as response:
            direct = (await response.json())["choices"][0]
    assert answer.message.content == (direct["message"].get("content") or "")
    direct_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in direct["message"].get("tool_calls") or ()]
    assert [(c.function.name, json.dumps(c.function.arguments)) for c in answer.message.tool_calls or ()] == [
        (name, json.dumps(json.loads(arguments))) for name, arguments in direct_calls]
    assert answer.done_reason == {"tool_calls": "stop"}.get(direct["finish_reason"], direct["finish_reason"])


async def test_generate_and_raw_generate(router):
    answer = await client(router).generate("smollm2", "Name a colour.", stream=False, options={"num_predict": 8})
    assert answer.response.strip() and 0 < answer.eval_count <= 8
    raw = await client(router).generate("smollm2", "The capital of France is", raw=True, stream=False,
                                        options={"num_predict": 4, "temperature": 0})
    assert raw.response.strip() and raw.eval_count <= 4


async def test_embed_answers_llama_cpps_own_vectors(router):
    text = "Why is the sky blue?"
    embedded = await client(router).embed("smollm2-embed", input=[text, "Why is the grass green?"])
    assert len(embedded.embeddings) == 2 and embedded.prompt_eval_count > 0
    vector = list(embedded.embeddings[0])
    assert len(vector) == gguf_fields(smollm2_path())["llama.embedding_length"]
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/upstream/smollm2-embed/v1/embeddings",
                                json={"model": "smollm2-embed", "input": text}) as response:
            direct = (await response.json())["data"][0]["embedding"]
    assert vector == pytest.approx(direct, abs=1e-6)
    assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-3)  # llama.cpp normalizes, as Ollama's does
    single = await client(router).embeddings("smollm2-embed", prompt=text)
    assert list(single.embedding) == pytest.approx(vector, abs=1e-6)


async def test_ps_lists_the_loaded_model_and_keep_alive_zero_unloads_it(router):
    await client(router).chat("smollm2", messages=[{"role": "user", "content": "Hi"}], stream=False,
                              options={"num_predict": 2})
    (loaded,) = [model for model in (await client(router).ps()).models if model.model == "smollm2:latest"]
    assert loaded.context_length == 2048 and loaded.size > 0 and loaded.details.family == "llama"
    await client(router).chat("smollm2", messages=[{"role": "user", "content": "Hi"}], stream=False,
                              options={"num_predict": 2}, keep_alive=0)
    async with aiohttp.ClientSession() as session:
        async def stopped():
            return "smollm2" not in await running(session, router.url)
        await eventually(stopped, 30, "smollm2 to stop after keep_alive 0")
    assert "smollm2:latest" not in [model.model for model in (await client(router).ps()).models]


# What a chat template leaves in a base model's answer when a prompt is sent as a chat turn
# (llama.cpp falls back to ChatML for a GGUF without a template; Gemma's own turn markers too).
TEMPLATE_TOKENS = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>")


async def test_generate_on_the_built_in_base_model_is_a_completion_of_the_prompt(router_factory):
    from swaplab.builtin.models import GEMMA3, model_path

    if not model_path(GEMMA3).is_file():
        pytest.skip(f"{model_path(GEMMA3)} is absent: `make models` fetches it")
    # The built-in Gemma-3-270M is a base model: its GGUF has no chat template, its config entry's
    # capabilities say no text in and text out.
    assert "tokenizer.chat_template" not in gguf.GGUFReader(str(model_path(GEMMA3))).fields
    router = router_factory(None)
    answer = await client(router).generate("gemma3-270m", "The capital of France is", system="Be brief.",
                                           stream=False, options={"num_predict": 12, "temperature": 0})
    assert answer.response.strip() and answer.done and 0 < answer.eval_count <= 12
    assert not any(token in answer.response for token in TEMPLATE_TOKENS), answer.response
    assert answer.prompt_eval_count <= 8  # the prompt alone (and BOS): no system turn, no template around it
    async with aiohttp.ClientSession() as session:
        async def generated():
            async with session.get(f"{router.url}/api/activity") as response:
                return [row for row in (await response.json())["activity"] if row["path"] == "/api/generate"]
        (row,) = await eventually(generated, 10, "the generate's activity row")
        async with session.get(f"{router.url}/api/captures/{row['capture_id']}") as response:
            capture = await response.json()
    sent = json.loads(base64.b64decode(capture["req_body"]))
    assert sent["prompt"] == "The capital of France is" and "messages" not in sent
    # llama.cpp names what it served: a completion, not a chat.completion.chunk.
    assert b'"object":"text_completion"' in base64.b64decode(capture["resp_body"])
