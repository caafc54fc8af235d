"""A model's facts that size its memory: layers, heads, head dims, attention kinds, tensors.

One shape for every source, so the estimator is one pure function: `read_gguf` reads a
GGUF header (in the `gguf` package's terms for the format), `read_hf` a Hugging Face
model folder's `config.json` and safetensors index. Both raise `ModelFactsError` with
the file and what is missing; neither loads a weight.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from swaplab.errors import SwaplabError
from swaplab.memory.ggml import constants

# Layers of these architectures alternate sliding-window and global attention with a
# period llama.cpp's model code sets rather than reads (`set_swa_pattern(n)`: the last
# layer of each period is the global one). A file's own per-layer
# `attention.sliding_window_pattern` array wins.
SWA_PERIODS: dict[str, int] = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "exaone4": 4, "gpt-oss": 2, "llama4": 4}
_LAYER = re.compile(r"^blk\.(\d+)\.")


class ModelFactsError(SwaplabError):
    """A model file or folder that does not say what its memory needs."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str
    """ggml's name of its type: "F16", "Q4_K", "Q8_0"..."""
    n_bytes: int
    offset: int = 0
    """Where its data starts in the file (what a memory-mapped load spans)."""
    shape: tuple[int, ...] = ()
    """ggml's order: shape[0] is the row length, shape[1] the number of rows."""

    @property
    def layer(self) -> int | None:
        """The block index of a `blk.N.` tensor; None for the embeddings, output and norms."""
        match = _LAYER.match(self.name)
        return int(match.group(1)) if match else None


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
        with path.open("rb") as file:
            return _read_header(file, str(path))
    except FileNotFoundError:
        raise ModelFactsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ModelFactsError(f"{path}: a folder, not a GGUF file") from None
    except OSError as error:
        raise ModelFactsError(f"{path}: cannot read it ({error.strerror or error})") from None


# gguf's GGUFReader builds a numpy view per element of every array: 8 s for Gemma 3's
# 262,144-token vocabulary on one core, in the path of a model's start. The header walk
# below reads the same format (gguf's constants name its types and block sizes) and
# skips the tokenizer's arrays, keeping their lengths: 0.1 s.
_SCALARS = {  # gguf's GGUFValueType names -> struct formats
    "UINT8": "<B", "INT8": "<b", "UINT16": "<H", "INT16": "<h", "UINT32": "<I", "INT32": "<i",
    "FLOAT32": "<f", "BOOL": "<?", "UINT64": "<Q", "INT64": "<q", "FLOAT64": "<d",
}
_KEEP_ARRAY = 65536  # longer arrays (vocabularies, merges) are skipped, their length kept
_MAX_HEADER_ITEMS = 1 << 24


