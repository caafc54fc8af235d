"""The config loader: llama-swap's YAML read unchanged, every fault found at its line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from configtext import faults_of, load
from swaplab.config import load_config, load_config_text
from swaplab.config.model import GroupConfig, Timeouts
from swaplab.errors import ConfigError, Fault

FIXTURES = Path(__file__).parent / "fixtures"
SEED = FIXTURES / "seed-glm-flash.yaml"
FAULTS = FIXTURES / "config-faults.yaml"
SWAPLAB = Path(sys.executable).parent / "swaplab"



def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "SWAPLAB_TEST_UNSET"}
    return subprocess.run([str(SWAPLAB), *args], capture_output=True, text=True, env=env, timeout=60)


# -- the seed entry ----------------------------------------------------------------------


SEED_ARGV = [
    "/usr/bin/env",
    "CUDA_DEVICE_ORDER=PCI_BUS_ID",
    "FLASHINFER_USE_CUDA_NORM=1",
    "HF_HOME=/home/giovanni/.cache/huggingface",
    "PATH=/home/giovanni/ai/sglang-venv/bin:/usr/local/cuda-13.0/bin:/home/giovanni/.local/bin"
    ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "SGLANG_STDERR=/tmp/glm-flash-sglang-via-swap.err",
    "/home/giovanni/ai/sglang-venv/bin/python",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "/home/giovanni/models-nvme/hf/models--QuantTrio--GLM-4.7-Flash-AWQ/snapshots/"
    "88e3d3d913c0d97c8f505cdc03433c48226bedc3",
    "--served-model-name", "glm-flash-sglang",
    "--tp", "2",
    "--host", "127.0.0.1", "--port", "9190",
    "--context-length", "131072",
    "--kv-cache-dtype", "fp8_e4m3",
    "--mem-fraction-static", "0.85",
    "--reasoning-parser", "glm45",
    "--tool-call-parser", "glm47",
]


def test_seed_entry_resolves_to_the_exact_argv():
    config = load_config(str(SEED))
    model = config.models["glm-flash-sglang"]
    assert list(model.cmd) == SEED_ARGV
    assert not any("#" in arg or "MEASURED" in arg or "'" in arg for arg in model.cmd)
    assert model.check_endpoint == "/health_generate"
    assert model.proxy == "http://127.0.0.1:9190"
    assert model.aliases == ("glm-4.7-flash-sglang-tp2",)
    assert config.resolve_alias("glm-4.7-flash-sglang-tp2") == "glm-flash-sglang"
    assert config.health_check_timeout == 1200
    assert model.cmd_stop is None
    assert model.line == 12


def test_seed_peers_keep_their_models_and_timeouts():
    config = load_config(str(SEED))
    driver = config.peers["freetoken-driver"]
    assert driver.proxy == "http://127.0.0.1:9162"
    assert driver.models == ("qwen36-ft", "gemma4-ft", "gpt-oss-20b-ft")
    assert driver.timeouts.response_header == 3600
    assert driver.timeouts.idle_conn == 3600
    assert driver.api_key == ""
    ollama = config.peers["ollama"]
    assert ollama.proxy == "http://127.0.0.1:11434"
    assert ollama.models == ("gemma4:31b-cloud", "glm-5.2:cloud", "mistral-large-3:675b-cloud", "kimi-k2.7-code:cloud")
    assert ollama.timeouts.response_header == 60  # llama-swap's default for peers
    # `upstream:` is no llama-swap timeout: a warning at its line, never a fault.
    assert config.warnings == (f"{SEED}:284: unknown key 'upstream' ignored",)


def test_seed_raw_text_is_the_entry_as_written():
    text = SEED.read_text().split("\n")
    raw = load_config(str(SEED)).models["glm-flash-sglang"].raw_text.split("\n")
    assert raw[0] == '  "glm-flash-sglang":'
    assert raw[-1] == "    checkEndpoint: /health_generate"
    assert raw == text[11 : 11 + len(raw)]
    assert "    # FIRST SGLANG ENTRY — a FOURTH backend after llama.cpp, vLLM and" in raw


# -- faults, all at once, at their lines -------------------------------------------------

EXPECTED_FAULTS = [
    (7, "macros.PORT: macro name 'PORT' is reserved (swaplab fills in ${PORT} itself)"),
    (14, "unknown macro '${model_dir}' found in alpha.cmd"),
    (15, "models.alpha.ttl: expected a whole number, got 'abc'"),
    (18, "models.alpha.env: expected NAME=VALUE, got 'HF_HUB_OFFLINE'"),
    (20, "duplicate alias shared found in model: beta (already an alias of alpha)"),
    (21, "unknown macro '${PID}' found in beta.cmd (${PID} is only available in cmdStop)"),
    (25, "models.gamma.description: environment variable 'SWAPLAB_TEST_UNSET' is not set"),
    (28, "models.delta.aliases: 'alpha' is already a model id"),
    (29, "models.delta.sendLoadingState: expected true or false, got 'sometimes'"),
    (33, "groups.pair.members: 'nosuch' is not a model"),
    (35, "peers.cloud: proxy is required"),
    (
        41,
        "peers.remote.timeouts.responseHeader: expected a number of seconds, got '3600s' "
        "(write a plain number of seconds, without a unit, as llama-swap requires)",
    ),
]


def test_every_fault_is_reported_at_its_line(monkeypatch):
    monkeypatch.delenv("SWAPLAB_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError) as caught:
        load_config(str(FAULTS))
    assert caught.value.faults == [Fault(str(FAULTS), line, message) for line, message in EXPECTED_FAULTS]
    assert caught.value.warnings == (
        f"{FAULTS}:23: models.gamma: no cmd, so starting this model fails (llama-swap loads it too)",
        f"{FAULTS}:30: unknown key 'colour' ignored",
    )


def test_check_prints_one_line_per_fault_and_exits_2():
    result = run_cli("config", "check", str(FAULTS))
    assert result.returncode == 2
    assert result.stdout.splitlines() == [f"{FAULTS}:{line}: {message}" for line, message in EXPECTED_FAULTS]
    assert result.stderr.splitlines() == [
        f"{FAULTS}:23: models.gamma: no cmd, so starting this model fails (llama-swap loads it too)",
        f"{FAULTS}:30: unknown key 'colour' ignored",
    ]


def test_check_accepts_the_seed():
    result = run_cli("config", "check", str(SEED))
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr.splitlines() == [f"{SEED}:284: unknown key 'upstream' ignored"]


def test_check_reports_a_missing_file_and_a_yaml_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    result = run_cli("config", "check", str(missing))
    assert (result.returncode, result.stdout) == (2, f"{missing}:1: no such file\n")

    broken = tmp_path / "broken.yaml"
    broken.write_text("models:\n  a:\n    cmd: [unclosed\n    ttl: 5\n")
    result = run_cli("config", "check", str(broken))
    assert result.returncode == 2
    [line] = result.stdout.splitlines()
    assert line.startswith(f"{broken}:3: invalid YAML: the list opened with '[' at column 10 is never closed")


def test_show_model_by_alias_prints_argv_json():
    result = run_cli("config", "show", str(SEED), "--model", "glm-4.7-flash-sglang-tp2")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["id"] == "glm-flash-sglang"
    assert document["cmd"] == SEED_ARGV
    assert document["proxy"] == "http://127.0.0.1:9190"
    assert document["check_endpoint"] == "/health_generate"


def test_show_unknown_model_lists_the_models():
    result = run_cli("config", "show", str(SEED), "--model", "nope")
    assert result.returncode == 2
    assert "'nope' not found" in result.stderr and "glm-flash-sglang" in result.stderr
    assert result.stdout == ""


def test_show_redacts_secrets(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            apiKeys: [sk-local-secret-1]
            models:
              a: {cmd: "serve --port ${PORT}"}
            peers:
              cloud:
                proxy: https://api.example.com
                apiKey: sk-peer-secret-2
                models: [big]
            """
        )
    )
    result = run_cli("config", "show", str(path))
    assert result.returncode == 0, result.stderr
    assert "sk-local-secret-1" not in result.stdout and "sk-peer-secret-2" not in result.stdout
    document = json.loads(result.stdout)
    assert document["api_keys"] == ["***"]
    assert document["peers"]["cloud"]["api_key"] == "***"
    assert document["models"]["a"]["cmd"] == ["serve", "--port", "5800"]
    assert load_config(str(path)).peers["cloud"].api_key == "sk-peer-secret-2"


