"""vLLM's and SGLang's claims as the engines size themselves today, every fact held to their
contracts (swaplab/engines/contracts/{vllm,sglang}.yaml, `memory`): the flag spellings, how a
context or a byte count is parsed, the KV cache dtypes, what a share is a share of, SGLang's
default share; the claims of the seed's SGLang entry and of the docs' vLLM entry through the
config and `swaplab fit`; hybrid configs; and the figures an engine's own start log states."""

from __future__ import annotations

import json
import math

import pytest
from procs import SIM, run_swaplab
from test_memory_estimate import hf_model

from swaplab.config.loader import load_config_text
from swaplab.engines import contract
from swaplab.fleet import Fleet, LogHub
from swaplab.fleet.devices import DeviceReading
from swaplab.fleet.placement import Placement, Resident, claims, place
from swaplab.memory.estimate import GIB
from swaplab.memory.facts import facts_from_hf_config, hf_attention_layers
from swaplab.memory.fit import VLLM_RESERVED, hf_rank_need, sglang_default_fraction, sglang_reserve_mib
from swaplab.memory.flags import FlagError, context_value, engine_load, human_int
from swaplab.memory.reported import parse_engine_log

ENGINES = ("vllm", "sglang")
SEED = "tests/fixtures/seed-glm-flash.yaml"


def command(engine: str, *flags: str) -> list[str]:
    program = ["vllm", "serve", "org/m"] if engine == "vllm" else ["python", "-m", "sglang.launch_server", "--model-path", "/m"]
    return [*program, *flags]


# -- the command line, as each engine parses it ------------------------------------


@pytest.mark.parametrize(("engine", "text", "expected"), [
    (engine, text, expected)
    for engine in ENGINES for text, expected in contract(engine).memory.context_spellings.examples.items()
] + [("vllm", "1.5K", "rejected: no decimals with a binary suffix"), ("vllm", " 4096 ", 4096)])
def test_context_values_parse_as_the_engines_parser_does(engine, text, expected):
    if isinstance(expected, str) and expected != "auto":  # "rejected (...)"
        with pytest.raises(FlagError, match=repr(text)):
            context_value(engine, text)
    else:
        assert context_value(engine, text) == expected


@pytest.mark.parametrize(("engine", "text", "ctx", "auto"), [
    ("vllm", "32k", 32000, False), ("vllm", "32K", 32768, False), ("vllm", "25.6k", 25600, False),
    ("vllm", "-1", 0, True), ("vllm", "auto", 0, True), ("sglang", "32Ki", 32768, False), ("sglang", "-1", 0, False),
])
def test_a_context_flag_becomes_the_loads_context(engine, text, ctx, auto):
    flag = contract(engine).memory.context_flags[0]
    load = engine_load(command(engine, flag, text))
    assert (load.ctx, load.ctx_auto) == (ctx, auto)


@pytest.mark.parametrize(("text", "expected"), [
    ("1k", 1000), ("1K", 1024), ("1g", 10**9), ("1G", 2**30), ("20G", 20 * 2**30), ("8589934592", 8 * 2**30),
])
def test_kv_cache_memory_bytes_takes_vllms_suffixes(text, expected):
    assert human_int("vllm", text, "--kv-cache-memory-bytes") == expected
    assert engine_load(command("vllm", "--kv-cache-memory-bytes", text)).kv_cache_bytes == expected
    assert engine_load(command("vllm", f"--kv_cache_memory_bytes={text}")).kv_cache_bytes == expected


@pytest.mark.parametrize(("engine", "kind", "spelling"), [
    (engine, kind, spelling)
    for engine in ENGINES
    for kind in ("tensor", "data", "pipeline")
    for spelling in getattr(contract(engine).memory, f"{kind}_parallel_flags")
])
def test_every_parallel_spelling_counts_its_devices(engine, kind, spelling):
    for words in ([spelling, "3"], [f"{spelling}=3"]):
        load = engine_load(command(engine, *words))
        assert getattr(load, f"{kind}_parallel") == 3 and load.devices == 3
    together = engine_load(command(engine, "--tensor-parallel-size", "2", spelling, "2"))
    assert together.devices == (2 if kind == "tensor" else 4)  # the last of a kind's spellings wins


