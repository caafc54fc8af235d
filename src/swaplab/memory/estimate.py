"""What llama.cpp will allocate for a model, per device, before it loads: one pure function.

`estimate(facts, settings, gpus)` follows llama.cpp's own accounting (src/llama-context.cpp,
llama-kv-cache*.cpp, llama-model.cpp's layer placement), so each figure matches a line
llama.cpp prints when it loads at `-lv 4`:

- **weights**: each tensor's real size on the device its layer goes to. `-ngl N` puts the
  last N of the layers plus one (the output layer) on the GPUs, split by `--tensor-split`
  or else in proportion to the GPUs' memory; the token embeddings stay on the CPU, and a
  tied output head is copied to the GPU. On the CPU a memory-mapped file counts its whole
  span, and the weights llama.cpp repacks for the CPU's matmul kernels count again.
- **KV cache**: per layer with attention, (K row + V row) x cells, rows sized by the cache
  type's blocks (q8_0 keeps 34 bytes per 32 values). Cells: the context padded to 256,
  per slot unless the cache is unified; a sliding-window layer keeps
  min(context, window x slots + ubatch) cells; MLA keeps its latent (rank + rope) as K and
  no V; a recurrent layer keeps its fixed f32 state per slot instead.
- **compute**: the worst-case batch's graph, llama.cpp's ubatch tokens: the attention masks
  (kept for the whole graph) plus the largest of the feed-forward stage, the attention stage
  (with `-fa off`, the n_kv x tokens x heads score matrix) and the output stage.
- **output**: the logits buffer, n_vocab floats per slot.

Validated against the buffers llama.cpp reports (tests/test_memory_llamacpp.py,
docs/memory.md); what is not known is said in `Estimate.notes`.
"""

from __future__ import annotations

import bisect
import math
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from swaplab.memory.facts import ModelFacts, TensorInfo
from swaplab.memory.ggml import constants

GIB = 1024**3
MIB = 1024**2

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# Weights llama.cpp's CPU backend repacks into interleaved layouts, by CPU family, when
# their row count is a multiple of 8 (ggml-cpu/repack.cpp).
REPACKED = {
    "x86_64": frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}),
    "aarch64": frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4", "Q8_0"}),
}
CPU = "CPU"


def row_bytes(type_name: str, values: int) -> int:
    """ggml_row_size: the bytes of `values` values of a (block-quantized) ggml type."""
    ggml = constants()
    per_block, block_bytes = ggml.GGML_QUANT_SIZES[ggml.GGMLQuantizationType[type_name.upper()]]
    return math.ceil(values / per_block) * block_bytes


