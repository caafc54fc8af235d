"""What the engines' releases require, checked before it bites and honoured when it runs (issue 36):

- docs/sleep.md's examples load without a fault and reach ready on the sim in each engine's
  personality, then swap by sleep and wake;
- an entry the engine cannot serve (a vLLM whose served name is not the one requests carry, a
  sleep without the engine's sleep flags or env, a TabbyAPI sleep without its admin key) is a
  fault at its line in `config check`;
- a vLLM started without `--enable-sleep-mode` behind a wrapper the check cannot see through
  answers its sleep and frees nothing: not counted as asleep, stopped, and the next model starts;
- a backend started with its own key reaches ready, sleeps and wakes, saves and restores its slots.

Every backend is `swaplab sim` in the engine's personality, which follows the engine's contract
(tests/test_engine_contracts.py holds it there). Order comes from events, never from sleeps.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import aiohttp
import yaml
from configtext import faults_of, load
from procs import SIM, run_swaplab
from routerclient import running

from swaplab.config.engines import call_headers, engine_key
from swaplab.engines import engine_of, flag_value, flag_values, has_flag
from swaplab.memory.flags import engine_load

DOCS = Path(__file__).parent.parent / "docs"
SIM_SWITCHES = ("--enable-sleep-mode", "--enable-tokenizer-info-endpoint", "--enable-memory-saver",
                "--enable-weights-cpu-backup")


def docs_configs(name: str) -> list[str]:
    """The YAML blocks of a docs page that are whole configs (they have `models:`)."""
    text = (DOCS / name).read_text()
    return [block for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if re.search(r"^models:", block, re.M)]


def as_sim(cmd: str, folder: Path) -> str:
    """An engine's command as the sim in that engine's personality: the same engine flags, the
    model it would serve, its port. (TabbyAPI's runs in `folder`, where its api_tokens.yml is.)"""
    argv = shlex.split(cmd.replace("${PORT}", "PORTWORD"))
    engine = engine_of(argv)
    assert engine is not None, cmd
    # The model vLLM or SGLang serves, read as the memory claims read it; TabbyAPI's is --model-name.
    model = engine_load(argv).model if engine in ("vllm", "sglang") else flag_value(argv, ("--model-name",))
    flags = [f"--served-model-name {shlex.join(names)}"
             for names in [flag_values(argv, ("--served-model-name",))] if names and engine != "tabby"]
    flags += [switch for switch in SIM_SWITCHES if has_flag(argv, (switch,))]
    for key in ("--api-key", "--admin-api-key"):
        if flag_value(argv, (key,)):
            flags.append(f"{key} {flag_value(argv, (key,))}")
    sim = f"{SIM} --engine {engine} --model {model} --port ${{PORT}} {' '.join(flags)}"
    if engine == "tabby":
        return f"sh -c {shlex.quote(f'cd {folder} && exec {sim}')}"
    return sim


def sim_config(block: str, folder: Path) -> str:
    """A docs config with each engine's command replaced by the sim in its personality."""
    document = yaml.safe_load(block)
    for entry in document["models"].values():
        entry["cmd"] = as_sim(" ".join(line for line in entry["cmd"].splitlines() if line.strip()), folder)
    return yaml.safe_dump(document, sort_keys=False)


TABBY_KEYS = {"api_key": "tabby-api-key-0123", "admin_key": "tabby-admin-key-4567"}


def test_the_sleep_docs_configs_load_without_a_fault():
    blocks = docs_configs("sleep.md")
    assert blocks, "docs/sleep.md shows no whole config"
    for block in blocks:
        # Loaded as written, in an environment with the key the TabbyAPI example reads.
        config = load(block, environ={"TABBY_ADMIN_KEY": TABBY_KEYS["admin_key"]})
        assert config.models, block


def test_the_tabby_example_sends_its_admin_key_on_load_and_unload():
    block = next(block for block in docs_configs("sleep.md") if "tabby" in block)
    model = load(block, environ={"TABBY_ADMIN_KEY": "k-123"}).models["tabby"]
    assert engine_key(model) == ("k-123", "")
    assert call_headers(model, "/v1/model/unload") == {"Authorization": "Bearer k-123"}


async def test_the_sleep_docs_configs_reach_ready_on_the_sim_and_swap_by_sleep(router_factory, tmp_path):
    (tmp_path / "api_tokens.yml").write_text(yaml.safe_dump(TABBY_KEYS))
    sleeping = [block for block in docs_configs("sleep.md") if "sleep:" in block]
    text = "\n".join(sim_config(block, tmp_path) for block in sleeping[:1])
    document = yaml.safe_load(text)
    tabby = yaml.safe_load(sim_config(next(b for b in sleeping if "tabby" in b), tmp_path))["models"]
    document["models"].update(tabby)
    for entry in document["models"].values():
        entry["sleep"]["hostMemoryGiB"] = 0.001  # the sims hold next to nothing
    document["hostMemory"] = {"budgetGiB": 1}
    router = router_factory(yaml.safe_dump(document), env={"TABBY_ADMIN_KEY": TABBY_KEYS["admin_key"]})
    key = {"Authorization": f"Bearer {TABBY_KEYS['api_key']}"}
    async with aiohttp.ClientSession() as session:
        for model in ["qwen-vllm", "glm-sglang", "tabby", "qwen-vllm", "glm-sglang", "tabby"]:
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with session.post(f"{router.url}/v1/chat/completions", json=body, headers=key) as response:
                assert response.status == 200, (model, await response.text(), router.output()[-3000:])
        entries = await running(session, router.url)
        for name in ("qwen-vllm", "glm-sglang", "tabby"):
            sleep = entries[name]["sleep"]
            assert sleep["wakes"] >= 1 and not sleep.get("last_fallback"), (name, sleep)
        # vLLM said what its sleep freed, in its own words, and /running shows it.
        vllm = entries["qwen-vllm"]["sleep"]
        assert vllm["last_freed_gib"] == 1 and "Sleep mode freed 1.0 GiB memory" in vllm["last_freed_by"], vllm


def test_entries_the_engines_cannot_serve_are_faults_at_their_lines():
    faults = faults_of("""
        models:
          qwen:
            cmd: vllm serve Qwen/Qwen3-8B --port ${PORT}
          asleep:
            cmd: vllm serve Qwen/Qwen3-8B --port ${PORT} --served-model-name asleep
            sleep: {engine: vllm}
          glm:
            cmd: python -m sglang.launch_server --model-path zai-org/GLM-4.5-Air --port ${PORT} --enable-memory-saver
            sleep: {engine: sglang}
          tabby:
            cmd: python /opt/tabbyAPI/main.py --port ${PORT}
            sleep: {engine: http, sleepRequests: [POST /v1/model/unload], wakeRequests: [POST /v1/model/load]}
    """)
    text = "\n".join(f"test.yaml:{line}: {message}" for line, message in faults)
    assert re.search(r"test.yaml:4: models.qwen: requests reach vLLM as model 'qwen', but it serves only "
                     r"'Qwen/Qwen3-8B'.*useModelName: Qwen/Qwen3-8B", text)
    assert re.search(r"test.yaml:7: models.asleep.sleep: its cmd lacks --enable-sleep-mode: without it vLLM answers the "
                     r"sleep call and frees nothing \(vllm/config/model.py:683-690\)", text)
    assert re.search(r"test.yaml:7: models.asleep.sleep: vLLM serves its sleep calls only with VLLM_SERVER_DEV_MODE=1", text)
    assert re.search(r"test.yaml:10: models.glm.sleep: its cmd lacks --enable-weights-cpu-backup", text)
    assert re.search(r"test.yaml:13: models.tabby.sleep: TabbyAPI refuses its load and unload calls without its admin key",
                     text)
    assert len(faults) == 5, text


def test_what_the_engines_serve_loads_clean():
    config = load("""
        models:
          qwen:
            cmd: vllm serve Qwen/Qwen3-8B --port ${PORT} --served-model-name qwen q3 --enable-sleep-mode
            aliases: [q3]
            env: [VLLM_SERVER_DEV_MODE=1]
            sleep: {engine: vllm}
          renamed:
            cmd: vllm serve /models/qwen --port ${PORT}
            useModelName: /models/qwen
          glm:
            # SGLang's chat and completions take any model name (sglang/srt/entrypoints/openai/serving_base.py:49)
            cmd: python -m sglang.launch_server --model-path zai-org/GLM-4.5-Air --port ${PORT}
          wrapped:
            cmd: /usr/local/bin/serve-qwen.sh --port ${PORT}
            sleep: {engine: vllm}
          open-tabby:
            cmd: python /opt/tabbyAPI/main.py --port ${PORT} --disable-auth true
            sleep: {engine: http, sleepRequests: [POST /v1/model/unload], wakeRequests: [POST /v1/model/load]}
    """)
    assert set(config.models) == {"qwen", "renamed", "glm", "wrapped", "open-tabby"}
    assert any("models.wrapped.sleep: its cmd does not show vLLM" in warning for warning in config.warnings)


def test_config_check_prints_them_with_file_and_line(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  qwen:\n    cmd: vllm serve Qwen/Qwen3-8B --port ${PORT}\n")
    done = run_swaplab("config", "check", str(path), timeout=60)
    assert done.returncode != 0
    assert f"{path}:3: models.qwen: requests reach vLLM as model 'qwen'" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


async def test_a_sleep_that_frees_nothing_is_not_believed_and_the_next_model_starts(router_factory, tmp_path):
    # Behind a wrapper `config check` cannot read: only the sleep itself shows the missing --enable-sleep-mode.
    wrapped = f"sh -c {shlex.quote(f'exec {SIM} --engine vllm --model a --port $0 --memory-gib 12')} ${{PORT}}"
    router = router_factory(f"""
hostMemory: {{budgetGiB: 10}}
models:
  a:
    cmd: {wrapped}
    env: [VLLM_SERVER_DEV_MODE=1]
    sleep: {{engine: vllm, hostMemoryGiB: 0.001}}
  b:
    cmd: {SIM} --port ${{PORT}} --model b
""")
    async with aiohttp.ClientSession() as session:
        for model in ("a", "b"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
        listed = await running(session, router.url)
        assert listed["a"]["state"] == "stopped", listed["a"]  # not asleep
        assert "freed nothing" in listed["a"]["sleep"]["last_fallback"]
        assert listed["b"]["state"] == "ready"
    log = router.output()
    assert re.search(r"a: its sleep failed \(it answered the sleep call but freed nothing \(a said: "
                     r"Sleep mode freed 0\.0 GiB memory, 12\.0 GiB memory is still in use\.\)\); stopping it instead", log), log
    assert "a asleep" not in log


async def test_a_backend_with_its_own_key_is_ready_sleeps_wakes_and_keeps_its_slots(router_factory, tmp_path):
    store = tmp_path / "kvcache"
    model_file = tmp_path / "a.gguf"
    model_file.write_bytes(b"GGUF not really")
    router = router_factory(f"""
apiKeys: [router-key-9]
hostMemory: {{budgetGiB: 1}}
kvCache: {{path: {store}, budgetGiB: 1}}
models:
  glm:
    cmd: {SIM} --engine sglang --model glm --port ${{PORT}} --api-key user-key-1 --admin-api-key admin-key-2
      --enable-memory-saver --enable-weights-cpu-backup
    checkEndpoint: generate
    sleep: {{engine: sglang, hostMemoryGiB: 0.001}}
  small:
    cmd: {SIM} --engine llamacpp --model {model_file} --port ${{PORT}} --api-key slot-key-3 --slot-save-path {store}
      --timings
    checkEndpoint: generate
    kvCache: {{minTokens: 20, saveTimeout: 5}}
""")
    long_prompt = " ".join(f"word{i}" for i in range(60))
    async with aiohttp.ClientSession() as session:
        async def ask(model: str, prompt: str = "hi") -> dict:
            # The client knows the router's key only: each backend is sent its own, as a peer its apiKey.
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
            headers = {"Authorization": "Bearer router-key-9"}
            async with session.post(f"{router.url}/v1/chat/completions", json=body, headers=headers) as response:
                answer = await response.json(content_type=None)
                assert response.status == 200, (answer, router.output()[-3000:])
                return answer

        await ask("glm")
        first = await ask("small", long_prompt)  # glm falls asleep: a release with the admin key
        await ask("glm")  # small is stopped, its slot saved with its key; glm wakes
        again = await ask("small", long_prompt + " more")  # restored with its key
        assert again["timings"]["cache_n"] >= first["timings"]["prompt_n"]
        async with session.get(f"{router.url}/running", headers={"Authorization": "Bearer router-key-9"}) as response:
            glm = {entry["model"]: entry for entry in (await response.json())["running"]}["glm"]
        assert glm["sleep"]["sleeps"] >= 1 and glm["sleep"]["wakes"] >= 1 and not glm["sleep"].get("last_fallback")
    assert "401" not in router.output()


def test_config_show_never_shows_a_models_key(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  tabby:\n    cmd: python /opt/tabbyAPI/main.py --port ${PORT}\n"
                    "    apiKey: tabby-admin-key-4567\n")
    done = run_swaplab("config", "show", str(path), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "tabby-admin-key-4567" not in done.stdout + done.stderr
    assert '"api_key": "***"' in done.stdout