# -- macros ------------------------------------------------------------------------------


def test_macros_nest_and_a_model_macro_overrides_a_global_in_place():
    config = load(
        """\
        macros:
          root: /opt/llama
          server: ${root}/bin/llama-server
          ctx: 4096
          serve: ${server} --ctx-size ${ctx}
        models:
          plain:
            cmd: ${serve} -m plain.gguf
            proxy: http://127.0.0.1:9000
          big:
            macros:
              ctx: 65536
              extra: --flash-attn ${ctx}
            cmd: ${serve} ${extra}
            proxy: http://127.0.0.1:9001
        """
    )
    assert config.models["plain"].cmd == ("/opt/llama/bin/llama-server", "--ctx-size", "4096", "-m", "plain.gguf")
    # `serve` was declared globally, yet it sees the model's `ctx`: the override takes the global's place.
    assert config.models["big"].cmd == ("/opt/llama/bin/llama-server", "--ctx-size", "65536", "--flash-attn", "65536")


def test_a_macro_sees_only_macros_declared_before_it():
    faults = faults_of(
        """\
        macros:
          serve: llama-server --ctx-size ${ctx}
          ctx: 4096
        models:
          a:
            cmd: ${serve}
            proxy: http://127.0.0.1:9000
        """
    )
    assert faults == [
        (
            2,
            "macros.serve: unknown macro '${ctx}': 'ctx' is declared after 'serve', "
            "and a macro sees only the macros declared before it",
        )
    ]


