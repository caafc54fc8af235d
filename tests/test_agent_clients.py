"""The agent CLIs people point at local models, through the router: Claude Code (`claude -p`) and
Codex (`codex exec`), as `make agents` installs them from npm.

Against the built-in default (llama.cpp serving SmolLM2 on the CPU), whose `/v1/messages` and
`/v1/responses` are llama.cpp's own: each CLI's first request (3k and 4.5k tokens) fits a slot,
reaches the model and streams back. Against a sim in TabbyAPI's personality, which serves
neither route: the router translates, and each CLI prints the model's answer. Nothing leaves
loopback: the CLIs' telemetry, update checks and error reports are off, and HOME is the test's.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import urllib.request
from pathlib import Path

import pytest

from agentclis import agent_cli
from procs import SIM, Router, eventually

# Claude Code's switches for a gateway: no telemetry, no error reports, no update checks.
CLAUDE_OFFLINE = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                  "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}
CODEX_OFFLINE = ["-c", "check_for_update_on_startup=false", "-c", "analytics.enabled=false"]


def _cli(name: str) -> Path:
    path, missing = agent_cli(name)
    if path is None:
        pytest.skip(missing)
    return path


def _home(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (tmp_path / "codex-home").mkdir(exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(tmp_path / "codex-home"),
            "NO_COLOR": "1", "TERM": "dumb"}


def claude(tmp_path: Path, router: Router, model: str, prompt: str, timeout: float,
           **env: str) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        [str(_cli("claude")), "-p", prompt, "--model", model],
        cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        env={**_home(tmp_path), **CLAUDE_OFFLINE, "ANTHROPIC_BASE_URL": router.url, "ANTHROPIC_API_KEY": "unused",
             "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model, **env},
    )


def codex(tmp_path: Path, router: Router, model: str, prompt: str, timeout: float) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    provider = (f'model_providers.swaplab={{name="swaplab", base_url="{router.url}/v1", wire_api="responses", '
                'request_max_retries=0, stream_max_retries=0}')
    return subprocess.run(
        [str(_cli("codex")), "exec", "--skip-git-repo-check", "--ephemeral", *CODEX_OFFLINE,
         "-c", "model_provider=swaplab", "-c", provider, "-m", model, prompt],
        cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, env=_home(tmp_path),
    )


def activity(router: Router) -> list[dict]:
    with urllib.request.urlopen(f"{router.url}/api/activity") as response:
        return json.loads(response.read())["activity"]


async def rows(router: Router, path: str, model: str, what: str) -> list[dict]:
    def found():
        return [row for row in activity(router) if row["path"] == path and row["requested_model"] == model]

    return await eventually(found, 15, what)


# -- through translation: a server with neither route ----------------------------------------


@pytest.fixture(scope="module")
def chat_only(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chatonly")
    script = folder / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "OK"}))
    config = folder / "config.yaml"
    config.write_text(textwrap.dedent(f"""\
        models:
          chatonly:
            cmd: {SIM} --engine tabby --disable-auth true --port ${{PORT}} --model chatonly --script {script}
            proxy: http://127.0.0.1:${{PORT}}
        """))
    router = Router(config, folder)
    yield router
    router.close()


async def test_claude_code_through_messages_translation(chat_only, tmp_path):
    done = claude(tmp_path, chat_only, "chatonly", "Say OK.", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert done.stdout.strip() == "OK", output
    (row, *_) = await rows(chat_only, "/v1/messages", "chatonly", f"Claude Code's turn; it said:\n{output}")
    assert row["status"] == 200, row


async def test_codex_through_responses_translation(chat_only, tmp_path):
    done = codex(tmp_path, chat_only, "chatonly", "Say OK.", timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert done.stdout.strip().splitlines()[-1] == "OK", output
    (row, *_) = await rows(chat_only, "/v1/responses", "chatonly", f"Codex's turn; it said:\n{output}")
    assert row["status"] == 200, row


# -- the built-in default: llama.cpp's own routes ---------------------------------------------


@pytest.fixture(scope="module")
def builtin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("builtin-agents")
    router = Router(None, folder)
    yield router
    router.close()


@pytest.mark.llamacpp
async def test_claude_code_on_the_builtin_default(builtin, tmp_path):
    # SmolLM2 may talk at length: a small output budget (Claude Code's own setting) keeps the turn short; a
    # turn it cuts is Claude Code's "exceeded the output token maximum", after the model streamed.
    done = claude(tmp_path, builtin, "smollm2", "Say OK.", timeout=600, CLAUDE_CODE_MAX_OUTPUT_TOKENS="32")
    output = done.stdout + done.stderr
    assert "exceeds the available context size" not in output, output
    found = await rows(builtin, "/v1/messages", "smollm2", f"Claude Code's turn; it said:\n{output}")
    assert all(row["status"] == 200 for row in found), found
    first = found[-1]
    assert first["prompt_tokens"] > 2048, first  # more than the old 2,048-token slot held
    assert first["completion_tokens"] > 0 and first["ttft_ms"] is not None, first
    assert done.returncode == 0 or "output token maximum" in output, output


@pytest.mark.llamacpp
async def test_codex_on_the_builtin_default(builtin, tmp_path):
    done = codex(tmp_path, builtin, "smollm2", "Say OK.", timeout=600)
    output = done.stdout + done.stderr
    assert "exceeds the available context size" not in output, output
    found = await rows(builtin, "/v1/responses", "smollm2", f"Codex's turn; it said:\n{output}")
    first = found[-1]
    assert first["status"] == 200, found
    assert first["prompt_tokens"] > 2048 and first["completion_tokens"] > 0, first
    assert done.returncode == 0, output
