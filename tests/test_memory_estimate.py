"""The memory estimator as a table: each kind of attention, cache type, slot layout and split,
over ModelFacts built in the test (the comparison with llama.cpp itself is
tests/test_memory_llamacpp.py). Also the GGUF header reader's faults, the flags of a
llama-server command line, llama.cpp's load log, `fit`, and `swaplab fit` itself."""

from __future__ import annotations

import json
import math

import pytest
from procs import run_swaplab

from swaplab.builtin.models import SMOLLM2, model_path
from swaplab.memory.estimate import GIB, MIB, LoadSettings, estimate, row_bytes
from swaplab.memory.facts import ModelFacts, ModelFactsError, Recurrent, TensorInfo, hf_folder, read_gguf, read_hf
from swaplab.memory.fit import hf_rank_need, largest_context
from swaplab.memory.flags import EngineLoad, FlagError, engine_load, llama_load
from swaplab.memory.reported import parse_load_log


def facts(**changes) -> ModelFacts:
    layers = changes.pop("n_layer", 4)
    base = dict(
        source="t.gguf", architecture="llama", n_layer=layers, n_embd=256, n_vocab=1000, n_ctx_train=8192,
        n_head=(8,) * layers, n_head_kv=(2,) * layers, head_dim_k=32, head_dim_v=32, n_ff=512,
        tensors=tuple(TensorInfo(f"blk.{i}.ffn_up.weight", "F16", 1000, 1000 * i + 64, (256, 512)) for i in range(layers))
        + (TensorInfo("token_embd.weight", "F16", 5000, 10_000, (256, 1000)),),
    )
    base.update(changes)
    return ModelFacts(**base)


