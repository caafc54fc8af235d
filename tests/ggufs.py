"""Tiny synthetic GGUF models that the llama.cpp in the `xllamacpp` wheel loads.

Tests compare swaplab's memory estimator with the buffer sizes llama.cpp itself reports
when it loads a model ("model buffer size", "KV buffer size", "llama_kv_cache: size =",
"compute buffer size", ...). Real models are gigabytes and we have none for most
architecture families, so this module writes small stand-ins (a few MB) with
`gguf.GGUFWriter`: the real architecture's metadata keys, exactly as llama.cpp's loader
(src/llama-model.cpp) reads them, and every tensor that loader requires, at tiny
dimensions. The weights are seeded random numbers: nothing is ever generated from these
files, they only have to load, and the same call writes the same bytes every time.

Every family has a builder ``build_<family>(path) -> path``; `BUILDERS` maps the family
name to it. All of them go through `write_gguf`, which adds a small byte-level BPE
("gpt2") vocabulary and writes 1-D tensors as F32 and the others as F16. No quantized
types: the CPU backend repacks some of them (Q4_0 on AVX2, for one) into an extra
"CPU_REPACK" buffer, which would make the model buffer depend on the host's CPU.

Run ``python tests/ggufs.py`` to build every family into a temporary folder, load each
with ``python -m swaplab.builtin.llamacpp`` and print the buffer lines llama.cpp logs.
"""

from __future__ import annotations

import hashlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.constants import (
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    MODEL_TENSOR,
    MODEL_TENSORS,
    TENSOR_NAMES,
)

K = gguf.Keys
T = MODEL_TENSOR

SEED = 1234
N_VOCAB = 1024
CONTEXT_LENGTH = 8192
RMS_EPS = 1e-6

# A tensor to write: (name, shape in ggml order: ne[0] is the contiguous dimension,
# the order llama-model.cpp's create_tensor calls use). numpy's shape is the reverse.
TensorSpec = tuple[str, tuple[int, ...]]


# Tensors that stay F32 as convert_hf_to_gguf.py keeps them: the CPU backend's
# ssm_conv asserts F32 convolution weights.
F32_TENSORS = frozenset(TENSOR_NAMES[t] for t in (T.SHORTCONV_CONV, T.SSM_CONV1D))


# ---------------------------------------------------------------------------------------
# The generic writer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies hold)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


SPECIAL_TOKENS = ("<|bos|>", "<|endoftext|>", "<|pad|>")


def gpt2_vocab(n_vocab: int = N_VOCAB) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of a valid byte-level BPE vocabulary of `n_vocab`.

    The 256 byte tokens first (so every text tokenizes), then merged tokens built from
    earlier ones, then the special tokens (bos, eos, pad) as the last ids.
    """
    byte_tokens = list(_bytes_to_unicode().values())
    n_merged = n_vocab - len(byte_tokens) - len(SPECIAL_TOKENS)
    if n_merged < 0:
        raise ValueError(f"n_vocab must be at least {len(byte_tokens) + len(SPECIAL_TOKENS)}")
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    space = _bytes_to_unicode()[ord(" ")]

    def pairs() -> Iterable[tuple[str, str]]:
        yield from ((space, c) for c in letters)
        yield from ((a, b) for a in letters for b in letters)
        yield from ((space + a, b) for a in letters for b in letters)
        yield from ((a + b, c) for a in letters for b in letters for c in letters)

    merges: list[str] = []
    merged: list[str] = []
    for left, right in pairs():
        if len(merges) == n_merged:
            break
        merges.append(f"{left} {right}")
        merged.append(left + right)
    if len(merges) < n_merged:
        raise ValueError(f"n_vocab {n_vocab} is larger than this vocabulary generator supports")
    tokens = [*byte_tokens, *merged, *SPECIAL_TOKENS]
    types = [gguf.TokenType.NORMAL] * (len(byte_tokens) + len(merged)) + [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
    return tokens, [int(t) for t in types], merges


def _add_value(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    """Write one metadata value with the type llama.cpp's loader expects for it."""
    V = gguf.GGUFValueType
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, Sequence) and value and all(isinstance(v, bool) for v in value):
        writer.add_key_value(key, list(value), V.ARRAY, sub_type=V.BOOL)
    elif isinstance(value, Sequence) and value and all(isinstance(v, int) for v in value):
        writer.add_key_value(key, list(value), V.ARRAY, sub_type=V.UINT32)
    elif isinstance(value, Sequence) and value and all(isinstance(v, float) for v in value):
        writer.add_key_value(key, list(value), V.ARRAY, sub_type=V.FLOAT32)
    else:
        raise TypeError(f"{key}: unsupported metadata value {value!r}")