class _Header:
    def __init__(self, file: BinaryIO, source: str) -> None:
        self.file = file
        self.source = source
        self.types = constants().GGUFValueType

    def read(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            raise ModelFactsError(f"{self.source}: the GGUF header ends early (a truncated or partial file?)")
        return data

    def scalar(self, kind: Any) -> Any:
        fmt = _SCALARS[kind.name]
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        length = self.scalar(self.types.UINT64)
        if length > 1 << 26:
            raise ModelFactsError(f"{self.source}: a header string of {length} bytes (not a GGUF file?)")
        return self.read(length).decode("utf-8", errors="replace")

    def value(self, kind: Any) -> tuple[Any, int]:
        """A value and, for arrays, its length (the value is None for a skipped array)."""
        if kind == self.types.STRING:
            return self.string(), 0
        if kind != self.types.ARRAY:
            return self.scalar(kind), 0
        item = self.types(self.scalar(self.types.UINT32))
        count = self.scalar(self.types.UINT64)
        if count > _MAX_HEADER_ITEMS:
            raise ModelFactsError(f"{self.source}: an array of {count} items in the header (not a GGUF file?)")
        if item.name in _SCALARS and count > _KEEP_ARRAY:
            self.file.seek(struct.calcsize(_SCALARS[item.name]) * count, 1)
            return None, count
        if item == self.types.STRING and count > _KEEP_ARRAY:
            for _ in range(count):
                self.file.seek(self.scalar(self.types.UINT64), 1)
            return None, count
        return [self.value(item)[0] for _ in range(count)], count


def _read_header(file: BinaryIO, source: str) -> tuple[dict[str, Any], int, list[TensorInfo]]:
    header = _Header(file, source)
    ggml = constants()
    types = ggml.GGUFValueType
    try:
        magic, version = struct.unpack("<II", header.read(8))
        if magic != ggml.GGUF_MAGIC:
            raise ModelFactsError(f"{source}: not a GGUF file (it does not start with GGUF)")
        if version not in (2, 3):
            raise ModelFactsError(f"{source}: GGUF version {version} (big-endian or unknown; llama.cpp reads 2 and 3)")
        n_tensors, n_kv = struct.unpack("<QQ", header.read(16))
        if n_tensors > _MAX_HEADER_ITEMS or n_kv > _MAX_HEADER_ITEMS:
            raise ModelFactsError(f"{source}: {n_tensors} tensors and {n_kv} keys (not a GGUF file?)")
        metadata: dict[str, Any] = {}
        n_tokens = 0
        for _ in range(n_kv):
            key = header.string()
            value, count = header.value(types(header.scalar(types.UINT32)))
            if key == "tokenizer.ggml.tokens":
                n_tokens = count
            if value is not None and not key.startswith("tokenizer.ggml.") or key == "tokenizer.ggml.model":
                metadata[key] = value
        raw = []
        for _ in range(n_tensors):
            name = header.string()
            dims = tuple(header.scalar(types.UINT64) for _ in range(header.scalar(types.UINT32)))
            kind = ggml.GGMLQuantizationType(header.scalar(types.UINT32))
            raw.append((name, dims, kind, header.scalar(types.UINT64)))
    except (ValueError, struct.error, KeyError) as error:
        raise ModelFactsError(f"{source}: a GGUF header llama.cpp could not read ({error})") from None
    alignment = int(metadata.get("general.alignment") or ggml.GGUF_DEFAULT_ALIGNMENT)
    start = (file.tell() + alignment - 1) // alignment * alignment
    tensors = []
    for name, dims, kind, offset in raw:
        per_block, block_bytes = ggml.GGML_QUANT_SIZES[kind]
        elements = math.prod(dims)
        tensors.append(TensorInfo(name, kind.name, elements // per_block * block_bytes, start + offset, dims))
    return metadata, n_tokens, tensors


def facts_from_gguf_metadata(
    metadata: Mapping[str, Any], tensors: Sequence[TensorInfo], source: str = "<gguf>", n_tokens: int = 0
) -> ModelFacts:
    """ModelFacts from a GGUF file's key/value pairs (as `gguf` reads them) and tensor table."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFactsError(f"{source}: no general.architecture in its metadata")

    def get(key: str, default: Any = None, required: bool = False) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is None and required:
            raise ModelFactsError(f"{source}: no {arch}.{key} in its metadata")
        return value

    n_layer = int(get("block_count", required=True))
    n_embd = int(get("embedding_length", required=True))
    n_head = _per_layer(get("attention.head_count", 0), n_layer, source, "attention.head_count")
    n_head_kv = _per_layer(get("attention.head_count_kv", None) or n_head, n_layer, source, "attention.head_count_kv")
    max_head = max(n_head) if n_head else 0
    head_dim_k = int(get("attention.key_length", 0) or (n_embd // max_head if max_head else 0))
    head_dim_v = int(get("attention.value_length", 0) or (n_embd // max_head if max_head else 0))
    n_vocab = int(get("vocab_size", 0) or n_tokens or _rows_of(tensors, "token_embd.weight"))
    if not n_vocab:
        raise ModelFactsError(f"{source}: no vocabulary size (no {arch}.vocab_size, tokens or token_embd tensor)")

    window = int(get("attention.sliding_window", 0) or 0)
    swa_layers: tuple[bool, ...] = ()
    pattern = get("attention.sliding_window_pattern")
    if window and isinstance(pattern, list) and len(pattern) == n_layer:
        swa_layers = tuple(bool(p) for p in pattern)
    elif window:
        period = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) else SWA_PERIODS.get(arch, 0)
        # llama.cpp: a period of 0 makes every layer sliding-window.
        swa_layers = tuple(period == 0 or (layer + 1) % period != 0 for layer in range(n_layer))

    # llama.cpp keeps MLA's latent cache only where the converter wrote the _mla head
    # sizes; an older DeepSeek GGUF without them gets a full multi-head cache.
    mla = get("attention.key_length_mla") is not None and get("attention.value_length_mla") is not None
    kv_lora_rank = int(get("attention.kv_lora_rank", 0) or 0) if mla else 0
    rope_dim = int(get("rope.dimension_count", 0) or 0) if kv_lora_rank else 0

    recurrent = None
    recurrent_layers: tuple[bool, ...] = ()
    d_inner = int(get("ssm.inner_size", 0) or 0)
    if d_inner:
        d_conv = int(get("ssm.conv_kernel", 0) or 0)
        d_state = int(get("ssm.state_size", 0) or 0)
        n_group = int(get("ssm.group_count", 0) or 0)
        # llama.cpp's n_embd_r / n_embd_s for Mamba 2 (groups) and Mamba 1.
        conv = (d_conv - 1) * (d_inner + 2 * n_group * d_state) if d_conv else 0
        recurrent = Recurrent(conv, d_state * d_inner)
        interval = int(get("full_attention_interval", 0) or 0)
        if interval:  # Qwen3-Next: one attention layer in each `interval`, linear attention between
            recurrent_layers = tuple((layer + 1) % interval != 0 for layer in range(n_layer))
        elif any(n_head_kv):  # Jamba, Granite hybrids: the layers without KV heads
            recurrent_layers = tuple(kv == 0 for kv in n_head_kv)
        else:  # Mamba: every layer
            recurrent_layers = (True,) * n_layer
    shortconv = int(get("shortconv.l_cache", 0) or 0)
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
        n_ctx_train=int(get("context_length", 0) or 0),
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
        n_expert=int(get("expert_count", 0) or 0),
        n_expert_used=int(get("expert_used_count", 0) or 0),
        n_ff=_first(get("feed_forward_length", 0)),
        n_ff_expert=int(get("expert_feed_forward_length", 0) or 0),
        n_expert_shared=int(get("expert_shared_count", 0) or 0),
        n_leading_dense=int(get("leading_dense_block_count", 0) or 0),
        head_dim_k_mla=int(get("attention.key_length_mla", 0) or 0) if kv_lora_rank else 0,
        tensors=tuple(tensors),
        weights_bytes=weights,
    )


def _per_layer(value: Any, n_layer: int, source: str, key: str) -> tuple[int, ...]:
    if isinstance(value, list):
        if len(value) != n_layer:
            raise ModelFactsError(f"{source}: {key} has {len(value)} entries for {n_layer} layers")
        return tuple(int(v) for v in value)
    return (int(value or 0),) * n_layer


def _first(value: Any) -> int:
    if isinstance(value, list):
        return int(max(value)) if value else 0
    return int(value or 0)


def _rows_of(tensors: Sequence[TensorInfo], name: str) -> int:
    for tensor in tensors:
        if tensor.name == name and len(tensor.shape) >= 2:
            return tensor.shape[1]
    return 0


# -- Hugging Face folders (vLLM, SGLang) ----------------------------------------------

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

    def need(key: str) -> Any:
        value = config.get(key)
        if value is None:
            raise ModelFactsError(f"{source}: config.json has no {key}")
        return value

    n_layer = int(need("num_hidden_layers"))
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