def test_macros_apply_to_every_string_and_keep_their_type_as_a_whole_value():
    config = load(
        """\
        macros:
          ctx: 8192
          fast: true
          temp: 0.7
          family: qwen
          whole: 1.0
          keep: 600
        models:
          qwen-8b:
            cmd: llama-server --port ${PORT} -c ${ctx}
            ttl: ${keep}
            aliases: ["${MODEL_ID}-latest"]
            name: ${family} 8B (${ctx} ctx)
            description: served as ${MODEL_ID} on port ${PORT}
            env: ["MODEL_TAG=${family}-${MODEL_ID}"]
            useModelName: ${family}
            metadata:
              context: ${ctx}
              fast: ${fast}
              temperature: ${temp}
              label: "${family} @ ${temp}"
              scale: "x${whole}"
              port: ${PORT}
              nested: {list: ["${ctx}", "${MODEL_ID}"]}
            filters:
              stripParams: "top_k, ${family}_flag, model"
              setParams: {temperature: "${temp}", n_ctx: "${ctx}"}
        """
    )
    model = config.models["qwen-8b"]
    assert model.cmd == ("llama-server", "--port", "5800", "-c", "8192")
    assert model.name == "qwen 8B (8192 ctx)"
    assert model.description == "served as qwen-8b on port 5800"
    assert model.env == (("MODEL_TAG", "qwen-qwen-8b"),)
    assert model.use_model_name == "qwen"
    assert model.ttl == 600  # a whole-value macro keeps its type, even in a number setting
    assert model.aliases == ("qwen-8b-latest",)
    assert model.metadata == {
        "context": 8192,
        "fast": True,
        "temperature": 0.7,
        "label": "qwen @ 0.7",
        "scale": "x1",  # Go's %v writes 1.0 as 1
        "port": 5800,
        "nested": {"list": [8192, "qwen-8b"]},
    }
    assert model.filters.strip_params == ("qwen_flag", "top_k")  # sorted, `model` never stripped
    assert model.filters.set_params == {"temperature": 0.7, "n_ctx": 8192}