def test_sglang_dp_attention_is_inside_the_tp_ranks():
    assert engine_load(command("sglang", "--tp", "4", "--dp-size", "2")).devices == 8
    assert engine_load(command("sglang", "--tp", "4", "--dp-size", "2", "--enable-dp-attention")).devices == 4


@pytest.mark.parametrize(("engine", "dtype", "size"), [
    (engine, dtype, size) for engine in ENGINES for dtype, size in contract(engine).memory.kv_cache_dtypes.items()
])
def test_kv_cache_dtypes_are_the_contracts(engine, dtype, size):
    load = engine_load(command(engine, contract(engine).memory.kv_cache_dtype_flags[-1], dtype))
    assert load.kv_bytes == size and load.kv_element_bytes == (2.0 if size is None else size)  # None: the model's


@pytest.mark.parametrize(("engine", "dtype"), [
    ("vllm", "int3"), ("vllm", "fp8_ds_mla"),  # its layout depends on the model: not sized
    ("sglang", "fp8"), ("sglang", "FP8_E4M3"),  # vLLM's spelling; SGLang's choices are case-sensitive
])
def test_an_unknown_kv_dtype_names_the_valid_ones(engine, dtype):
    with pytest.raises(FlagError, match=f"'{dtype}'.*" + ", ".join(contract(engine).memory.kv_cache_dtypes)):
        engine_load(command(engine, "--kv-cache-dtype", dtype))


@pytest.mark.parametrize(("argv", "message"), [
    ("vllm serve m --gpu-memory-utilization 1.2", "above 0 and at most 1"),
    ("vllm serve m -tp two", "not a whole number"),
    ("vllm serve m --max-model-len 32kk", "not a whole number"),
    ("python -m sglang.launch_server --model-path /m --context-length 25.6Ki", "no decimals"),
])
def test_flag_faults(argv, message):
    with pytest.raises(FlagError, match=message):
        engine_load(argv.split())


# -- SGLang's default share --------------------------------------------------------


@pytest.mark.parametrize(("gpu_mib", "tp", "mla", "reserve", "fraction"), [
    # The contract's worked example: an H100 80GB, tp 1, not MLA: 512 + 1.5 x 8192 + 128 + 256 x 2 + 58 x 8.
    (81559, 1, False, 13904, 0.83),
    (143771, 1, False, 13904, 0.903),  # an H200: the same reserve
    (40960, 1, False, 512 + 1.5 * 4096 + 128 + 32 * 2 + 50 * 8, round((40960 - 7248) / 40960, 3)),
    # A 16 GiB card at tp 2 with MLA (the seed's): 512 + 1.5 x 2048 + 256 + 8 x 2 + 1536.
    (16384, 2, True, 5392, round((16384 - 5392) / 16384, 3)),
    (24576, 4, False, 512 + 6144 + 512 + 160 * 2 + 50 * 8, round((24576 - 7888) / 24576, 3)),
    (81920, 8, True, 512 + 12288 + 1024 + 512 * 2 + 1536, round((81920 - 16384) / 81920, 3)),
])
def test_sglangs_default_share_from_the_gpus_size(gpu_mib, tp, mla, reserve, fraction):
    assert sglang_reserve_mib(gpu_mib, tp, 1, mla) == reserve
    assert sglang_default_fraction(gpu_mib, tp, 1, mla) == fraction


# -- hybrid configs: only attention layers keep a KV cache ---------------------------

