"""What the router adds to an engine's refusal of a request too long for its context (`router.contextlimit`).

Each engine's refusal is the body its contract records (`errors.exceed_context.body`, read from
its release); the table is the entry's command and what the client is then told.
"""

from __future__ import annotations

import json

import pytest

from swaplab.builtin.defaults import DEFAULT_CONFIG_NAME
from swaplab.config.model import ModelConfig
from swaplab.engines import contract
from swaplab.router.path.contextlimit import explain

WRAPPER = "python -m swaplab.builtin.llamacpp --model m.gguf"


def entry(cmd: str) -> ModelConfig:
    return ModelConfig(id="m", cmd=tuple(cmd.split()), cmd_stop=None, proxy="http://127.0.0.1:1", check_endpoint="/health")


def refusal(engine: str, **figures: int) -> bytes:
    """The engine's own too-long answer as its contract has it, with other figures where given."""
    body = json.dumps(contract(engine).errors.exceed_context.body)
    for old, new in figures.items():
        body = body.replace(old, str(new))
    return body.encode()


LLAMA = "request (700 tokens) exceeds the available context size (512 tokens), try increasing it."
VLLM = ("This model's maximum context length is 4096 tokens. However, your prompt contains 9000 input tokens, which "
        "exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=9000).")
SGLANG = "The input (9000 tokens) is longer than the model's context length (4096 tokens)."


@pytest.mark.parametrize(
    ("cmd", "path", "added"),
    [
        (f"{WRAPPER} --ctx-size 1024 --parallel 2", "/etc/swaplab.yaml",
         "Model m in /etc/swaplab.yaml gives each request 512 tokens (--ctx-size 1024 / --parallel 2); raise --ctx-size "
         "in models.m.cmd above 1,400 (700 tokens x 2 slots), or lower --parallel."),
        (f"{WRAPPER} --ctx-size 1024 --parallel 2", DEFAULT_CONFIG_NAME,
         "Model m in the built-in default gives each request 512 tokens (--ctx-size 1024 / --parallel 2); raise "
         "--ctx-size in models.m.cmd above 1,400 (700 tokens x 2 slots), or lower --parallel. `swaplab config init "
         "FILE` writes the built-in default to a file to edit, for `swaplab serve --config FILE`."),
        ("llama-server -m m.gguf -c 512", "c.yaml",
         "Model m in c.yaml gives each request 512 tokens (-c 512); raise -c in models.m.cmd above 700."),
        ("llama-server -m m.gguf", "c.yaml",
         "Model m in c.yaml gives each request 512 tokens (its cmd sets no --ctx-size, so llama.cpp chose it); set "
         "--ctx-size in models.m.cmd above 700."),
        ("llama-server -m m.gguf -c 512 -np 4 --kv-unified", "c.yaml",
         "Model m in c.yaml gives each request 512 tokens (-c 512, shared by -np 4 slots); raise -c in models.m.cmd "
         "above 700."),
        ("llama-server -m m.gguf -c 512 -np 4 --kv-unified --no-kv-unified", "c.yaml",
         "Model m in c.yaml gives each request 512 tokens (-c 512 / -np 4); raise -c in models.m.cmd above 2,800 "
         "(700 tokens x 4 slots), or lower -np."),
        # More than the model was trained for: llama.cpp caps the slot, so a bigger -c changes nothing.
        ("llama-server -m m.gguf -c 4096 -np 2", "c.yaml",
         "Model m in c.yaml gives each request 512 tokens (-c 4096 / -np 2); that is the most llama.cpp gives this "
         "model (the 2,048 its flags ask is capped at the model's trained context): a longer request needs a model "
         "trained for one."),
        ("llama-server -m m.gguf -c 0", "c.yaml",
         "Model m in c.yaml gives each request 512 tokens (-c 0); that is the most llama.cpp gives this model: a "
         "longer request needs a model trained for one."),
    ],
)
def test_llama_cpps_refusal_names_the_entry_and_its_flags(cmd, path, added):
    body = explain(path, entry(cmd), 400, refusal("llamacpp"))
    assert body is not None
    document = json.loads(body)
    original = contract("llamacpp").errors.exceed_context.body
    assert document["error"]["message"] == f"{LLAMA} {added}"
    # The engine's JSON as it was, but for the message.
    assert {**document["error"], "message": original["error"]["message"]} == original["error"]