def write_gguf(
    path: Path,
    arch: MODEL_ARCH,
    hparams: Mapping[str, Any],
    tensors: Iterable[TensorSpec],
    *,
    n_vocab: int = N_VOCAB,
    seed: int = SEED,
) -> Path:
    """Write a GGUF of architecture `arch` to `path` and return `path`.

    `hparams` maps `gguf.Keys` templates (``"{arch}.block_count"``, ...) to values: an int
    is written as UINT32, a float as FLOAT32, a list of ints as a UINT32 array (a per-layer
    value). A tokenizer of `n_vocab` tokens is added; `tensors` lists (name, ggml shape),
    and each name must be one of the architecture's tensors in `gguf.MODEL_TENSORS`.
    1-D tensors (norms) are F32 ones; larger ones F16 (F32 for `F32_TENSORS`) random
    normals with standard deviation 0.02.
    """
    arch_name = MODEL_ARCH_NAMES[arch]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    allowed = {TENSOR_NAMES[t] for t in MODEL_TENSORS[arch]}
    rng = np.random.default_rng(seed)

    writer = gguf.GGUFWriter(path, arch_name)
    writer.add_name(f"swaplab tiny {arch_name}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for template, value in hparams.items():
        _add_value(writer, template.format(arch=arch_name), value)

    tokens, types, merges = gpt2_vocab(n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|bos|>"))
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index("<|pad|>"))
    writer.add_add_bos_token(False)

    for name, ne in tensors:
        base = name.rsplit(".", 1)[0]
        generic = ".".join("{bid}" if part.isdigit() else part for part in base.split("."))
        if generic not in allowed:
            raise ValueError(f"{arch_name} has no tensor {name!r} in gguf.MODEL_TENSORS")
        shape = tuple(reversed(ne))
        if len(ne) == 1:
            data = np.ones(shape, dtype=np.float32)
        elif generic in F32_TENSORS:
            data = rng.standard_normal(shape, dtype=np.float32) * 0.02
        else:
            data = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        writer.add_tensor(name, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------------------------------
# Tensor groups shared by the families


def _tn(tensor: MODEL_TENSOR, layer: int | None = None, suffix: str = "weight") -> str:
    name = TENSOR_NAMES[tensor]
    return f"{name.format(bid=layer) if layer is not None else name}.{suffix}"


def _embeddings(n_embd: int, n_vocab: int, *, tied: bool) -> list[TensorSpec]:
    """token_embd, output_norm and (unless the output is tied to token_embd) output."""
    specs = [(_tn(T.TOKEN_EMBD), (n_embd, n_vocab)), (_tn(T.OUTPUT_NORM), (n_embd,))]
    if not tied:
        specs.append((_tn(T.OUTPUT), (n_embd, n_vocab)))
    return specs


def _attention(
    il: int, n_embd: int, n_head: int, n_head_kv: int, head_k: int, head_v: int, *, qk_norm: bool = False
) -> list[TensorSpec]:
    """Pre-norm and q/k/v/o projections of a (grouped-query) attention layer."""
    specs = [
        (_tn(T.ATTN_NORM, il), (n_embd,)),
        (_tn(T.ATTN_Q, il), (n_embd, n_head * head_k)),
        (_tn(T.ATTN_K, il), (n_embd, n_head_kv * head_k)),
        (_tn(T.ATTN_V, il), (n_embd, n_head_kv * head_v)),
        (_tn(T.ATTN_OUT, il), (n_head * head_v, n_embd)),
    ]
    if qk_norm:
        specs += [(_tn(T.ATTN_Q_NORM, il), (head_k,)), (_tn(T.ATTN_K_NORM, il), (head_k,))]
    return specs


def _ffn(il: int, n_embd: int, n_ff: int) -> list[TensorSpec]:
    """Pre-norm and a SwiGLU feed-forward (gate, up, down)."""
    return [
        (_tn(T.FFN_NORM, il), (n_embd,)),
        (_tn(T.FFN_GATE, il), (n_embd, n_ff)),
        (_tn(T.FFN_UP, il), (n_embd, n_ff)),
        (_tn(T.FFN_DOWN, il), (n_ff, n_embd)),
    ]


def _moe(il: int, n_embd: int, n_ff_exp: int, n_expert: int, n_shared: int = 0) -> list[TensorSpec]:
    """Pre-norm, router and stacked experts; `n_shared` shared experts as one wider FFN."""
    specs = [
        (_tn(T.FFN_NORM, il), (n_embd,)),
        (_tn(T.FFN_GATE_INP, il), (n_embd, n_expert)),
        (_tn(T.FFN_GATE_EXP, il), (n_embd, n_ff_exp, n_expert)),
        (_tn(T.FFN_UP_EXP, il), (n_embd, n_ff_exp, n_expert)),
        (_tn(T.FFN_DOWN_EXP, il), (n_ff_exp, n_embd, n_expert)),
    ]
    if n_shared:
        n_ff_sh = n_ff_exp * n_shared
        specs += [
            (_tn(T.FFN_GATE_SHEXP, il), (n_embd, n_ff_sh)),
            (_tn(T.FFN_UP_SHEXP, il), (n_embd, n_ff_sh)),
            (_tn(T.FFN_DOWN_SHEXP, il), (n_ff_sh, n_embd)),
        ]
    return specs


def _base_hparams(
    n_layer: int, n_embd: int, n_ff: int | list[int], n_head: int, n_head_kv: int | list[int]
) -> dict[str, Any]:
    """The keys every family here has; a list value is per layer."""
    return {
        K.LLM.CONTEXT_LENGTH: CONTEXT_LENGTH,
        K.LLM.EMBEDDING_LENGTH: n_embd,
        K.LLM.BLOCK_COUNT: n_layer,
        K.LLM.FEED_FORWARD_LENGTH: n_ff,
        K.Attention.HEAD_COUNT: n_head,
        K.Attention.HEAD_COUNT_KV: n_head_kv,
        K.Attention.LAYERNORM_RMS_EPS: RMS_EPS,
        K.Rope.FREQ_BASE: 10000.0,
    }


def _gqa_model(
    path: Path,
    arch: MODEL_ARCH,
    *,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    head_dim: int | None = None,
    qk_norm: bool = False,
    tied: bool = False,
    extra_hparams: Mapping[str, Any] | None = None,
    layer_extra: Callable[[int], list[TensorSpec]] | None = None,
    moe: tuple[int, int, int] | None = None,
) -> Path:
    """A decoder of identical GQA layers: llama, qwen2/3, gemma3, qwen3moe.

    `head_dim` (written as key_length/value_length) defaults to n_embd / n_head;
    `moe` = (n_expert, n_expert_used, n_ff_exp) swaps each dense FFN for experts.
    """
    hd = head_dim or n_embd // n_head
    hparams = _base_hparams(n_layer, n_embd, n_ff, n_head, n_head_kv)
    hparams[K.Rope.DIMENSION_COUNT] = hd
    if head_dim is not None:
        hparams[K.Attention.KEY_LENGTH] = head_dim
        hparams[K.Attention.VALUE_LENGTH] = head_dim
    if moe is not None:
        n_expert, n_used, n_ff_exp = moe
        hparams[K.LLM.EXPERT_COUNT] = n_expert
        hparams[K.LLM.EXPERT_USED_COUNT] = n_used
        hparams[K.LLM.EXPERT_FEED_FORWARD_LENGTH] = n_ff_exp
    hparams.update(extra_hparams or {})
    tensors = _embeddings(n_embd, N_VOCAB, tied=tied)
    for il in range(n_layer):
        tensors += _attention(il, n_embd, n_head, n_head_kv, hd, hd, qk_norm=qk_norm)
        tensors += _moe(il, n_embd, moe[2], moe[0]) if moe else _ffn(il, n_embd, n_ff)
        if layer_extra:
            tensors += layer_extra(il)
    return write_gguf(path, arch, hparams, tensors)


# ---------------------------------------------------------------------------------------
# The families


def build_llama(path: Path) -> Path:
    """llama with GQA: 4 layers, n_embd 256, 8 heads of 32, 2 KV heads, n_ff 256, output tied."""
    return _gqa_model(path, MODEL_ARCH.LLAMA, n_layer=4, n_embd=256, n_head=8, n_head_kv=2, n_ff=256, tied=True)


def build_qwen3(path: Path) -> Path:
    """qwen3: 4 layers, n_embd 128, 4 heads, 2 KV heads, q/k RMS norms, n_ff 256, output tied.

    head_dim 64 (key_length/value_length) isn't n_embd / n_head (32), as in Qwen3-0.6B.
    """
    return _gqa_model(
        path, MODEL_ARCH.QWEN3, n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256,
        head_dim=64, qk_norm=True, tied=True,
    )


def build_qwen3moe(path: Path) -> Path:
    """qwen3moe: qwen3's attention; every FFN is 8 experts (2 used) of expert_feed_forward_length 32."""
    return _gqa_model(
        path, MODEL_ARCH.QWEN3MOE, n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256,
        head_dim=64, qk_norm=True, tied=True, moe=(8, 2, 32),
    )


GEMMA3_SLIDING_WINDOW = 512


def build_gemma3(path: Path) -> Path:
    """gemma3: 12 layers, sliding window 512 on all but every 6th layer (5 and 11 are global).

    n_embd 64, 4 heads and 1 KV head like gemma-3-1b, head_dim 64 via key_length and
    value_length (n_embd / n_head would be 16), n_ff 128, extra post-attention and post-FFN
    norms, output tied.
    """
    n_embd = 64

    def post_norms(il: int) -> list[TensorSpec]:
        return [(_tn(T.ATTN_POST_NORM, il), (n_embd,)), (_tn(T.FFN_POST_NORM, il), (n_embd,))]

    return _gqa_model(
        path, MODEL_ARCH.GEMMA3, n_layer=12, n_embd=n_embd, n_head=4, n_head_kv=1, n_ff=128,
        head_dim=64, qk_norm=True, tied=True, layer_extra=post_norms,
        extra_hparams={K.Attention.SLIDING_WINDOW: GEMMA3_SLIDING_WINDOW, K.Rope.FREQ_BASE: 1000000.0},
    )


def build_deepseek2(path: Path) -> Path:
    """deepseek2 with MLA in the layout llama.cpp converts to (both `_mla` keys present).

    3 layers: 1 leading dense layer, then 2 MoE layers of 8 experts (2 used) + 1 shared
    expert (expert_feed_forward_length 32). n_embd 128, 4 heads, q_lora_rank 64,
    kv_lora_rank 64, rope dims 32, qk_nope 32, v_head 32. As stored for MLA:
    head_count_kv 1, key_length = kv_lora_rank + rope = 96, value_length = kv_lora_rank
    = 64, key_length_mla = nope + rope = 64, value_length_mla = 32; tensors attn_kv_a_mqa,
    attn_k_b, attn_v_b. The cache holds K rows of 96 only (V is a view of them). Both
    lengths are multiples of 32 so that quantized caches (-ctk q8_0) accept them.
    """
    n_layer, n_embd, n_head, n_ff = 3, 128, 4, 256
    q_lora, kv_lora, rope, nope, v_head = 64, 64, 32, 32, 32
    n_expert, n_used, n_shared, n_ff_exp, n_dense = 8, 2, 1, 32, 1
    hparams = _base_hparams(n_layer, n_embd, n_ff, n_head, 1)
    hparams.update({
        K.Attention.KEY_LENGTH: kv_lora + rope,
        K.Attention.VALUE_LENGTH: kv_lora,
        K.Attention.KEY_LENGTH_MLA: nope + rope,
        K.Attention.VALUE_LENGTH_MLA: v_head,
        K.Attention.Q_LORA_RANK: q_lora,
        K.Attention.KV_LORA_RANK: kv_lora,
        K.Rope.DIMENSION_COUNT: rope,
        K.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense,
        K.LLM.EXPERT_COUNT: n_expert,
        K.LLM.EXPERT_USED_COUNT: n_used,
        K.LLM.EXPERT_SHARED_COUNT: n_shared,
        K.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        K.LLM.EXPERT_WEIGHTS_SCALE: 1.0,
        K.LLM.EXPERT_WEIGHTS_NORM: False,
        K.LLM.EXPERT_GATING_FUNC: 1,  # softmax
    })
    tensors = _embeddings(n_embd, N_VOCAB, tied=False)
    for il in range(n_layer):
        tensors += [
            (_tn(T.ATTN_NORM, il), (n_embd,)),
            (_tn(T.ATTN_Q_A_NORM, il), (q_lora,)),
            (_tn(T.ATTN_KV_A_NORM, il), (kv_lora,)),
            (_tn(T.ATTN_Q_A, il), (n_embd, q_lora)),
            (_tn(T.ATTN_Q_B, il), (q_lora, n_head * (nope + rope))),
            (_tn(T.ATTN_KV_A_MQA, il), (n_embd, kv_lora + rope)),
            (_tn(T.ATTN_K_B, il), (nope, kv_lora, n_head)),
            (_tn(T.ATTN_V_B, il), (kv_lora, v_head, n_head)),
            (_tn(T.ATTN_OUT, il), (n_head * v_head, n_embd)),
        ]
        tensors += _ffn(il, n_embd, n_ff) if il < n_dense else _moe(il, n_embd, n_ff_exp, n_expert, n_shared)
    return write_gguf(path, MODEL_ARCH.DEEPSEEK2, hparams, tensors)


LFM2_ATTENTION_LAYERS = (2, 5)


def build_lfm2(path: Path) -> Path:
    """lfm2, a hybrid: 6 layers, short-conv (l_cache 3) except attention on layers 2 and 5.

    head_count_kv is a per-layer array, 0 on the conv layers (that is how llama.cpp tells
    them apart); n_embd 128, the attention layers have 4 heads of 32 and 2 KV heads,
    n_ff 192, output tied (no output tensor, as in LFM2-350M).
    """
    n_layer, n_embd, n_head, n_head_kv, n_ff, l_cache = 6, 128, 4, 2, 192, 3
    hd = n_embd // n_head
    kv_arr = [n_head_kv if il in LFM2_ATTENTION_LAYERS else 0 for il in range(n_layer)]
    hparams = _base_hparams(n_layer, n_embd, n_ff, n_head, kv_arr)
    hparams[K.ShortConv.L_CACHE] = l_cache
    tensors: list[TensorSpec] = [(_tn(T.TOKEN_EMBD), (n_embd, N_VOCAB)), (_tn(T.TOKEN_EMBD_NORM), (n_embd,))]
    for il in range(n_layer):
        if il in LFM2_ATTENTION_LAYERS:
            tensors += _attention(il, n_embd, n_head, n_head_kv, hd, hd, qk_norm=True)
        else:
            tensors += [
                (_tn(T.ATTN_NORM, il), (n_embd,)),
                (_tn(T.SHORTCONV_CONV, il), (l_cache, n_embd)),
                (_tn(T.SHORTCONV_INPROJ, il), (n_embd, 3 * n_embd)),
                (_tn(T.SHORTCONV_OUTPROJ, il), (n_embd, n_embd)),
            ]
        tensors += _ffn(il, n_embd, n_ff)
    return write_gguf(path, MODEL_ARCH.LFM2, hparams, tensors)


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "llama": build_llama,
    "qwen3": build_qwen3,
    "deepseek2": build_deepseek2,
    "gemma3": build_gemma3,
    "qwen3moe": build_qwen3moe,
    "lfm2": build_lfm2,
}


# ---------------------------------------------------------------------------------------
# Self-check: build each family and load it with the real llama.cpp server

REPORTED = ("model buffer size", "KV buffer size", "RS buffer size", "llama_kv_cache: size =",
            "compute buffer size", "error", "failed", "missing")


def load_log(model: Path, *extra_args: str, timeout: float = 120.0) -> tuple[bool, str]:
    """Start the llama.cpp server on `model`, stop it once listening; (loaded?, its log).

    Runs ``python -m swaplab.builtin.llamacpp -m MODEL -c 4096 -lv 4 --no-warmup -t 1``
    on a free port, then `extra_args` (llama-server flags; a repeated flag such as -c
    overrides the default). The log is the server's stdout and stderr together.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "swaplab.builtin.llamacpp", "-m", str(model), "--port", str(port),
               "-c", "4096", "-lv", "4", "--no-warmup", "-t", "1", *extra_args]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        loaded = False
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                log.seek(0)
                if "server is listening" in log.read():
                    loaded = True
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        log.seek(0)
        return loaded, log.read()


def _main() -> int:
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for family, build in BUILDERS.items():
            path = build(Path(tmp) / f"{family}.gguf")
            again = build(Path(tmp) / f"{family}-again.gguf")
            same = hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(again.read_bytes()).digest()
            loaded, log = load_log(path)
            failures += not loaded or not same
            print(f"== {family}: {path.stat().st_size / 2**20:.2f} MiB, deterministic={same}, loaded={loaded}")
            for line in log.splitlines():
                if any(marker in line for marker in REPORTED):
                    print("   " + line.strip())
            if not loaded:
                print("\n".join("   | " + line for line in log.splitlines()[-40:]))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(_main())
