"""The built-in default as agent clients meet it, on the real llama.cpp servers (xllamacpp).

Claude Code's first request is 3,035 tokens and Codex's 4,559: a slot of SmolLM2 holds 8,192
(its trained context), so a 5,000-token prompt reaches the model. A longer one is refused by
llama.cpp with its own 400, to which the router adds the entry and the flag to change. The
embedding entry answers `/v1/embeddings` and Ollama's `/api/embed` beside the chat model,
which stays loaded.
"""

from __future__ import annotations

import math

import aiohttp
import ollama
import pytest

from procs import Router
from routerclient import running

pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")

pytestmark = pytest.mark.llamacpp

# SmolLM2's tokenizer reads each "hello world" as two tokens (checked with llama.cpp's own /tokenize below).
PAIR = "hello world "


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    from swaplab.builtin.models import SMOLLM2, model_path

    if not model_path(SMOLLM2).is_file():
        pytest.skip(f"{model_path(SMOLLM2)} is absent: `make models` fetches it")
    started = Router(None, tmp_path_factory.mktemp("builtin-agents"))
    yield started
    started.close()


async def tokens(session: aiohttp.ClientSession, url: str, text: str) -> int:
    async with session.post(f"{url}/upstream/smollm2/tokenize", json={"content": text}) as response:
        assert response.status == 200, await response.text()
        return len((await response.json())["tokens"])


async def test_a_5000_token_prompt_reaches_smollm2(router):
    prompt = (PAIR * 2500).strip()
    body = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        assert await tokens(session, router.url, prompt) == 5000
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            reply = await response.json()
    assert reply["usage"]["prompt_tokens"] > 5000  # the prompt and the chat template around it
    assert reply["usage"]["completion_tokens"] == 1


def llama_cpps_words(message: str) -> bool:
    return message.startswith("request (") and "exceeds the available context size (8192 tokens)" in message


def names_the_entry_and_the_flag(message: str) -> bool:
    return (
        "Model smollm2 in the built-in default gives each request 8,192 tokens (--ctx-size 16384 / --parallel 2)"
        in message and "raise --ctx-size in models.smollm2.cmd" in message and "swaplab config init FILE" in message
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_longer_than_a_slot_is_refused_with_the_entry_and_the_flag_to_change(router, stream):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": PAIR * 4500}], "max_tokens": 1,
            "stream": stream}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            # llama.cpp answers this 400 as plain JSON, a streamed request too (its contract's errors.exceed_context).
            assert response.status == 400 and response.content_type == "application/json"
            document = await response.json()
    error = document["error"]
    # llama.cpp's own shape and fields, its own words first; only the message grew.
    assert (error["type"], error["code"], error["n_ctx"]) == ("exceed_context_size_error", 400, 8192)
    assert error["n_prompt_tokens"] > 9000 and set(error) == {"code", "message", "type", "n_prompt_tokens", "n_ctx"}
    assert llama_cpps_words(error["message"]), error["message"]
    assert names_the_entry_and_the_flag(error["message"]), error["message"]
    assert f"above {2 * error['n_prompt_tokens']:,} ({error['n_prompt_tokens']:,} tokens x 2 slots)" in error["message"]


async def test_ollamas_chat_too_long_for_the_slot_says_what_to_change_too(router):
    with pytest.raises(ollama.ResponseError) as refused:
        await ollama.AsyncClient(host=router.url).chat(
            "smollm2", messages=[{"role": "user", "content": PAIR * 4500}], options={"num_predict": 1},
        )
    assert refused.value.status_code == 400
    assert llama_cpps_words(refused.value.error) and names_the_entry_and_the_flag(refused.value.error), refused.value.error


def cosine(first: list[float], second: list[float]) -> float:
    dot = sum(a * b for a, b in zip(first, second))
    return dot / (math.sqrt(sum(a * a for a in first)) * math.sqrt(sum(b * b for b in second)))


async def test_embeddings_answer_beside_the_chat_model_which_stays_loaded(router):
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json={
            "model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        }) as response:
            assert response.status == 200, await response.text()
        texts = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Quarterly revenue rose by four percent."]
        async with session.post(f"{router.url}/v1/embeddings", json={"model": "smollm2-embed", "input": texts}) as response:
            assert response.status == 200, await response.text()
            answer = await response.json()
        vectors = [row["embedding"] for row in answer["data"]]
        assert [row["index"] for row in answer["data"]] == [0, 1, 2]
        assert all(len(vector) == 576 for vector in vectors)  # SmolLM2's hidden size
        # Mean-pooled hidden states of a chat model, yet the paraphrase is nearer than the stranger.
        assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
        state = {model: entry["state"] for model, entry in (await running(session, router.url)).items()}
        assert state == {"smollm2": "ready", "smollm2-embed": "ready"}

        # Ollama's embed rides the same path, to the same server, with the same vectors.
        embedded = await ollama.AsyncClient(host=router.url).embed("smollm2-embed", input=texts[0])
        assert list(embedded.embeddings[0]) == pytest.approx(vectors[0], abs=1e-6)

        # A swap between the chat models leaves the embedding server running (its group is persistent).
        async with session.post(f"{router.url}/v1/completions", json={
            "model": "gemma3-270m", "prompt": "The capital of France is", "max_tokens": 2,
        }) as response:
            assert response.status == 200, await response.text()
        state = {model: entry["state"] for model, entry in (await running(session, router.url)).items()}
        assert state == {"gemma3-270m": "ready", "smollm2-embed": "ready"}


async def test_the_listings_say_what_each_entry_serves(router):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/v1/models") as response:
            records = {record["id"]: record for record in (await response.json())["data"]}
    assert records["smollm2"]["context_length"] == records["gemma3-270m"]["context_length"] == 8192
    # Text in and no text out: the page's playground never opens its Chat on the embedding entry.
    assert records["smollm2-embed"]["architecture"] == {"input_modalities": ["text"]}
    shown = ollama.AsyncClient(host=router.url)
    assert (await shown.show("smollm2-embed")).capabilities == ["embedding"]
    parameters = dict(line.split(None, 1) for line in (await shown.show("smollm2")).parameters.splitlines())
    assert parameters["num_ctx"].strip() == "8192"  # per slot: --ctx-size 16384 over --parallel 2
    assert records["smollm2-embed"]["context_length"] == 2048