def test_env_macros_are_substituted_first_and_typed_when_unquoted(monkeypatch):
    environ = {"MODELS": "/srv/models", "BASE_PORT": "9100", "KEY": "sk-1"}
    config = load(
        """\
        startPort: ${env.BASE_PORT}
        apiKeys: ["${env.KEY}"]
        macros:
          dir: ${env.MODELS}
        models:
          a:
            cmd: |
              # ${env.NOT_SET_BUT_IN_A_COMMENT} is dropped with its line
              llama-server -m ${dir}/a.gguf --port ${PORT}
        """,
        environ,
    )
    assert config.start_port == 9100
    assert config.api_keys == ("sk-1",)
    assert config.models["a"].cmd == ("llama-server", "-m", "/srv/models/a.gguf", "--port", "9100")

    monkeypatch.setenv("SWAPLAB_TEST_DIR", "/data")
    from_process = load_config_text("models:\n  a: {cmd: 'run ${env.SWAPLAB_TEST_DIR}', proxy: 'http://h:1'}\n")
    assert from_process.models["a"].cmd == ("run", "/data")


def test_unset_env_and_unknown_macros_point_inside_a_cmd_block():
    faults = faults_of(
        """\
        models:
          a:
            cmd: |
              llama-server
              # ${undefined_in_comment} is ignored
              --model ${model_dir}/a.gguf
              --port ${PORT}
              --api-key ${env.SWAPLAB_SURELY_UNSET}
        """
    )
    assert faults == [
        (6, "unknown macro '${model_dir}' found in a.cmd"),
        (8, "models.a.cmd: environment variable 'SWAPLAB_SURELY_UNSET' is not set"),
    ]


def test_ports_go_to_models_using_port_in_sorted_id_order():
    config = load(
        """\
        startPort: 7000
        models:
          b: {cmd: "server --port ${PORT}"}
          a: {cmd: "server --port ${PORT}"}
          fixed: {cmd: "server --port 9999", proxy: "http://127.0.0.1:9999"}
          c: {cmd: "server --port ${PORT}", proxy: "http://127.0.0.1:${PORT}/v1"}
        """
    )
    ports = {model_id: model.cmd[-1] for model_id, model in config.models.items()}
    assert ports == {"a": "7000", "b": "7001", "c": "7002", "fixed": "9999"}
    assert config.models["a"].proxy == "http://localhost:7000"
    assert config.models["c"].proxy == "http://127.0.0.1:7002/v1"
    assert list(config.models) == ["b", "a", "fixed", "c"]  # file order kept


def test_port_in_proxy_without_port_in_cmd_is_a_fault():
    faults = faults_of(
        """\
        models:
          fixed:
            cmd: server --port 9999
          explicit:
            cmd: server --port 9998
            proxy: http://127.0.0.1:${PORT}
        """
    )
    assert faults == [
        (
            2,
            "model fixed: proxy uses ${PORT} but cmd does not - ${PORT} is only available when used in cmd "
            "(the default proxy http://localhost:${PORT} needs it: set proxy)",
        ),
        (6, "model explicit: proxy uses ${PORT} but cmd does not - ${PORT} is only available when used in cmd"),
    ]


def test_cmd_comments_with_quotes_are_dropped_and_backslashes_join_lines():
    config = load(
        """\
        models:
          a:
            cmd: |
              # don't let this apostrophe reach shlex
              llama-server \\
                --model "/models/my model.gguf" \\
                # it's still a comment, even mid-continuation
                --port ${PORT}
              --alias 'a b'
            cmdStop: |
              # the fleet fills in ${PID} at stop time
              kill -TERM ${PID}
        """
    )
    model = config.models["a"]
    assert model.cmd == ("llama-server", "--model", "/models/my model.gguf", "--port", "5800", "--alias", "a b")
    assert model.cmd_stop == ("kill", "-TERM", "${PID}")


