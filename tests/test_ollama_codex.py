"""Codex CLI's Ollama mode (`codex exec --oss`) against the router: past its check of Ollama's version.

Codex reads `GET /api/version` and refuses a server below Ollama 0.13.4; then it looks the model
up in `/api/tags` (pulling it when missing) and sends the turn to `/v1/responses` on
`CODEX_OSS_BASE_URL`. A request there is the proof that setup passed.
"""

from __future__ import annotations

import os
import subprocess

import aiohttp
import pytest

from agentclis import agent_cli
from procs import SIM, eventually


async def test_codex_oss_gets_past_its_ollama_version_check(router_factory, tmp_path):
    codex, missing = agent_cli("codex")
    if codex is None:
        pytest.skip(missing)
    # Codex asks /api/tags for the name exactly as given (`sim` is listed as `sim:latest`: a plain `sim`
    # it would try to /api/pull), then sends that same name to /v1/responses, where Ollama's default tag is
    # read as the model's own name: no alias is needed.
    router = router_factory(f"""
models:
  sim:
    cmd: {SIM} --port ${{PORT}} --model sim --default-max-tokens 3
""")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "CODEX_OSS_BASE_URL": f"{router.url}/v1", "NO_COLOR": "1"}
    done = subprocess.run(
        [str(codex), "exec", "--oss", "--local-provider", "ollama", "-m", "sim:latest", "--skip-git-repo-check",
         "--ephemeral", "-c", "check_for_update_on_startup=false", "-c", "analytics.enabled=false", "Say OK."],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    output = done.stdout + done.stderr
    assert "too old" not in output, output
    assert "OSS setup failed" not in output, output

    async def turn():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{router.url}/api/activity") as response:
                rows = (await response.json())["activity"]
        return [row for row in rows if row["path"] == "/v1/responses" and row["requested_model"] == "sim"]

    (row, *_) = await eventually(turn, 10, lambda: f"Codex's turn on /v1/responses; Codex said:\n{output}")
    assert row["status"] == 200, row
    assert done.returncode == 0 and "tok0 tok1 tok2" in done.stdout, output