DENSE = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
         "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("family", "config", "attention"), [
    ("Qwen3-Next: layer_types", {**DENSE, "num_hidden_layers": 8,
                                 "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2}, (3, 7)),
    ("Qwen3-Next: full_attention_interval", {**DENSE, "num_hidden_layers": 8, "full_attention_interval": 4}, (3, 7)),
    ("Nemotron-H: hybrid_override_pattern", {**DENSE, "num_hidden_layers": 10,
                                             "hybrid_override_pattern": "M-M*-M-M*E"}, (3, 8)),
    ("Jamba: attn_layer_period/offset", {**DENSE, "num_hidden_layers": 16, "attn_layer_period": 8,
                                         "attn_layer_offset": 4}, (4, 12)),
    ("Falcon-H1: layers_block_type", {**DENSE, "num_hidden_layers": 4,
                                      "layers_block_type": ["mamba", "attention", "mamba", "attention"]}, (1, 3)),
    ("dense", {**DENSE, "num_hidden_layers": 4}, (0, 1, 2, 3)),
])
def test_hybrid_configs_count_only_their_attention_layers(family, config, attention):
    layers = config["num_hidden_layers"]
    assert hf_attention_layers(config, layers) == tuple(layer in attention for layer in range(layers))
    facts = facts_from_hf_config(config, 1 << 30)
    # Each attention layer: 2 KV heads x 256 x (K + V) x 2 bytes; the others keep nothing per token.
    assert hf_rank_need(facts, 1024).kv_bytes_per_token == len(attention) * 2 * 512 * 2
    assert hf_rank_need(facts, 1024, tensor_parallel=2).kv_bytes_per_token == len(attention) * 1 * 512 * 2
    assert sum(facts.recurrent_layers) == (layers - len(attention) if len(attention) < layers else 0)


# -- claims through the config and `swaplab fit` -------------------------------------