def test_reserved_and_invalid_macro_names_are_faults():
    faults = faults_of(
        """\
        macros:
          PID: 1
          MODEL_ID: x
          "bad name": y
          selfish: a ${selfish}
          empty:
        models: {}
        """
    )
    assert faults == [
        (2, "macros.PID: macro name 'PID' is reserved (swaplab fills in ${PID} itself)"),
        (3, "macros.MODEL_ID: macro name 'MODEL_ID' is reserved (swaplab fills in ${MODEL_ID} itself)"),
        (4, "macros.bad name: macro name 'bad name' contains invalid characters, must match pattern ^[a-zA-Z0-9_-]+$"),
        (5, "macros.selfish: macro 'selfish' contains self-reference"),
        (6, "macros.empty: macro 'empty' has invalid type (empty), must be a scalar type (string, int, float, or bool)"),
    ]


# -- everything else a config says -------------------------------------------------------


def test_defaults_follow_llama_swap_and_globals_flow_into_models():
    config = load(
        """\
        healthCheckTimeout: 5
        globalTTL: 600
        unloadTimeout: 20
        sendLoadingState: true
        models:
          a: {cmd: "server --port ${PORT}"}
          b: {cmd: "server --port ${PORT}", ttl: 0, unloadTimeout: 3, sendLoadingState: false}
        """
    )
    a, b = config.models["a"], config.models["b"]
    assert config.health_check_timeout == 15  # llama-swap's minimum
    assert config.warnings == ("test.yaml:1: healthCheckTimeout 5 is below the minimum 15; using 15",)
    assert (a.ttl, a.unload_timeout, a.send_loading_state) == (600, 20.0, True)
    assert (b.ttl, b.unload_timeout, b.send_loading_state) == (0, 3.0, False)
    assert a.check_endpoint == "/health"
    assert a.timeouts == Timeouts(
        connect=30.0, response_header=None, idle_conn=90.0, keepalive=30.0, tls_handshake=10.0, expect_continue=1.0
    )
    assert config.group_of("a") == GroupConfig(id="(default)", members=("a", "b"))


def test_unknown_keys_are_warnings_not_faults():
    config = load(
        """\
        logToStdout: both
        colour: blue
        models:
          a:
            cmd: server --port ${PORT}
            capabilities: {tools: true, flavour: sweet}
            timeouts: {connect: 5, keepalive: 30, upstream: 60}
        """
    )
    assert config.models["a"].timeouts.connect == 5
    # Keys llama-swap knows are read; a key neither knows is a warning at its line, never a fault.
    assert config.warnings == (
        "test.yaml:2: unknown key 'colour' ignored",
        "test.yaml:6: unknown key 'flavour' ignored",
        "test.yaml:7: unknown key 'upstream' ignored",
    )


def test_groups_and_their_faults():
    config = load(
        """\
        models:
          a: {cmd: "s --port ${PORT}"}
          b: {cmd: "s --port ${PORT}"}
          c: {cmd: "s --port ${PORT}", aliases: [sea]}
        groups:
          always:
            persistent: true
            swap: false
            exclusive: false
            members: [a, b]
        """
    )
    assert config.groups["always"] == GroupConfig(
        id="always", swap=False, exclusive=False, persistent=True, members=("a", "b")
    )
    assert config.group_of("c").members == ("c",)

    faults = faults_of(
        """\
        models:
          a: {cmd: "s --port ${PORT}"}
          c: {cmd: "s --port ${PORT}", aliases: [sea]}
        groups:
          one: {members: [a, a]}
          two: {members: [a, sea]}
        """
    )
    assert faults == [
        (5, "duplicate model member a found in group: one"),
        (6, "model member a is used in multiple groups: one and two"),
        (6, "groups.two.members: 'sea' is not a model (it is an alias of 'c'; list the model id)"),
    ]