@pytest.mark.parametrize(
    ("cmd", "added"),
    [
        ("vllm serve Qwen/Qwen3-8B --max-model-len 4096",
         "Model m in c.yaml gives each request 4,096 tokens (--max-model-len 4096); raise --max-model-len in "
         "models.m.cmd above 9,000."),
        ("vllm serve Qwen/Qwen3-8B --max_model_len=4096",
         "Model m in c.yaml gives each request 4,096 tokens (--max_model_len 4096); raise --max_model_len in "
         "models.m.cmd above 9,000."),
        ("vllm serve Qwen/Qwen3-8B",
         "Model m in c.yaml gives each request 4,096 tokens (its cmd sets no --max-model-len, so vLLM chose it); set "
         "--max-model-len in models.m.cmd above 9,000."),
    ],
)
def test_vllms_refusal_names_max_model_len(cmd, added):
    document = json.loads(explain("c.yaml", entry(cmd), 400, refusal("vllm")))
    assert document["error"]["message"] == f"{VLLM} {added}"
    assert (document["error"]["type"], document["error"]["param"]) == ("BadRequestError", "input_tokens")


def test_sglangs_refusal_keeps_its_message_at_the_top_level():
    cmd = "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --context-length 4096"
    document = json.loads(explain("c.yaml", entry(cmd), 400, refusal("sglang")))
    assert document == {
        **contract("sglang").errors.exceed_context.body,
        "message": f"{SGLANG} Model m in c.yaml gives each request 4,096 tokens (--context-length 4096); raise "
                   "--context-length in models.m.cmd above 9,000.",
    }


def test_sglangs_total_over_the_context_names_its_flag_too():
    body = json.dumps({"object": "error", "message": (
        "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
        "5000 tokens: 3000 tokens from the input messages and 2000 tokens for the completion. Please reduce the number "
        "of tokens in the input messages or the completion to fit within the limit."), "type": "BadRequest",
        "param": None, "code": 400}).encode()
    cmd = "python -m sglang.launch_server --model-path q --context-length 4096"
    message = json.loads(explain("c.yaml", entry(cmd), 400, body))["message"]
    assert message.endswith("(--context-length 4096); raise --context-length in models.m.cmd above 3,000.")


def test_an_anthropic_shaped_refusal_keeps_its_shape():
    body = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": LLAMA[:-1]}}).encode()
    document = json.loads(explain("c.yaml", entry("llama-server -m m.gguf -c 512"), 400, body))
    assert document["type"] == "error" and document["error"]["type"] == "invalid_request_error"
    assert document["error"]["message"].startswith(LLAMA + " Model m in c.yaml gives each request 512 tokens")


@pytest.mark.parametrize(
    ("cmd", "status", "body"),
    [
        ("llama-server -m m.gguf -c 512", 500, refusal("llamacpp")),  # not the status the engine refuses with
        ("llama-server -m m.gguf -c 512", 400, b'{"error":{"code":400,"message":"Invalid JSON","type":"invalid_request_error"}}'),
        ("llama-server -m m.gguf -c 512", 400, b"request (700 tokens) exceeds the available context size (512 tokens)"),
        ("llama-server -m m.gguf -c 512", 400, b'["not", "an", "error"]'),
        ("llama-server -m m.gguf -c 512", 400, b"\xff\xfe"),
        ("/opt/my-server --port 9", 400, refusal("llamacpp")),  # no engine this router knows: nothing to name
        ("python /opt/tabbyAPI/main.py", 400, refusal("llamacpp")),  # TabbyAPI's contract records no such refusal
        ("vllm serve q --max-model-len 4096", 400, refusal("llamacpp")),  # another engine's words
    ],
)
def test_any_other_answer_is_left_as_it_came(cmd, status, body):
    assert explain("c.yaml", entry(cmd), status, body) is None