def pad(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class LoadSettings:
    """What a llama-server command line sets that sizes the load (llama-server's defaults)."""

    ctx: int = 0
    """Total context; 0 = the model's training context (llama-server's `-c 0`)."""
    parallel: int = 1
    batch: int = 2048
    ubatch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    swa_full: bool = False
    kv_unified: bool = False
    gpu_layers: int = -1
    """-ngl; negative = every layer (llama-server's default where a GPU is present)."""
    tensor_split: tuple[float, ...] = ()
    n_cpu_moe: int = 0
    """--n-cpu-moe N: the experts of the first N layers stay on the CPU."""
    override_tensor: tuple[tuple[str, str], ...] = ()
    """-ot PATTERN=BUFFER pairs, first match wins: tensors whose name the regular expression
    finds go to that buffer ("CPU", "CUDA0"...), whatever their layer's device."""
    no_kv_offload: bool = False
    mmap: bool = True
    repack: bool = True
    outputs_per_seq: int = 1
    """Logit rows the worst-case batch reserves per slot (llama-server keeps one per slot)."""
    cpu_family: str = ""
    """"x86_64" or "aarch64" (which weights get repacked); empty = this machine's."""


@dataclass(frozen=True)
class DeviceNeed:
    """Bytes one device needs for the model, by term."""

    device: str
    """"CPU", or "GPU0", "GPU1"... in the order the devices were given."""
    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.output

    def terms(self) -> dict[str, int]:
        return {"weights": self.weights, "kv": self.kv, "recurrent": self.recurrent,
                "compute": self.compute, "output": self.output}


@dataclass(frozen=True)
class Estimate:
    facts: ModelFacts
    settings: LoadSettings
    devices: tuple[DeviceNeed, ...]
    n_ctx: int
    """The context llama.cpp will allocate (padded, summed over slots)."""
    n_ctx_seq: int
    """Cells per slot."""
    kv_bytes_per_token: float
    """KV bytes per cell of context at full attention layers, all devices (the slope of
    `fit`: a sliding-window layer's share stops growing at its window)."""
    flash_attn: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    def device(self, name: str) -> DeviceNeed:
        return next((d for d in self.devices if d.device == name), DeviceNeed(name))

    def total(self, term: str | None = None) -> int:
        if term is None:
            return sum(d.total for d in self.devices)
        return sum(d.terms()[term] for d in self.devices)


def context_cells(facts: ModelFacts, settings: LoadSettings) -> tuple[int, int, int]:
    """(n_ctx, n_ctx_seq, streams) as llama_context sizes them."""
    slots = max(1, settings.parallel)
    n_ctx = pad(settings.ctx or facts.n_ctx_train or 4096, 256)
    if settings.kv_unified:
        return n_ctx, n_ctx, 1
    n_ctx_seq = pad(n_ctx // slots, 256)
    return n_ctx_seq * slots, n_ctx_seq, slots


def estimate(facts: ModelFacts, settings: LoadSettings = LoadSettings(), gpus: Sequence[int] = ()) -> Estimate:
    """What llama.cpp allocates for `facts` loaded with `settings`, on the CPU and on `gpus`
    (each GPU's memory in bytes, the default split's weights; empty = a CPU-only load)."""
    notes: list[str] = []
    slots = max(1, settings.parallel)
    n_ctx, n_ctx_seq, streams = context_cells(facts, settings)
    batch = min(n_ctx, settings.batch)
    ubatch = min(batch, settings.ubatch)
    quantized_v = settings.cache_type_v.lower() not in ("f16", "f32", "bf16")
    flash = settings.flash_attn != "off" or quantized_v
    if settings.flash_attn == "off" and quantized_v:
        notes.append("a quantized V cache needs flash attention: llama.cpp turns it on")

    layer_device = _layer_devices(facts, settings, gpus)
    names = [CPU] + [f"GPU{i}" for i in range(len(gpus))]
    weights = _weights(facts, settings, layer_device, names)

    # KV cache, per layer on its layer's device (the CPU with --no-kv-offload).
    swa_cells = n_ctx_seq if settings.swa_full else pad(
        min(n_ctx_seq, facts.sliding_window * (slots if settings.kv_unified else 1) + ubatch), 256)
    kv = dict.fromkeys(names, 0)
    recurrent = dict.fromkeys(names, 0)
    per_token = 0.0
    for layer in range(facts.n_layer):
        device = CPU if settings.no_kv_offload else layer_device[layer]
        if facts.is_recurrent(layer) and facts.recurrent is not None:
            state = facts.recurrent.conv_elements + facts.recurrent.state_elements
            recurrent[device] += 4 * state * slots
            continue
        k_row, v_row = _kv_rows(facts, layer, settings)
        cells = swa_cells if facts.is_swa(layer) else n_ctx_seq
        kv[device] += (k_row + v_row) * cells * streams
        if not facts.is_swa(layer):
            per_token += k_row + v_row

    compute = _compute(facts, settings, layer_device, names, n_ctx_seq, swa_cells, streams, ubatch, flash)
    outputs = dict.fromkeys(names, 0)
    outputs[CPU] = 4 * facts.n_vocab * slots  # the host copy the logits are read from

    devices = tuple(
        DeviceNeed(name, weights[name], kv[name], recurrent[name], compute[name], outputs[name])
        for name in names
        if name == CPU or weights[name] or kv[name] or compute[name]
    )
    if gpus:
        notes.append("GPU figures follow llama.cpp's placement rules; their compute buffers are "
                     "measured on the CPU backend only (docs/memory.md)")
    return Estimate(facts, settings, devices, n_ctx, n_ctx_seq, per_token, flash, tuple(notes))


def _kv_rows(facts: ModelFacts, layer: int, settings: LoadSettings) -> tuple[int, int]:
    """Bytes of one cell's K and V on `layer`."""
    type_k, type_v = settings.cache_type_k.upper(), settings.cache_type_v.upper()
    if facts.mla:
        return row_bytes(type_k, facts.kv_lora_rank + facts.rope_dim), 0
    heads = facts.n_head_kv[layer]
    return row_bytes(type_k, heads * facts.head_dim_k), row_bytes(type_v, heads * facts.head_dim_v)


# -- where each layer and tensor goes -------------------------------------------------


def _layer_devices(facts: ModelFacts, settings: LoadSettings, gpus: Sequence[int]) -> list[str]:
    """The device of each layer 0..n_layer-1 and, last, of the output layer (llama.cpp's
    `-ngl`: the last N layers counting the output one; the input layer stays on the CPU)."""
    count = facts.n_layer + 1
    if not gpus:
        return [CPU] * count
    offloaded = count if settings.gpu_layers < 0 else min(settings.gpu_layers, count)
    first_gpu = count - offloaded
    split = list(settings.tensor_split[: len(gpus)]) or [float(g) for g in gpus]
    split += [0.0] * (len(gpus) - len(split))
    total = sum(split) or 1.0
    cumulative = []
    running = 0.0
    for share in split:
        running += share / total
        cumulative.append(running)
    devices = []
    for layer in range(count):
        if layer < first_gpu:
            devices.append(CPU)
            continue
        index = bisect.bisect_right(cumulative, (layer - first_gpu) / offloaded)
        devices.append(f"GPU{min(index, len(gpus) - 1)}")
    return devices


def _tensor_device(tensor: TensorInfo, facts: ModelFacts, settings: LoadSettings, layer_device: list[str]) -> str:
    for pattern, buffer in settings.override_tensor:
        if re.search(pattern, tensor.name):
            gpu = re.search(r"(\d+)$", buffer)
            if buffer.upper().startswith("CPU") or gpu is None or layer_device.count(CPU) == len(layer_device):
                return CPU
            return f"GPU{gpu.group(1)}"
    layer = tensor.layer
    if layer is None:
        if tensor.name.startswith(("output.", "output_norm.")):
            return layer_device[facts.n_layer]
        return CPU  # token embeddings and other input tensors
    if layer >= facts.n_layer:  # multi-token-prediction heads beyond the main layers
        return layer_device[facts.n_layer]
    if layer < settings.n_cpu_moe and "_exps." in tensor.name:
        return CPU
    return layer_device[layer]


def _weights(facts: ModelFacts, settings: LoadSettings, layer_device: list[str], names: list[str]) -> dict[str, int]:
    weights = dict.fromkeys(names, 0)
    family = settings.cpu_family or platform.machine()
    repackable = REPACKED.get(family, frozenset()) if settings.repack else frozenset()
    on_cpu: list[TensorInfo] = []
    for tensor in facts.tensors:
        device = _tensor_device(tensor, facts, settings, layer_device)
        if device == CPU:
            on_cpu.append(tensor)
            if _repacked(tensor, repackable):
                weights[CPU] += tensor.n_bytes  # the repacked copy, beside the mapped original
        else:
            weights[device] += pad(tensor.n_bytes, 128)
    if not any(t.name == "output.weight" for t in facts.tensors):
        embeddings = next((t for t in facts.tensors if t.name == "token_embd.weight"), None)
        output_device = layer_device[facts.n_layer]
        if embeddings is not None and output_device != CPU:
            weights[output_device] += embeddings.n_bytes  # a tied head is copied to its GPU
        elif embeddings is not None and _repacked(embeddings, repackable):
            weights[CPU] += embeddings.n_bytes
    if on_cpu and settings.mmap and all(t.offset for t in on_cpu[1:]):
        # One mapping over the file span of the CPU's tensors (what llama.cpp reports).
        weights[CPU] += max(t.offset + t.n_bytes for t in on_cpu) - min(t.offset for t in on_cpu)
    else:
        weights[CPU] += sum(pad(t.n_bytes, 32) for t in on_cpu)
    return weights


def _repacked(tensor: TensorInfo, repackable: frozenset[str]) -> bool:
    return (
        tensor.type_name in repackable
        and len(tensor.shape) >= 2
        and tensor.shape[1] % 8 == 0
        and tensor.name != "token_embd.weight"
    )


# -- the compute buffer ---------------------------------------------------------------


def _compute(
    facts: ModelFacts,
    settings: LoadSettings,
    layer_device: list[str],
    names: list[str],
    n_ctx_seq: int,
    swa_cells: int,
    streams: int,
    ubatch: int,
    flash: bool,
) -> dict[str, int]:
    """The worst-case graph's buffer on each device that computes layers."""
    tokens = ubatch
    per_stream = max(1, tokens // streams) * streams
    mask_value = 2 if flash else 4
    attention_layers = [layer for layer in range(facts.n_layer) if not facts.is_recurrent(layer)]
    has_full = any(not facts.is_swa(layer) for layer in attention_layers)
    has_swa = any(facts.is_swa(layer) for layer in attention_layers)
    masks = mask_value * per_stream * ((n_ctx_seq if has_full else 0) + (swa_cells if has_swa else 0))

    heads = max(facts.n_head) if facts.n_head else 0
    heads_kv = max(facts.n_head_kv) if facts.n_head_kv else 0
    if facts.mla:
        q_width = heads * (facts.head_dim_k_mla or facts.head_dim_k)
        k_width = v_width = facts.kv_lora_rank + facts.rope_dim
        out_width = heads * max(facts.kv_lora_rank, facts.head_dim_v)
    else:
        q_width = heads * facts.head_dim_k
        k_width = heads_kv * facts.head_dim_k
        v_width = heads_kv * facts.head_dim_v
        out_width = heads * facts.head_dim_v
    embd = facts.n_embd

    # Floats per token alive at each stage's peak (measured on llama.cpp's CPU backend:
    # the residual stream, the norm, the stage's inputs and outputs).
    if facts.n_expert:
        experts = facts.n_ff_expert or facts.n_ff
        moe = 3 * experts * facts.n_expert_used + 3 * experts * facts.n_expert_shared + 2 * facts.n_expert
        dense = 3 * facts.n_ff if facts.n_leading_dense else 0
        ffn = max(moe, dense) + 5 * embd
    else:
        ffn = 3 * facts.n_ff + 5 * embd
    attention = q_width + k_width + v_width + 2 * out_width + 3 * embd
    stage = 4 * tokens * max(ffn, attention)
    if not flash and attention_layers:
        widest = n_ctx_seq if has_full else swa_cells
        stage = max(stage, 4 * widest * tokens * heads + 4 * tokens * attention)
    if facts.recurrent is not None and facts.recurrent_layers:
        state = facts.recurrent.conv_elements + facts.recurrent.state_elements
        stage = max(stage, 4 * tokens * (3 * embd) + 4 * state * max(1, settings.parallel))
    outputs = min(tokens, max(1, settings.parallel) * settings.outputs_per_seq)
    output_stage = 4 * outputs * (embd + facts.n_vocab)

    compute = dict.fromkeys(names, 0)
    for device in set(layer_device[: facts.n_layer]):
        compute[device] = masks + stage
    output_device = layer_device[facts.n_layer]
    compute[output_device] = max(compute[output_device], masks + output_stage)
    return compute