def test_preload_resolves_aliases_and_skips_unknown_names_with_a_warning():
    config = load(
        """\
        hooks:
          on_startup:
            preload: [fast, " ", a]
        models:
          a: {cmd: "s --port ${PORT}", aliases: [fast]}
        """
    )
    assert config.preload == ("a",)
    # llama-swap drops a name that is no model silently; swaplab drops it and says so.
    config = load(
        """\
        hooks:
          on_startup:
            preload:
              - a
              - ghost
        models:
          a: {cmd: "s --port ${PORT}"}
        """
    )
    assert config.preload == ("a",)
    assert config.warnings == ("test.yaml:5: hooks.on_startup.preload: 'ghost' is not a model id or alias; not preloaded",)


def test_types_are_checked_without_silent_coercion():
    faults = faults_of(
        """\
        startPort: 0
        globalTTL: "600"
        models:
          a:
            cmd: s --port ${PORT}
            ttl: 1.5
            concurrencyLimit: -2
            unlisted: maybe
            aliases: just-one
            env: {A: b}
            metadata: [1, 2]
            timeouts: {connect: fast}
        """
    )
    assert faults == [
        (1, "startPort must be greater than 1, got 0"),
        (2, "globalTTL: expected a whole number, got '600'"),
        (6, "models.a.ttl: expected a whole number, got '1.5'"),
        (7, "models.a.concurrencyLimit: must be at least 0, got -2"),
        (8, "models.a.unlisted: expected true or false, got 'maybe'"),
        (9, "models.a.aliases: expected a list, got 'just-one'"),
        (10, "models.a.env: expected a list, got a mapping"),
        (11, "models.a.metadata: expected a mapping, got a list"),
        (12, "models.a.timeouts.connect: expected a number of seconds, got 'fast'"),
    ]


def test_yaml_1_2_scalars_and_duplicate_keys():
    config = load(
        """\
        models:
          a:
            cmd: s --port ${PORT}
            unlisted: yes
            metadata: {answer: no, time: 1:20}
        """
    )
    # A boolean setting accepts yes/no as yaml.v3 does; a free-form value keeps the text.
    assert config.models["a"].unlisted is True
    assert config.models["a"].metadata == {"answer": "no", "time": "1:20"}
    assert faults_of("models:\n  a: {cmd: x, proxy: 'http://h:1'}\n  a: {cmd: y, proxy: 'http://h:2'}\n") == [
        (3, "key 'a' already defined at line 2")
    ]


def test_peers_filters_timeouts_and_probe():
    config = load(
        """\
        macros:
          key: sk-from-macro
        peers:
          cloud:
            proxy: https://api.example.com/v1
            apiKey: ${key}
            probe: 300
            models: [big, big, small]
            filters:
              stripParams: [temperature, top_p]
              setParams: {max_tokens: 512, model: nope}
            timeouts: {responseHeader: 0, connect: 2.5}
        """
    )
    peer = config.peers["cloud"]
    assert peer.api_key == "sk-from-macro"
    assert peer.probe == 300
    assert peer.models == ("big", "small")
    assert peer.filters.strip_params == ("temperature", "top_p")
    assert peer.filters.set_params == {"max_tokens": 512}
    assert peer.timeouts == Timeouts(
        connect=2.5, response_header=None, idle_conn=90.0, keepalive=30.0, tls_handshake=10.0, expect_continue=1.0
    )
    assert config.warnings == ("test.yaml:11: peers.cloud.filters.setParams.model: 'model' cannot be set; ignored",)

    assert faults_of(
        """\
        peers:
          empty: {proxy: "http://h:1"}
          local: {proxy: "http://h:1", models: [a], apiKey: "${MODEL_ID}"}
          bad: {proxy: "ftp://h", models: [a]}
        """
    ) == [
        (2, "peers.empty: peer models can not be empty"),
        (3, "peers.local.apiKey: unknown macro '${MODEL_ID}' (${MODEL_ID} is only available in a model)"),
        (4, "peers.bad.proxy: invalid peer proxy URL (ftp://h): expected an http:// or https:// URL"),
    ]