@pytest.mark.parametrize(("kind", "model", "settings", "kv_bytes"), [
    # GQA: 4 layers x (2 heads x 32) x (K + V) x 2 bytes x 4096 cells
    ("GQA f16", facts(), LoadSettings(ctx=4096), 4 * 64 * 2 * 2 * 4096),
    ("GQA q8_0: 34 bytes per 32 values", facts(), LoadSettings(ctx=4096, cache_type_k="q8_0", cache_type_v="q8_0"),
     4 * (64 // 32 * 34) * 2 * 4096),
    ("GQA q4_0 K, f16 V", facts(), LoadSettings(ctx=4096, cache_type_k="q4_0"), 4 * (2 * 18 + 128) * 4096),
    ("context padded to 256", facts(), LoadSettings(ctx=4000), 4 * 256 * 4096),
    ("slots: per-slot cells padded, 3 x pad(16384 / 3)", facts(), LoadSettings(ctx=16384, parallel=3), 4 * 256 * 3 * 5632),
    ("MQA", facts(n_head_kv=(1,) * 4), LoadSettings(ctx=4096), 4 * 32 * 2 * 2 * 4096),
    ("per-layer KV heads", facts(n_head_kv=(1, 2, 4, 8)), LoadSettings(ctx=4096), (1 + 2 + 4 + 8) * 32 * 2 * 2 * 4096),
    ("MLA: the latent and rope as K, no V", facts(kv_lora_rank=512, rope_dim=64, n_head_kv=(1,) * 4, head_dim_k=576,
                                                 head_dim_v=512), LoadSettings(ctx=4096), 4 * 576 * 2 * 4096),
    ("SWA: window x 1 + ubatch, padded", facts(n_layer=6, sliding_window=512, swa_layers=(True,) * 5 + (False,)),
     LoadSettings(ctx=32768), 5 * 256 * 1024 + 1 * 256 * 32768),
    ("SWA unified over 2 slots: window x 2 + ubatch", facts(n_layer=6, sliding_window=512, swa_layers=(True,) * 5 + (False,)),
     LoadSettings(ctx=32768, parallel=2, kv_unified=True), 5 * 256 * 1536 + 256 * 32768),
    ("SWA per slot: a window in each slot's stream", facts(n_layer=6, sliding_window=512, swa_layers=(True,) * 5 + (False,)),
     LoadSettings(ctx=32768, parallel=2), 5 * 256 * 1024 * 2 + 256 * 32768),
    ("SWA --swa-full", facts(n_layer=6, sliding_window=512, swa_layers=(True,) * 5 + (False,)),
     LoadSettings(ctx=32768, swa_full=True), 6 * 256 * 32768),
])
def test_kv_cache_by_attention_kind(kind, model, settings, kv_bytes):
    assert estimate(model, settings).total("kv") == kv_bytes, kind


def test_recurrent_layers_keep_a_fixed_state_per_slot_instead_of_kv():
    hybrid = facts(n_head_kv=(0, 0, 2, 0), recurrent=Recurrent(conv_elements=512, state_elements=0),
                   recurrent_layers=(True, True, False, True))
    one, four = estimate(hybrid, LoadSettings(ctx=4096)), estimate(hybrid, LoadSettings(ctx=16384, parallel=4))
    assert one.total("kv") == 256 * 4096 and one.total("recurrent") == 3 * 512 * 4
    assert four.total("recurrent") == 4 * one.total("recurrent")  # per slot, not per token


def test_compute_grows_with_context_and_ubatch_and_without_flash_attention():
    model = facts()
    base = estimate(model, LoadSettings(ctx=4096)).total("compute")
    assert estimate(model, LoadSettings(ctx=8192)).total("compute") - base == 4096 * 512 * 2  # the f16 mask
    assert estimate(model, LoadSettings(ctx=4096, ubatch=256)).total("compute") == base // 2
    no_flash = estimate(model, LoadSettings(ctx=4096, flash_attn="off"))
    assert no_flash.total("compute") >= 4096 * 512 * 8 * 4  # n_kv x tokens x heads, f32
    assert not no_flash.flash_attn
    # A quantized V cache needs flash attention: llama.cpp turns it on.
    forced = estimate(model, LoadSettings(ctx=4096, flash_attn="off", cache_type_v="q8_0"))
    assert forced.flash_attn and forced.notes


def test_gpu_layers_split_and_the_tied_output_copy():
    model = facts()
    # llama.cpp splits the 4 layers plus the output layer: 0/5, 1/5, 2/5 fall below GPU0's
    # half, 3/5 and the output layer on GPU1.
    two = estimate(model, LoadSettings(ctx=4096), gpus=[8 * GIB, 8 * GIB])
    assert two.device("GPU0").kv == 3 * 256 * 4096 and two.device("GPU1").kv == 256 * 4096
    assert two.device("GPU1").weights >= 5000  # the output layer is GPU1's: the tied head copied there
    uneven = estimate(model, LoadSettings(ctx=4096, tensor_split=(3, 1)), gpus=[8 * GIB, 8 * GIB])
    assert uneven.device("GPU0").kv == 4 * 256 * 4096 and uneven.device("GPU1").kv == 0
    partial = estimate(model, LoadSettings(ctx=4096, gpu_layers=2), gpus=[8 * GIB])
    assert partial.device("GPU0").kv == 256 * 4096 and partial.device("CPU").kv == 3 * 256 * 4096
    cpu_kv = estimate(model, LoadSettings(ctx=4096, no_kv_offload=True), gpus=[8 * GIB])
    assert cpu_kv.device("GPU0").kv == 0 and cpu_kv.device("CPU").kv == 4 * 256 * 4096


def test_row_bytes_follow_ggml_blocks():
    assert row_bytes("f16", 64) == 128 and row_bytes("q8_0", 64) == 68 and row_bytes("q4_0", 64) == 36
    assert row_bytes("Q4_K", 256) == 144


def test_fit_finds_the_largest_context_and_stops_at_the_models_own():
    model = facts(n_ctx_train=1 << 20)
    per_cell = 4 * 256
    largest = largest_context(model, LoadSettings(), gpus=[64 * MIB])
    assert largest % 256 == 0 and largest > 0
    fits = estimate(model, LoadSettings(ctx=largest), [64 * MIB]).device("GPU0").total
    over = estimate(model, LoadSettings(ctx=largest + 256), [64 * MIB]).device("GPU0").total
    assert fits <= 64 * MIB < over and over - fits >= 256 * per_cell
    assert largest_context(facts(), LoadSettings(), gpus=[64 * GIB]) == 8192  # trained for no more
    assert largest_context(model, LoadSettings(), gpus=[1024]) == 0


def test_tensor_parallel_splits_heads_and_replicates_mla():
    gqa = facts(n_head_kv=(8,) * 4, head_dim_k=128, head_dim_v=128, weights_bytes=16 * GIB)
    one, four = hf_rank_need(gqa, 1024), hf_rank_need(gqa, 1024, tensor_parallel=4)
    assert four.weights == one.weights // 4 and four.kv_bytes_per_token == one.kv_bytes_per_token / 4
    few = facts(n_head_kv=(2,) * 4, head_dim_k=128, head_dim_v=128)
    assert hf_rank_need(few, 1024, tensor_parallel=8).kv_bytes_per_token == hf_rank_need(few, 1024, tensor_parallel=2).kv_bytes_per_token
    mla = facts(kv_lora_rank=512, rope_dim=64, n_head_kv=(1,) * 4)
    assert hf_rank_need(mla, 1024, tensor_parallel=8).kv == hf_rank_need(mla, 1024).kv  # the latent on every rank
    fp8 = hf_rank_need(gqa, 1024, cache_bytes=1.0)
    assert fp8.kv * 2 == one.kv  # fp8 halves cost per token


@pytest.mark.parametrize(("argv", "expected"), [
    ("llama-server -m m.gguf -c 8192 -np 2 -ctk q8_0 --cache-type-v=q4_0 -fa off -ngl 20 -ts 3,1",
     dict(ctx=8192, parallel=2, cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="off", gpu_layers=20,
          tensor_split=(3.0, 1.0))),
    ("llama-server -m m.gguf -fa -c 100 -c 200 --swa-full -kvu", dict(ctx=200, flash_attn="on", swa_full=True, kv_unified=True)),
    ("python -m swaplab.builtin.llamacpp -m m.gguf", dict(ctx=4096)),  # the wrapper's own -c default
    ("llama-server --model=m.gguf -ngl all --n-cpu-moe 3 --no-mmap", dict(ctx=0, gpu_layers=-1, n_cpu_moe=3, mmap=False)),
])
def test_llama_server_flags(argv, expected):
    load = llama_load(argv.split())
    assert load.model == "m.gguf"
    for name, value in expected.items():
        assert getattr(load.settings, name) == value, name


@pytest.mark.parametrize(("argv", "message"), [
    ("llama-server -c 8192", "no -m/--model"),
    ("llama-server -m m.gguf -c lots", "-c 'lots': not a whole number"),
    ("llama-server -m m.gguf -ctk q3_x", "not a cache type"),
    ("llama-server -m m.gguf -c", "-c needs a value"),
])
def test_llama_server_flag_faults(argv, message):
    with pytest.raises(FlagError, match=message):
        llama_load(argv.split())


def test_gguf_header_faults_name_the_file(tmp_path):
    with pytest.raises(ModelFactsError, match="no such file"):
        read_gguf(tmp_path / "absent.gguf")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ModelFactsError, match="not a GGUF file"):
        read_gguf(tmp_path / "text.gguf")
    real = model_path(SMOLLM2).read_bytes()[:4096]
    (tmp_path / "cut.gguf").write_bytes(real)
    with pytest.raises(ModelFactsError, match="ends early"):
        read_gguf(tmp_path / "cut.gguf")


def test_the_load_log_adds_two_kv_caches_and_keeps_the_last_compute_reserve():
    reported = parse_load_log([
        "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB",
        "load_tensors:   CPU_REPACK model buffer size =    12.66 MiB",
        "llama_kv_cache:        CPU KV buffer size =    96.00 MiB",
        "llama_kv_cache:        CPU KV buffer size =    15.00 MiB",
        "sched_reserve:        CPU compute buffer size =    60.00 MiB",
        "sched_reserve:        CPU compute buffer size =    51.28 MiB",
        "llama_context:        CPU  output buffer size =     1.00 MiB",
    ])
    assert reported.total("kv") == 111 * MIB and reported.total("weights") == round(247.82 * MIB)
    assert reported.total("compute") == round(51.28 * MIB) and reported.total("output") == MIB


@pytest.mark.llamacpp
def test_swaplab_fit_on_the_shipped_model():
    shown = run_swaplab("fit", "smollm2", "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    expected = estimate(read_gguf(model_path(SMOLLM2)), LoadSettings(ctx=16384, parallel=2))
    assert document["devices"][0]["kv"] == expected.total("kv") == 16384 * 23040
    assert document["kv_bytes_per_token"] == 23040 and document["fits"]
    # A device too small for the KV cache: exit 1, the largest term and what would change it.
    short = run_swaplab("fit", str(model_path(SMOLLM2)), "--ctx", "65536", "--devices", "1GiB")
    assert short.returncode == 1
    assert "does not fit: GPU0 needs" in short.stdout and "the largest term is kv" in short.stdout
    assert "-ctk q8_0 -ctv q8_0" in short.stdout
    bad = run_swaplab("fit", "smollm2", "--devices", "16 parsecs")
    assert bad.returncode == 2 and "expected sizes like 16GiB" in bad.stderr


QWEN3_8B = {  # config.json of Qwen/Qwen3-8B (its Hugging Face repository), the keys that size memory
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
    "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
}


def hf_model(folder, config=QWEN3_8B, total_size=16381470720):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total_size}}))
    return folder


