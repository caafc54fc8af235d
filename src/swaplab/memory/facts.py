"""A model's facts that size its memory: layers, heads, head dims, attention kinds, tensors.

One shape for every source, so the estimator is one pure function: `read_gguf` reads a
GGUF header (walked within bounds by `memory.ggufheader`) with llama.cpp's defaults and
types, `read_hf` a Hugging Face model folder's `config.json` and safetensors index. Both
raise `ModelFactsError` with the file and what is missing or wrong, whatever the file holds;
neither loads a weight.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swaplab.errors import SwaplabError
from swaplab.memory.ggufheader import HeaderFault, TensorInfo, read_header

# Layers of these architectures alternate sliding-window and global attention with a
# period llama.cpp's model code sets rather than reads (`set_swa_pattern(n)`: the last
# layer of each period is the global one). A file's own per-layer
# `attention.sliding_window_pattern` array wins.
SWA_PERIODS: dict[str, int] = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "exaone4": 4, "gpt-oss": 2, "llama4": 4}


class ModelFactsError(SwaplabError):
    """A model file or folder that does not say what its memory needs."""


@dataclass(frozen=True)
class Recurrent:
    """The fixed per-sequence state of a recurrent (SSM / linear attention) layer, in elements."""

    conv_elements: int
    """The rolling convolution state ("r" in llama.cpp)."""
    state_elements: int
    """The recurrent state proper ("s")."""


@dataclass(frozen=True)
class ModelFacts:
    source: str
    """The file or folder read, for messages."""
    architecture: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_head: tuple[int, ...]
    """Query heads per layer."""
    n_head_kv: tuple[int, ...]
    """KV heads per layer; 0 on a layer with no attention (a recurrent layer)."""
    head_dim_k: int
    head_dim_v: int
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    """True where a layer attends only within `sliding_window` tokens."""
    kv_lora_rank: int = 0
    """MLA: the rank of the compressed KV latent each token keeps (0: not MLA)."""
    rope_dim: int = 0
    """MLA: the rotary part of the key kept beside the latent."""
    recurrent: Recurrent | None = None
    recurrent_layers: tuple[bool, ...] = ()
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff: int = 0
    """The dense feed-forward width (the widest layer's, where it varies)."""
    n_ff_expert: int = 0
    """One expert's feed-forward width (MoE)."""
    n_expert_shared: int = 0
    n_leading_dense: int = 0
    """MoE models whose first layers are dense (DeepSeek's leading_dense_block_count)."""
    head_dim_k_mla: int = 0
    """MLA: each query head's key width (nope + rope) before absorption."""
    tensors: tuple[TensorInfo, ...] = ()
    weights_bytes: int = 0
    """All weights; the tensors' sum where they are listed (a GGUF file)."""
    weights_dtype: str = ""
    """A Hugging Face folder's `torch_dtype`, for the message; GGUF tensors carry their own."""

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_swa(self, layer: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[layer]

    def is_recurrent(self, layer: int) -> bool:
        return bool(self.recurrent_layers) and self.recurrent_layers[layer]


def read_gguf(path: str | Path) -> ModelFacts:
    """The facts in a GGUF file's header (its metadata and tensor table; no weight is read)."""
    metadata, n_tokens, tensors = read_gguf_header(path)
    return facts_from_gguf_metadata(metadata, tensors, source=str(path), n_tokens=n_tokens)


def read_gguf_header(path: str | Path) -> tuple[dict[str, Any], int, list[TensorInfo]]:
    """A GGUF file's metadata (the tokenizer's long arrays left out), its vocabulary size and its tensors."""
    path = Path(path)
    try:
        # Not blocking on a FIFO a model path may name; fstat then says it is no file.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ModelFactsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ModelFactsError(f"{path}: a folder, not a GGUF file") from None
    except OSError as error:
        raise ModelFactsError(f"{path}: cannot read it ({error.strerror or error})") from None
    try:
        with open(descriptor, "rb") as file:
            status = os.fstat(descriptor)
            if stat.S_ISDIR(status.st_mode):
                raise ModelFactsError(f"{path}: a folder, not a GGUF file")
            if not stat.S_ISREG(status.st_mode):
                raise ModelFactsError(f"{path}: not a regular file (a GGUF model is one)")
            return read_header(file, status.st_size)
    except HeaderFault as fault:
        raise ModelFactsError(f"{path}: {fault}") from None
    except OSError as error:
        raise ModelFactsError(f"{path}: cannot read it ({error.strerror or error})") from None


# llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS (src/llama-hparams.h): load_hparams
# asserts block_count in 1..512 and expert_count at most 1024, so a file past them never loads.
MAX_LAYERS = 512
MAX_EXPERTS = 1024


def facts_from_gguf_metadata(
    metadata: Mapping[str, Any], tensors: Sequence[TensorInfo], source: str = "<gguf>", n_tokens: int = 0
) -> ModelFacts:
    """ModelFacts from a GGUF file's key/value pairs (as `gguf` reads them) and tensor table.

    Keys llama.cpp reads as uint32 must be whole numbers below 2^32 (a per-layer key: one, or
    an array of one per layer); absent ones take llama.cpp's defaults (llama-model.cpp
    load_hparams): `attention.head_count_kv` the head count, the head sizes n_embd / the
    first layer's head count, the rest 0."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFactsError(f"{source}: no general.architecture in its metadata")

    def whole(key: str, default: int = 0, required: bool = False) -> int:
        value = metadata.get(f"{arch}.{key}")
        if value is None and required:
            raise ModelFactsError(f"{source}: no {arch}.{key} in its metadata")
        return default if value is None else _whole(value, source, f"{arch}.{key}")

    def per_layer(key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = metadata.get(f"{arch}.{key}")
        if not isinstance(value, list):
            return (whole(key),) * n_layer if value is not None else default
        if len(value) != n_layer:
            raise ModelFactsError(f"{source}: {arch}.{key} has {len(value)} entries for {n_layer} layers")
        return tuple(_whole(item, source, f"{arch}.{key}") for item in value)

    n_layer = whole("block_count", required=True)
    if not 0 < n_layer <= MAX_LAYERS:
        raise ModelFactsError(f"{source}: {arch}.block_count is {n_layer}; llama.cpp loads 1 to {MAX_LAYERS} layers")
    n_embd = whole("embedding_length", required=True)
    n_head = per_layer("attention.head_count", (0,) * n_layer)
    n_head_kv = per_layer("attention.head_count_kv", n_head)
    head_dim_k = whole("attention.key_length", n_embd // n_head[0] if n_head[0] else 0)
    head_dim_v = whole("attention.value_length", n_embd // n_head[0] if n_head[0] else 0)
    n_vocab = whole("vocab_size") or n_tokens or _rows_of(tensors, "token_embd.weight")
    if not n_vocab:
        raise ModelFactsError(f"{source}: no vocabulary size (no {arch}.vocab_size, tokens or token_embd tensor)")
    n_expert = whole("expert_count")
    if n_expert > MAX_EXPERTS:
        raise ModelFactsError(f"{source}: {arch}.expert_count is {n_expert}; llama.cpp loads at most {MAX_EXPERTS}")

    window = whole("attention.sliding_window")
    swa_layers: tuple[bool, ...] = ()
    pattern = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if window and isinstance(pattern, list) and len(pattern) == n_layer:
        swa_layers = tuple(bool(p) for p in pattern)
    elif window:
        period = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) else SWA_PERIODS.get(arch, 0)
        # llama.cpp: a period of 0 makes every layer sliding-window.
        swa_layers = tuple(period == 0 or (layer + 1) % period != 0 for layer in range(n_layer))

    # llama.cpp keeps MLA's latent cache only where the converter wrote the _mla head
    # sizes; an older DeepSeek GGUF without them gets a full multi-head cache.
    mla = metadata.get(f"{arch}.attention.key_length_mla") is not None and \
        metadata.get(f"{arch}.attention.value_length_mla") is not None
    kv_lora_rank = whole("attention.kv_lora_rank") if mla else 0
    rope_dim = whole("rope.dimension_count") if kv_lora_rank else 0

    recurrent = None
    recurrent_layers: tuple[bool, ...] = ()
    d_inner = whole("ssm.inner_size")
    if d_inner:
        d_conv = whole("ssm.conv_kernel")
        d_state = whole("ssm.state_size")
        n_group = whole("ssm.group_count")
        # llama.cpp's n_embd_r / n_embd_s for Mamba 2 (groups) and Mamba 1.
        conv = (d_conv - 1) * (d_inner + 2 * n_group * d_state) if d_conv else 0
        recurrent = Recurrent(conv, d_state * d_inner)
        interval = whole("full_attention_interval")
        if interval:  # Qwen3-Next: one attention layer in each `interval`, linear attention between
            recurrent_layers = tuple((layer + 1) % interval != 0 for layer in range(n_layer))
        elif any(n_head_kv):  # Jamba, Granite hybrids: the layers without KV heads
            recurrent_layers = tuple(kv == 0 for kv in n_head_kv)
        else:  # Mamba: every layer
            recurrent_layers = (True,) * n_layer
    shortconv = whole("shortconv.l_cache")
    if shortconv and recurrent is None:  # LFM2: conv layers keep (L - 1) x n_embd
        recurrent = Recurrent((shortconv - 1) * n_embd, 0)
        recurrent_layers = tuple(kv == 0 for kv in n_head_kv)

    weights = sum(t.n_bytes for t in tensors)
    return ModelFacts(
        source=source,
        architecture=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_ctx_train=whole("context_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        sliding_window=window,
        swa_layers=swa_layers,
        kv_lora_rank=kv_lora_rank,
        rope_dim=rope_dim,
        recurrent=recurrent,
        recurrent_layers=recurrent_layers,
        n_expert=n_expert,
        n_expert_used=max(per_layer("expert_used_count", (0,))),  # llama.cpp's n_expert_used_max
        n_ff=max(per_layer("feed_forward_length", (0,))),  # the widest layer's
        n_ff_expert=whole("expert_feed_forward_length"),
        n_expert_shared=whole("expert_shared_count"),
        n_leading_dense=whole("leading_dense_block_count"),
        head_dim_k_mla=whole("attention.key_length_mla") if kv_lora_rank else 0,
        tensors=tuple(tensors),
        weights_bytes=weights,
    )


def _whole(value: Any, source: str, key: str) -> int:
    """A key llama.cpp reads as a uint32: a whole number below 2^32, or the file is refused."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32:
        return value
    shown = f"an array of {len(value)} items" if isinstance(value, list) else repr(value)[:60]
    raise ModelFactsError(f"{source}: {key} is {shown}, not a whole number below 2^32 as llama.cpp reads it")


def _rows_of(tensors: Sequence[TensorInfo], name: str) -> int:
    for tensor in tensors:
        if tensor.name == name and len(tensor.shape) >= 2:
            return tensor.shape[1]
    return 0


# -- Hugging Face folders (vLLM, SGLang) ----------------------------------------------

MAX_HF_LAYERS = 4096
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1, "int8": 1}


def read_hf(folder: str | Path) -> ModelFacts:
    """The facts in a Hugging Face model folder: `config.json` and the weights' total size."""
    folder = Path(folder)
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ModelFactsError(f"{folder}: no config.json (not a Hugging Face model folder)") from None
    except (OSError, ValueError) as error:
        raise ModelFactsError(f"{config_path}: not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise ModelFactsError(f"{config_path}: not a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict):  # multimodal wrappers keep the language model's numbers here
        config = {**config, **text}
    return facts_from_hf_config(config, _safetensors_bytes(folder), source=str(folder))


def facts_from_hf_config(config: Mapping[str, Any], weights_bytes: int, source: str = "<config.json>") -> ModelFacts:
    """ModelFacts from a `config.json` mapping and the weights' size in bytes."""
    try:
        return _facts_from_hf_config(config, weights_bytes, source)
    except (TypeError, ValueError, ArithmeticError) as error:  # a number that is a list, a string, a zero
        raise ModelFactsError(f"{source}: config.json has a value swaplab cannot read as a model's ({error})") from None


def _facts_from_hf_config(config: Mapping[str, Any], weights_bytes: int, source: str) -> ModelFacts:
    def need(key: str) -> Any:
        value = config.get(key)
        if value is None:
            raise ModelFactsError(f"{source}: config.json has no {key}")
        return value

    n_layer = int(need("num_hidden_layers"))
    if not 0 < n_layer <= MAX_HF_LAYERS:  # per-layer tuples follow: a hostile count would be their size
        raise ModelFactsError(f"{source}: config.json's num_hidden_layers is {n_layer} (1 to {MAX_HF_LAYERS} read)")
    n_embd = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or n_embd // heads)
    window = int(config.get("sliding_window") or 0)
    layer_types = config.get("layer_types")
    swa_layers: tuple[bool, ...] = ()
    if window and isinstance(layer_types, list) and len(layer_types) == n_layer:
        swa_layers = tuple(kind == "sliding_attention" for kind in layer_types)
        if not any(swa_layers):
            window = 0
    elif window and not config.get("use_sliding_window", True):
        window = 0
    elif window:
        swa_layers = (True,) * n_layer
    kv_lora_rank = int(config.get("kv_lora_rank") or 0)
    rope_dim = int(config.get("qk_rope_head_dim") or 0) if kv_lora_rank else 0
    attention = hf_attention_layers(config, n_layer)
    return ModelFacts(
        source=source,
        architecture=str((config.get("architectures") or [config.get("model_type", "?")])[0]),
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=int(config.get("vocab_size") or 0),
        n_ctx_train=int(config.get("max_position_embeddings") or 0),
        n_head=(heads,) * n_layer,
        n_head_kv=tuple(kv_heads if attends else 0 for attends in attention),
        recurrent_layers=tuple(not attends for attends in attention) if not all(attention) else (),
        head_dim_k=head_dim if not kv_lora_rank else int(config.get("qk_nope_head_dim", 0)) + rope_dim,
        head_dim_v=int(config.get("v_head_dim") or head_dim),
        sliding_window=window,
        swa_layers=swa_layers,
        kv_lora_rank=kv_lora_rank,
        rope_dim=rope_dim,
        n_expert=int(config.get("num_local_experts") or config.get("n_routed_experts") or config.get("num_experts") or 0),
        n_expert_used=int(config.get("num_experts_per_tok") or 0),
        n_ff=int(config.get("intermediate_size") or 0),
        weights_bytes=weights_bytes,
        weights_dtype=str(config.get("torch_dtype") or config.get("dtype") or ""),
    )


def hf_attention_layers(config: Mapping[str, Any], n_layer: int) -> tuple[bool, ...]:
    """Which layers of a Hugging Face config keep a KV cache: all but the linear-attention,
    Mamba, convolution and MLP-only layers of a hybrid, in each family's own spelling
    (`layer_types`, `layers_block_type`, Nemotron-H's `hybrid_override_pattern`, Jamba's
    `attn_layer_period`/`attn_layer_offset`, Qwen3-Next's `full_attention_interval`)."""
    kinds = config.get("layer_types") or config.get("layers_block_type")
    if isinstance(kinds, list) and len(kinds) == n_layer:
        # "full_attention", "sliding_attention", "attention" keep KV; "linear_attention", "mamba", "conv" do not.
        return tuple(isinstance(kind, str) and "attention" in kind and "linear" not in kind for kind in kinds)
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == n_layer:
        return tuple(symbol == "*" for symbol in pattern)  # M: Mamba, -: MLP, E: MoE, *: attention
    period = config.get("attn_layer_period")
    if isinstance(period, int) and period > 0:
        offset = int(config.get("attn_layer_offset") or 0)
        return tuple(layer % period == offset for layer in range(n_layer))
    interval = config.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return tuple((layer + 1) % interval == 0 for layer in range(n_layer))
    return (True,) * n_layer


def _safetensors_bytes(folder: Path) -> int:
    """The weights' size: the index's total_size where there is one, else the files' sizes."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        except (OSError, ValueError, AttributeError):
            total = None
        if isinstance(total, int | float) and total > 0:
            return int(total)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFactsError(f"{folder}: no *.safetensors weights beside config.json")
    return sum(file.stat().st_size for file in files)


def hf_folder(model: str) -> Path:
    """A Hugging Face model as a local folder: `model` itself, or its snapshot in the local
    Hugging Face cache (never downloaded here: placement reads only what is on disk)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise ModelFactsError(
            f"{model}: not a folder, and finding it in the Hugging Face cache needs huggingface_hub "
            "(pip install 'swaplab[launch]')"
        ) from None
    try:
        return Path(snapshot_download(model, local_files_only=True, allow_patterns=["config.json", "*.json"]))
    except (LocalEntryNotFoundError, ValueError, OSError) as error:
        raise ModelFactsError(f"{model}: not in the local Hugging Face cache ({type(error).__name__})") from None