def test_devices_and_vram_claims():
    config = load(
        """\
        devices:
          0: {name: RTX 5060 Ti, vramGiB: 16}
          1: {name: RTX 4060 Ti, vramGiB: 16}
        models:
          tp2: {cmd: "s --port ${PORT}", devices: [0, 1], vramGiB: 15}
          small: {cmd: "s --port ${PORT}", devices: [1], vramGiB: {1: 8.5}}
        """
    )
    assert config.devices[0].name == "RTX 5060 Ti" and config.devices[1].vram_gib == 16
    assert config.models["tp2"].devices == (0, 1)
    assert config.models["tp2"].vram_gib == {0: 15.0, 1: 15.0}
    assert config.models["small"].vram_gib == {1: 8.5}

    assert faults_of(
        """\
        devices:
          0: {vramGiB: 16}
        models:
          big: {cmd: "s --port ${PORT}", devices: [0], vramGiB: 24}
          elsewhere: {cmd: "s --port ${PORT}", devices: [3]}
          stray: {cmd: "s --port ${PORT}", devices: [0], vramGiB: {1: 2}}
        """
    ) == [
        (4, "models.big.vramGiB: needs 24 GiB on device 0, which has 16 GiB"),
        (5, "models.elsewhere.devices: device 3 is not declared under devices"),
        (6, "models.stray.vramGiB.1: device 1 is not in this model's devices [0]"),
    ]


def test_alias_colliding_with_a_peer_model_name():
    assert faults_of(
        """\
        models:
          a: {cmd: "s --port ${PORT}", aliases: [cloud/big]}
        peers:
          cloud: {proxy: "http://h:1", models: [big]}
        """
    ) == [(2, 'model a alias "cloud/big" conflicts with fully qualified peer model name')]


def test_an_empty_config_is_valid():
    config = load("")
    assert config.models == {} and config.start_port == 5800 and config.health_check_timeout == 120


def test_raw_text_runs_from_the_key_to_the_entry_own_last_line():
    config = load(
        """\
        models:
          # about a: belongs above the key, not in the entry
          a:
            cmd: |
              s --port ${PORT}
              # inside the block
            # a deeper comment is the entry's own
            ttl: 5

          # about b
          b: {cmd: "s --port ${PORT}"}
        # a top-level comment
        groups: {}
        """
    )
    assert config.models["a"].raw_text.split("\n") == [
        "  a:",
        "    cmd: |",
        "      s --port ${PORT}",
        "      # inside the block",
        "    # a deeper comment is the entry's own",
        "    ttl: 5",
    ]
    assert config.models["b"].raw_text == '  b: {cmd: "s --port ${PORT}"}'
    assert (config.models["a"].line, config.models["b"].line) == (3, 11)


# -- the built-in default: shown, checked, written out -----------------------------------------


def test_show_and_check_read_the_built_in_default_when_no_file_is_given():
    shown = run_cli("config", "show")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["path"] == "<built-in default>"
    assert sorted(document["models"]) == ["gemma3-270m", "smollm2", "smollm2-embed"]
    assert document["models"]["smollm2"]["capabilities"]["input"] == ["text"]
    # The embedding entry runs beside the chat models: its group neither swaps them out nor is swapped out.
    assert document["groups"]["embeddings"] == {
        "id": "embeddings", "swap": False, "exclusive": False, "persistent": True, "members": ["smollm2-embed"],
    }
    assert run_cli("config", "check").returncode == 0