@pytest.mark.parametrize(("argv", "expected"), [
    ("vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 32768 --kv-cache-dtype fp8 --gpu-memory-utilization 0.5",
     EngineLoad("vllm", "Qwen/Qwen3-8B", tensor_parallel=2, ctx=32768, kv_cache_dtype="fp8", kv_bytes=1.0, fraction=0.5)),
    ("python -m vllm.entrypoints.openai.api_server --model=/m --tensor-parallel-size=4",
     EngineLoad("vllm", "/m", tensor_parallel=4)),
    ("python -m sglang.launch_server --model-path /m --tp 4 --context-length 131072 --mem-fraction-static 0.8",
     EngineLoad("sglang", "/m", tensor_parallel=4, ctx=131072, fraction=0.8)),
    ("docker run --gpus all vllm/vllm-openai --model org/m", EngineLoad("vllm", "org/m")),
])
def test_vllm_and_sglang_flags(argv, expected):
    assert engine_load(argv.split()) == expected


def test_vllm_and_sglang_flag_faults():
    with pytest.raises(FlagError, match="no model"):
        engine_load("vllm serve --port 8000".split())
    with pytest.raises(FlagError, match="kv-cache-dtype 'int3'"):
        engine_load("vllm serve m --kv-cache-dtype int3".split())


