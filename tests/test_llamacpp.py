"""The built-in default end to end: real llama.cpp servers (xllamacpp) with real GGUF models."""

from __future__ import annotations

import json

import aiohttp
import pytest

from procs import Router
from swaplab.builtin.llamacpp import build_parser, server_params

pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")


@pytest.fixture(scope="module")
def default_router(tmp_path_factory):
    router = Router(None, tmp_path_factory.mktemp("default"))
    yield router
    router.close()


@pytest.mark.parametrize(
    ("flags", "slot_save_path"),
    [
        (["--slot-save-path", "/saves"], "/saves/"),  # xllamacpp joins it to the file name as it is
        (["--slot-save-path=/saves/"], "/saves/"),
        ([], ""),  # none: llama.cpp's slot save and restore stay off
    ],
)
def test_the_wrapper_passes_slot_save_path_to_xllamacpp_with_a_trailing_slash(flags, slot_save_path):
    params = server_params(build_parser().parse_args(["-m", "a.gguf", "-c", "2048", "-np", "2", *flags]))
    assert params.slot_save_path == slot_save_path
    assert (params.model.path, params.n_ctx, params.n_parallel) == ("a.gguf", 2048, 2)


async def test_smollm2_answers_chat(default_router):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{default_router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
            reply = await response.json()
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["message"]["content"].strip()
    assert 0 < reply["usage"]["completion_tokens"] <= 12


async def test_smollm2_streams_chat_through_the_alias(default_router):
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{default_router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert response.headers["X-Accel-Buffering"] == "no"
            raw = (await response.read()).decode()
    events = [block.removeprefix("data: ") for block in raw.split("\n\n") if block.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip()
    assert chunks[-1]["usage"]["completion_tokens"] > 0


async def test_gemma3_answers_completions_after_a_swap(default_router):
    body = {"model": "gemma3-270m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{default_router.url}/v1/chat/completions", json={
            "model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        }) as response:
            assert response.status == 200
        async with session.post(f"{default_router.url}/v1/completions", json=body) as response:
            assert response.status == 200, await response.text()
            reply = await response.json()
        async with session.get(f"{default_router.url}/running") as response:
            running = {entry["model"]: entry["state"] for entry in (await response.json())["running"]}
    assert reply["choices"][0]["text"].strip()
    assert running == {"gemma3-270m": "ready"}  # one model at a time: smollm2 was swapped out