def test_init_writes_the_built_in_default_once_and_says_where(tmp_path):
    target = tmp_path / "mine.yaml"
    written = run_cli("config", "init", str(target))
    assert (written.returncode, written.stderr) == (0, "")
    assert str(target) in written.stdout and f"swaplab serve --config {target}" in written.stdout
    config = load_config(str(target))  # a config like any other: it loads, and is the default's
    assert sorted(config.models) == ["gemma3-270m", "smollm2", "smollm2-embed"]
    assert config.models["smollm2"].aliases == ("smollm2-135m",)

    target.write_text("# my edits\n")
    again = run_cli("config", "init", str(target))
    assert (again.returncode, again.stdout) == (2, "")
    assert again.stderr == f"swaplab: config init: {target} exists; pass --force to overwrite it\n"
    assert target.read_text() == "# my edits\n"
    assert run_cli("config", "init", "--force", str(target)).returncode == 0
    assert "smollm2" in target.read_text()

    folder = run_cli("config", "init", str(tmp_path))
    assert folder.returncode == 2 and "is a folder" in folder.stderr
    default = subprocess.run([str(SWAPLAB), "config", "init"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert default.returncode == 0 and (tmp_path / "swaplab.yaml").is_file()


@pytest.mark.parametrize(("flags", "listen"), [((), 8080), (("--listen", "127.0.0.1:9000"), 9000)])
def test_show_and_init_give_the_built_in_default_the_ports_serve_gives_it(tmp_path, flags, listen):
    from swaplab.router.serve import load as serve_load  # what `swaplab serve --listen` runs with no --config

    served = {model_id: model.proxy for model_id, model in serve_load(None, listen).models.items()}
    ports = sorted(int(proxy.rsplit(":", 1)[1]) for proxy in served.values())
    assert ports == list(range(listen + 1, listen + 1 + len(served)))  # the ports after the router's

    shown = run_cli("config", "show", *flags)
    assert shown.returncode == 0, shown.stderr
    assert {model_id: model["proxy"] for model_id, model in json.loads(shown.stdout)["models"].items()} == served
    serve_line = "swaplab serve" + (f" --listen 127.0.0.1:{listen}" if flags else "")
    assert shown.stderr == (
        f"<built-in default>: backends on ports from {listen + 1} (after the router's {listen}), as `{serve_line}` runs it\n"
    )

    target = tmp_path / "swaplab.yaml"
    written = run_cli("config", "init", str(target), *flags)
    assert written.returncode == 0, written.stderr
    assert written.stdout == (
        f"Wrote the built-in default to {target}, its backends on ports from {listen + 1} (after the router's "
        f"{listen}, as serve gives them); serve it with: swaplab serve --config {target}"
        + (f" --listen 127.0.0.1:{listen}" if flags else "") + "\n"
    )
    assert {model_id: model.proxy for model_id, model in load_config(str(target)).models.items()} == served


def test_an_unknown_key_close_to_a_known_one_says_which():
    config = load(
        """\
        healthCheckTimeot: 30
        models:
          a:
            cmd: server --port ${PORT}
            aliasses: [b]
            timeouts: {idelConn: 4}
            capabilities: {in: [text], contxt: 5}
        peers:
          p: {proxy: "http://127.0.0.1:9", models: [x], apikey: k}
        flavour: sweet
        """
    )
    assert config.warnings == (
        "test.yaml:1: unknown key 'healthCheckTimeot' ignored (did you mean 'healthCheckTimeout'?)",
        "test.yaml:5: unknown key 'aliasses' ignored (did you mean 'aliases'?)",
        "test.yaml:6: unknown key 'idelConn' ignored (did you mean 'idleConn'?)",
        "test.yaml:7: unknown key 'contxt' ignored (did you mean 'context'?)",
        "test.yaml:9: unknown key 'apikey' ignored (did you mean 'apiKey'?)",
        "test.yaml:10: unknown key 'flavour' ignored",  # close to nothing: no guess
    )


def test_check_says_did_you_mean_at_the_line(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text("models:\n  a:\n    cmd: server --port ${PORT}\n    aliasses: [b]\n")
    result = run_cli("config", "check", str(config))
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == f"{config}:4: unknown key 'aliasses' ignored (did you mean 'aliases'?)\n"
    strict = run_cli("config", "check", "--strict", str(config))
    assert (strict.returncode, strict.stdout) == (1, f"{config}:4: unknown key 'aliasses' ignored (did you mean 'aliases'?)\n")
