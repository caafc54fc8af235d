"""Every request of Ollama's own API docs, sent as written, answered in the shape the docs show (issue 26).

The pairs are tests/fixtures/ollama-api/pairs.json: the request bodies and example responses
of Ollama's docs/api.md (its origin is noted there). The docs' model names are the config's
sims, so each request goes unchanged. Each answer must carry every field the docs' example
shows, with the same JSON type, and parse as the `ollama` client's own response model.
What swaplab answers differently, and why, is listed in `DIFFERENT` (docs/api.md says so too).
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import ollama
import pytest

from procs import SIM

PAIRS = json.loads((Path(__file__).parent / "fixtures/ollama-api/pairs.json").read_text())["pairs"]
# Fields of the docs' examples swaplab does not send: the deprecated `context` (token ids a later
# /api/generate may send back; swaplab forwards text, and ignores a `context` it is sent) and a
# message's `images: null`.
NOT_SENT = frozenset({"context", "images"})
# Objects whose keys are the model's, not the API's: a tool call's arguments, a GGUF header's keys.
MODELS_OWN = frozenset({"arguments", "model_info"})
# Requests swaplab answers with a 400 that says why (docs/api.md, "What differs from Ollama").
DIFFERENT = {
    ("/api/generate", "Request (with suffix)"): "suffix (fill-in-the-middle) is not translated",
}
MANAGEMENT = {"/api/create", "/api/copy", "/api/delete", "/api/pull", "/api/push"}
CLIENT_MODELS = {
    "/api/generate": ollama.GenerateResponse, "/api/chat": ollama.ChatResponse, "/api/embed": ollama.EmbedResponse,
    "/api/embeddings": ollama.EmbeddingsResponse, "/api/tags": ollama.ListResponse, "/api/ps": ollama.ProcessResponse,
    "/api/show": ollama.ShowResponse,
}
SCRIPT = {
    "rules": [{"match": "weather", "replies": [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Tokyo"}}]}],
               "then": {"content": "The current temperature in Toronto is 11 degrees."}}],
    "default": {"content": "The sky is blue because of Rayleigh scattering."},
}
DOC_MODELS = ("llama3.2", "llama3.1", "llama3.1:8b", "llava", "mistral", "codellama:code", "all-minilm")


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    from conftest import write_config
    from procs import Router

    folder = tmp_path_factory.mktemp("ollama-docs")
    script = folder / "script.json"
    script.write_text(json.dumps(SCRIPT))
    models = "".join(f"""
  "{name}":
    cmd: {SIM} --port ${{PORT}} --model {name.replace(':', '-')} --script {script} --timings
""" for name in DOC_MODELS)
    started = Router(write_config(folder, f"models:{models}"), folder)
    yield started
    started.close()


def same_shape(documented, answered, where: str) -> None:
    """Every field of the docs' example is in the answer, with the same JSON type (numbers are numbers)."""
    if isinstance(documented, dict):
        assert isinstance(answered, dict), f"{where}: an object in the docs, {answered!r} here"
        for key, value in documented.items():
            if key in NOT_SENT:
                continue
            assert key in answered, f"{where}.{key}: in the docs' example, missing here ({sorted(answered)})"
            if key in MODELS_OWN:
                assert isinstance(answered[key], dict), f"{where}.{key}: {answered[key]!r}"
                continue
            same_shape(value, answered[key], f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(answered, list), f"{where}: a list in the docs, {answered!r} here"
        if documented and answered:
            same_shape(documented[0], answered[0], f"{where}[0]")
    elif isinstance(documented, bool):
        assert isinstance(answered, bool), f"{where}: a boolean in the docs, {answered!r} here"
    elif isinstance(documented, (int, float)):
        assert isinstance(answered, (int, float)) and not isinstance(answered, bool), f"{where}: {answered!r}"
    elif isinstance(documented, str):
        assert isinstance(answered, str), f"{where}: a string in the docs, {answered!r} here"


def counterpart(documented: dict, lines: list[dict]) -> dict:
    """The line of a streamed answer a streamed example's object stands for: the last, a tool call, or a text."""
    if documented.get("done"):
        return lines[-1]
    if (documented.get("message") or {}).get("tool_calls"):
        return next(line for line in lines if (line.get("message") or {}).get("tool_calls"))
    return next(line for line in lines if not line.get("done") and (line.get("response") or
                                                                   (line.get("message") or {}).get("content")))


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{p['method']} {p['path']}: {p['name']}" for p in PAIRS])
async def test_the_docs_request_gets_the_docs_shape(router, pair):
    path, method = pair["path"], pair["method"]
    async with aiohttp.ClientSession() as session:
        if path == "/api/ps":  # the docs' example shows a loaded model: load one first
            async with session.post(f"{router.url}/api/generate", json={"model": "mistral"}) as response:
                assert response.status == 200
        kwargs = {"json": pair["request"]} if pair.get("request") is not None else {}
        async with session.request(method, f"{router.url}{path}", **kwargs) as response:
            status, content_type, body = response.status, response.content_type, await response.read()
    if path in MANAGEMENT or (path, pair["name"]) in DIFFERENT:
        assert status == 400, body
        message = json.loads(body)["error"]
        expected = DIFFERENT.get((path, pair["name"]), "edit that file")
        assert expected in message
        return
    assert status == 200, body
    if pair["stream"]:
        assert content_type == "application/x-ndjson"
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        assert lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])
        for number, documented in enumerate(pair["responses"]):
            same_shape(documented, counterpart(documented, lines), f"{pair['name']}: response {number}")
        answers = lines
    else:
        assert content_type == "application/json"
        answer = json.loads(body)
        for number, documented in enumerate(pair["responses"]):
            same_shape(documented, answer, f"{pair['name']}: response {number}")
        answers = [answer]
    model = CLIENT_MODELS.get(path)
    for answer in answers if model is not None else ():
        model.model_validate(answer)  # what the ollama client does with each answer