def test_a_hugging_face_folder_and_the_local_cache(tmp_path, monkeypatch):
    facts_ = read_hf(hf_model(tmp_path / "qwen3"))
    # 36 layers x 8 KV heads x 128 x (K + V) x 2 bytes: the 144 KiB per token Qwen3-8B is known for.
    assert hf_rank_need(facts_, 1024).kv_bytes_per_token == 147456
    # The Hugging Face cache's layout (models--ORG--NAME/snapshots/REV, refs/main naming REV),
    # read by huggingface_hub itself: a repo id resolves to its snapshot, nothing is fetched.
    cache = tmp_path / "hub"
    snapshot = hf_model(cache / "models--Qwen--Qwen3-8B" / "snapshots" / ("a" * 40))
    (cache / "models--Qwen--Qwen3-8B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3-8B" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert hf_folder("Qwen/Qwen3-8B") == snapshot
    with pytest.raises(ModelFactsError, match="not in the local Hugging Face cache"):
        hf_folder("Qwen/Absent")
    with pytest.raises(ModelFactsError, match="no config.json"):
        read_hf(tmp_path)


def test_swaplab_fit_on_a_vllm_entry(tmp_path):
    folder = hf_model(tmp_path / "qwen3")
    config = tmp_path / "config.yaml"
    config.write_text(f"models:\n  q:\n    cmd: vllm serve {folder} --served-model-name q --max-model-len 40960 "
                      "--gpu-memory-utilization 0.6 --port ${PORT}\n")
    shown = run_swaplab("fit", "q", "--config", str(config), "--devices", "24GiB", "--json")
    document = json.loads(shown.stdout)
    assert shown.returncode == 1 and not document["fits"]  # 0.6 x 24 GiB is short of 15.26 + 5.62 + 2 GiB
    assert document["per_rank"]["kv"] == 147456 * 40960 and document["takes"] == [math.ceil(24 * GIB * 0.6)]
    assert run_swaplab("fit", "q", "--config", str(config), "--devices", "48GiB").returncode == 0
    folder_view = run_swaplab("fit", str(folder), "--tensor-parallel", "2", "--ctx", "32768")
    assert folder_view.returncode == 0 and "per rank of 2: weights 7.63 GiB, KV at 32768 tokens 2.25 GiB" in folder_view.stdout


def test_override_tensor_and_n_cpu_moe_keep_experts_on_the_cpu():
    experts = tuple(TensorInfo(f"blk.{i}.ffn_up_exps.weight", "F16", 10_000, 0, (256, 64, 8)) for i in range(4))
    dense = tuple(TensorInfo(f"blk.{i}.attn_q.weight", "F16", 1_000, 0, (256, 256)) for i in range(4))
    moe = facts(tensors=experts + dense, n_expert=8, n_expert_used=2, n_ff_expert=64)
    everything = estimate(moe, LoadSettings(ctx=4096), gpus=[8 * GIB])
    assert everything.device("GPU0").weights >= 44_000
    load = llama_load("llama-server -m m.gguf -ot exps=CPU -ot attn_q=CUDA0".split())
    assert load.settings.override_tensor == (("exps", "CPU"), ("attn_q", "CUDA0"))
    moved = estimate(moe, load.settings, gpus=[8 * GIB])
    assert moved.device("GPU0").weights < everything.device("GPU0").weights - 39_000
    first_two = estimate(moe, llama_load("llama-server -m m.gguf --n-cpu-moe 2".split()).settings, gpus=[8 * GIB])
    assert everything.device("GPU0").weights - first_two.device("GPU0").weights >= 2 * 10_000
    with pytest.raises(FlagError, match="PATTERN=BUFFER"):
        llama_load("llama-server -m m.gguf -ot exps".split())
    with pytest.raises(FlagError, match="not a regular expression"):
        llama_load("llama-server -m m.gguf -ot [=CPU".split())