# Qwen/Qwen3-30B-A3B-FP8's config.json, the keys that size memory. Its weights are a round
# 31 GiB here (about its checkpoint's size): the arithmetic below is in terms of that.
QWEN3_30B = {
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_WEIGHTS = 31 * GIB
PER_TOKEN = 48 * 4 * 128 * 2 * 2  # layers x KV heads x head dim x (K + V) x bf16: 96 KiB per token
DOCS = "vllm serve Qwen/Qwen3-30B-A3B-FP8 --port ${PORT} --enable-sleep-mode"
H100S = "devices:\n" + "".join(f"  {i}: {{name: H100 {i}, vramGiB: 80}}\n" for i in range(4))


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A local Hugging Face cache holding Qwen3-30B-A3B-FP8's config.json and index (nothing fetched)."""
    cache = tmp_path / "hub"
    repo = cache / "models--Qwen--Qwen3-30B-A3B-FP8"
    hf_model(repo / "snapshots" / ("b" * 40), QWEN3_30B, QWEN3_30B_WEIGHTS)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def docs_config(*entries: tuple[str, str]) -> str:
    models = "".join(f"  {name}:\n    cmd: {DOCS} {flags}\n    useModelName: Qwen/Qwen3-30B-A3B-FP8\n"
                     for name, flags in entries)
    return H100S + "models:\n" + models


@pytest.mark.parametrize(("flags", "claim", "floor"), [
    # No --gpu-memory-utilization: vLLM 0.34 takes what is free at its start (utilization 1.0).
    ("", {0: 80.0}, f"weights 31.00 + KV at 40960 tokens {40960 * PER_TOKEN / GIB:.2f} + reserved 2.00"),
    # A share is of the device's total.
    ("--gpu-memory-utilization 0.85", {0: 68.0}, "weights 31.00 + KV at 40960 tokens 3.75 + reserved 2.00"),
    # The KV cache's bytes per GPU, whatever the share: weights + 20 GiB + the reserve.
    ("--kv-cache-memory-bytes 20G", {0: 31.0 + 20.0 + VLLM_RESERVED / GIB}, "weights 31.00 + KV 20.00 + reserved 2.00"),
    # tp x dp devices, each whole; the weights and the KV heads split over the two TP ranks.
    ("-tp 2 -dp 2", {0: 80.0, 1: 80.0, 2: 80.0, 3: 80.0}, "weights 15.50 + KV at 40960 tokens 1.88 + reserved 2.00"),
    # 32k is 32000 tokens to vLLM (32K would be 32768).
    ("--max-model-len 32k", {0: 80.0}, f"KV at 32000 tokens {32000 * PER_TOKEN / GIB:.2f}"),
])
def test_the_docs_vllm_entry_claims_what_vllm_takes(hf_cache, flags, claim, floor):
    config = load_config_text(docs_config(("qwen", flags)))
    assert claims(config, "qwen") == pytest.approx(claim)
    detail = config.estimates["qwen"].detail
    assert floor in detail and "will not start" not in detail


def test_vllm_claims_refuse_what_does_not_fit(hf_cache):
    config = load_config_text(docs_config(
        ("whole", ""), ("bytes", "--kv-cache-memory-bytes 20G"), ("small", "--kv-cache-memory-bytes 1G"),
        ("thin", "--gpu-memory-utilization 0.4"), ("auto", "--gpu-memory-utilization 0.45 --max-model-len auto"),
    ) + "    devices: [1]\n")
    # A vLLM that takes the whole device leaves nothing for another beside it.
    assert place(config, "bytes", [Resident("whole", "ready", 0, 0.0)]) == Placement("evict", evict=("whole",))
    # 1 GiB of KV cannot hold one 40960-token sequence (3.75 GiB): vLLM refuses to start.
    assert "KV at 40960 tokens needs 3.75 GiB: it will not start" in config.estimates["small"].detail
    # 0.4 x 80 = 32 GiB cannot hold 31 + 3.75 + 2. At 0.45 (36 GiB) with auto, vLLM starts at the
    # longest context that fits: 3 GiB of KV at 96 KiB a token.
    assert "short of its floor" in config.estimates["thin"].detail
    assert "longest context that fits, about 32768 tokens" in config.estimates["auto"].detail
    assert "will not start" not in config.estimates["auto"].detail


def test_swaplab_fit_on_the_docs_vllm_entry(hf_cache, tmp_path):
    path = tmp_path / "docs.yaml"
    path.write_text(docs_config(("qwen", "--max-model-len 32k"), ("wide", "-tp 2 -dp 2"), ("bytes", "--kv-cache-memory-bytes 20G")))
    env = {"HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    shown = run_swaplab("fit", "qwen", "--config", str(path), "--devices", "80GiB", "--json", env=env)
    document = json.loads(shown.stdout)
    assert shown.returncode == 0, shown.stderr
    assert (document["ctx"], document["takes"], document["fits"]) == (32000, [80 * GIB], True)
    assert document["per_rank"]["kv"] == 32000 * PER_TOKEN
    # -tp 2 -dp 2 spans four GPUs: two are not enough.
    shown = run_swaplab("fit", "wide", "--config", str(path), "--devices", "80GiB,80GiB", env=env)
    assert shown.returncode == 1 and "it spans 4 devices (tensor 2 x data 2 x pipeline 1) and has 2" in shown.stdout
    shown = run_swaplab("fit", "bytes", "--config", str(path), "--devices", "48GiB", env=env)
    assert shown.returncode == 1 and "= 53.00 GiB; more than the device's 48.00 GiB" in shown.stdout


def test_the_seeds_sglang_entry_claims_both_devices_whole():
    text = open(SEED, encoding="utf-8").read()
    devices = "devices:\n  0: {name: RTX 5060 Ti, vramGiB: 16}\n  1: {name: RTX 4060 Ti, vramGiB: 16}\n"
    config = load_config_text(devices + text)
    # 0.85 of the free memory is its static pool (13.6 GiB), and SGLang's own reserve for a 16 GiB
    # GPU at tp 2 with MLA (GLM-4.7-Flash; its folder is not on this machine) is 5392 MiB: more
    # than the 2.4 GiB that 0.85 leaves, so nothing else fits beside it (it ran at 0.12 GiB free).
    assert claims(config, "glm-flash-sglang") == {0: 16.0, 1: 16.0}
    detail = config.estimates["glm-flash-sglang"].detail
    assert "SGLang takes 0.85 of the memory free at its start" in detail
    assert f"needs {5392 / 1024:.2f} GiB beside it" in detail and "as 0.85 leaves 2.40 GiB beside it" in detail


def test_sglang_claims_its_share_and_the_reserve_beside_it(tmp_path):
    folder = hf_model(tmp_path / "qwen3")
    config = load_config_text(f"""
devices:
  0: {{name: H100, vramGiB: {81559 / 1024}}}
  1: {{name: A100, vramGiB: 80}}
models:
  default: {{cmd: "python -m sglang.launch_server --model-path {folder} --port ${{PORT}}", devices: [0]}}
  half-a: {{cmd: "python -m sglang.launch_server --model-path {folder} --mem-fraction-static 0.5 --port ${{PORT}}", devices: [1]}}
  half-b: {{cmd: "python -m sglang.launch_server --model-path {folder} --mem-fraction-static 0.5 --port ${{PORT}}", devices: [1]}}
""")
    # Without --mem-fraction-static: 0.83 of an H100 for weights and KV, the rest for graphs: all of it.
    assert claims(config, "default") == {0: pytest.approx(81559 / 1024)}
    assert "takes 0.83 of a 81559 MiB GPU" in config.estimates["default"].detail
    # 0.5 x 80 GiB and SGLang's own reserve of 13904 MiB beside it; two of them do not fit one GPU.
    assert claims(config, "half-a") == {1: pytest.approx(40 + 13904 / 1024, abs=1e-6)}
    assert place(config, "half-b", [Resident("half-a", "ready", 0, 0.0)]) == Placement("evict", evict=("half-a",))


# -- what the engine's start says it allocated -------------------------------------


@pytest.mark.parametrize(("engine", "summary"), [
    ("vllm", "vLLM reported weights 15.27 + KV 56.63 + CUDA graphs 0.54 = 72.44 GiB per GPU (412,416 KV tokens)"),
    ("sglang", "SGLang reported weights 15.33 + KV 45.14 + CUDA graphs 0.61 = 61.08 GiB per GPU (845,123 KV tokens)"),
])
def test_the_engines_own_figures_from_its_log(engine, summary):
    lines = [report.example for report in contract(engine).memory.reports]
    reported = parse_engine_log(engine, ["unrelated line", *lines])
    assert reported.summary() == summary
    assert parse_engine_log(engine, ["nothing here"]).figures == {}


class NoNvml:
    def read(self) -> dict[int, DeviceReading]:
        return {}

    def process_memory(self, pids) -> None:
        return None

    def close(self) -> None:
        pass


async def test_the_fleet_records_what_vllm_said_beside_its_estimate(tmp_path):
    log = tmp_path / "vllm-start.log"
    log.write_text("\n".join(report.example for report in contract("vllm").memory.reports) + "\n")
    config = load_config_text(
        "healthCheckTimeout: 30\ndevices:\n  0: {name: H100, vramGiB: 80}\nmodels:\n"
        f"  qwen:\n    cmd: {SIM} --port ${{PORT}} --model qwen --engine vllm --startup-log {log} --startup-seconds 0.1\n")
    assert claims(config, "qwen") == {0: 80.0}  # the sim stands in for vLLM: no share given, the whole device
    fleet = Fleet(config, state_dir=tmp_path / "state", logs=LogHub(), device_probe=NoNvml())
    await fleet.open()
    try:
        async with fleet.lease("qwen"):
            pass
        detail = fleet.status()[0]["claim_estimate"]
        assert detail.startswith("vLLM takes the memory free at its start")
        assert detail.endswith("; at its start vLLM reported weights 15.27 + KV 56.63 + CUDA graphs 0.54 = 72.44 GiB "
                               "per GPU (412,416 KV tokens)")
        assert claims(fleet.config, "qwen") == {0: 80.0}  # beside the claim, not in its place
    finally:
        await fleet.close()


def test_reserved_is_the_contracts_margin_floor_and_more():
    # max(1 GiB, 0.75 x peak) is the least vLLM keeps beside its KV cache; the reserve is above it.
    assert "max(1 GiB, 0.75 x transient peak)" in contract("vllm").memory.reserved
    assert VLLM_RESERVED > 1 * GIB and math.isclose(VLLM_RESERVED / GIB, 2.0)
