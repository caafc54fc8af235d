"""Does a load fit the given devices, and what is the largest context that does? Pure.

Also the Hugging Face side: what a vLLM or SGLang load needs per rank from `config.json`,
with tensor parallelism splitting the weights and the KV heads (replicating KV heads when
there are fewer than ranks, and MLA's latent cache on every rank), and what the engine takes
of each GPU as it sizes itself today (`engine_claim`): that, not the need, is its claim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from swaplab.memory.estimate import CPU, GIB, MIB, Estimate, LoadSettings, estimate, pad
from swaplab.memory.facts import ModelFacts
from swaplab.memory.flags import EngineLoad


@dataclass(frozen=True)
class Shortfall:
    device: str
    needs: int
    has: int
    largest_term: str
    largest_bytes: int


def shortfalls(result: Estimate, gpus: Sequence[int], host: int | None = None) -> list[Shortfall]:
    """The devices whose need exceeds their memory (`host`: the CPU's, None = not checked)."""
    limits = {f"GPU{i}": size for i, size in enumerate(gpus)}
    if host is not None:
        limits[CPU] = host
    short = []
    for need in result.devices:
        limit = limits.get(need.device)
        if limit is not None and need.total > limit:
            term, size = max(need.terms().items(), key=lambda item: item[1])
            short.append(Shortfall(need.device, need.total, limit, term, size))
    return short


def largest_context(
    facts: ModelFacts, settings: LoadSettings, gpus: Sequence[int], host: int | None = None, ceiling: int = 0
) -> int:
    """The largest total context (a multiple of 256 per slot) whose load fits; 0 if none does.

    Searched up to `ceiling` (default: the model's training context, per slot)."""
    slots = max(1, settings.parallel)
    top = ceiling or (facts.n_ctx_train or 131072) * (1 if settings.kv_unified else slots)

    def fits(ctx: int) -> bool:
        return not shortfalls(estimate(facts, replace(settings, ctx=ctx), gpus), gpus, host)

    step = 256 * (1 if settings.kv_unified else slots)
    low, high = 0, top // step
    if not fits(step):
        return 0
    while low < high:  # the need only grows with the context
        middle = (low + high + 1) // 2
        if fits(middle * step):
            low = middle
        else:
            high = middle - 1
    return low * step


def advice(result: Estimate, short: Shortfall) -> str:
    """A flag that would shrink the largest term, with what it saves."""
    settings = result.settings
    if short.largest_term == "kv" and settings.cache_type_k == "f16" and settings.cache_type_v == "f16":
        saved = result.device(short.device).kv * (1 - 34 / 64)
        return f"a q8_0 KV cache (-ctk q8_0 -ctv q8_0) saves {saved / GIB:.1f} GiB there"
    if short.largest_term == "kv":
        return f"a smaller context (-c) lowers the KV cache ({result.kv_bytes_per_token / 1024:.1f} KiB per token)"
    if short.largest_term == "compute" and not result.flash_attn:
        return "flash attention (-fa on) removes the n_ctx x tokens x heads score matrix"
    if short.largest_term == "compute":
        return "a smaller -ub (physical batch) lowers the compute buffer in proportion"
    if short.largest_term == "weights" and result.facts.n_expert:
        return "--n-cpu-moe N keeps the first N layers' experts on the CPU"
    return "fewer GPU layers (-ngl) leave the rest on the CPU"


# -- vLLM / SGLang from config.json --------------------------------------------------


@dataclass(frozen=True)
class RankNeed:
    weights: int
    kv_bytes_per_token: float
    kv: int
    ranks: int
    """GPUs one replica spans: tensor x pipeline parallel."""

    @property
    def total(self) -> int:
        return self.weights + self.kv


def hf_rank_need(
    facts: ModelFacts, ctx: int, cache_bytes: float = 2.0, tensor_parallel: int = 1, pipeline_parallel: int = 1,
) -> RankNeed:
    """Per GPU of a tensor-parallel vLLM/SGLang load: the weights split over the ranks and
    the KV cache for `ctx` tokens of context (all slots together), its heads split over the
    ranks (replicated where there are fewer KV heads than ranks; MLA's latent on every rank);
    only a hybrid's attention layers count. Pipeline stages split the layers evenly."""
    ranks = max(1, tensor_parallel)
    stages = max(1, pipeline_parallel)
    per_token = 0.0
    window = 0.0
    for layer in range(facts.n_layer):
        if facts.mla:
            per_token += (facts.kv_lora_rank + facts.rope_dim) * cache_bytes
            continue
        if not facts.n_head_kv[layer]:  # a hybrid's linear-attention or Mamba layer keeps no KV cache
            continue
        heads = max(1, -(-facts.n_head_kv[layer] // ranks))
        width = heads * (facts.head_dim_k + facts.head_dim_v) * cache_bytes
        if facts.is_swa(layer):  # a window's cells do not grow with the context
            window += width * min(ctx, facts.sliding_window)
        else:
            per_token += width
    per_token, window = per_token / stages, window / stages
    kv = int(per_token * pad(ctx, 16) + window)
    return RankNeed(facts.weights_bytes // (ranks * stages), per_token, kv, ranks * stages)


# -- what vLLM and SGLang take ------------------------------------------------------
# Read from their releases (swaplab/engines/contracts/{vllm,sglang}.yaml, `memory`).

VLLM_RESERVED = 2 * GIB
"""What vLLM keeps on each GPU beside its weights and KV cache, which no flag states before a
start (the contract's `reserved`): the margin its KV sizing leaves, max(1 GiB, 0.75 x the
activations' transient peak) on CUDA (vllm/v1/worker/extensible_kv_cache.py:64-65, :615), and
the transient peak itself, kept free in full (:617), with its CUDA graphs and CUDA context;
taken as the 1 GiB floor of that margin plus 1 GiB for the rest. Its log says the real figures
("Graph capturing finished in ..., took X GiB", "... GiB kept for transient activations")."""

# SGLang's defaults by GPU size (sglang/srt/arg_groups/memory_hook.py:87-167): below this many
# MiB, its chunked prefill size and its decode graphs' largest batch at tp < 4 and at tp >= 4.
_SGLANG_BY_SIZE = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 4096, 48, 160),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (math.inf, 16384, 512, 512),
)


def sglang_reserve_mib(
    gpu_mib: float, tensor_parallel: int = 1, pipeline_parallel: int = 1, mla: bool = False,
) -> float:
    """MiB SGLang reserves beside its static pool for activations and CUDA graphs, by its own
    formula (memory_hook.py:281-343, 350-395): 512 + 1.5 x max(chunked prefill, 2048) +
    tp x pp / 8 x 1024 + decode graphs' max batch x 2 + 8 per prefill graph size (1536 with
    MLA), at least 10 GiB on a GPU over 60 GiB. DeepEP's 2 GiB and a VLM's scaling are left out."""
    chunk, small_tp, large_tp = next(row[1:] for row in _SGLANG_BY_SIZE if gpu_mib < row[0])
    decode_batch = small_tp if tensor_parallel < 4 else large_tp
    graphs = decode_batch * 2 + (1.5 * 1024 if mla else 8 * len(_prefill_graph_sizes(chunk)))
    reserved = 512 + 1.5 * max(chunk, 2048) + tensor_parallel * pipeline_parallel / 8 * 1024 + graphs
    return max(reserved, 10 * 1024) if gpu_mib > 60 * 1024 else reserved


def sglang_default_fraction(
    gpu_mib: float, tensor_parallel: int = 1, pipeline_parallel: int = 1, mla: bool = False,
) -> float:
    """SGLang's --mem-fraction-static when none is given: round((gpu - reserved) / gpu, 3) of the
    GPU's total MiB (memory_hook.py:324-328). An H100 (81559 MiB) at tp 1 gets 0.83."""
    reserved = sglang_reserve_mib(gpu_mib, tensor_parallel, pipeline_parallel, mla)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def _prefill_graph_sizes(max_tokens: int) -> list[int]:
    """The token counts SGLang captures prefill graphs for (cuda_graph_hook.py:480-497)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [size for size in sizes if size <= max_tokens]


@dataclass(frozen=True)
class EngineClaim:
    """What a vLLM or SGLang load takes on each GPU it spans, and whether that holds its floor."""

    takes: tuple[int, ...]
    """Bytes on each of its devices, in order; empty where the devices' sizes are not given."""
    fraction: float | None
    """The share in force: the command's, or the engine's default for these GPUs (None: none applies)."""
    need: RankNeed | None
    """Weights and KV for its context per rank; None without the model's config.json."""
    ctx: int
    short: bool
    """It will not start: what it takes cannot hold its floor, or it has fewer devices than ranks."""
    detail: str
    """The arithmetic in words."""


def engine_claim(load: EngineLoad, facts: ModelFacts | None, sizes: Sequence[int], unknown: str = "") -> EngineClaim:
    """What `load` takes on devices of `sizes` bytes (the first `load.devices` of them), as the
    engine sizes itself, with its floor from `facts` (None: `unknown` says why).

    - vLLM without --gpu-memory-utilization takes what is free at its start (the extensible KV
      cache resolves the share to 1.0): the whole device. A share is of the device's total.
      --kv-cache-memory-bytes sizes the KV cache per GPU whatever the share: weights + those
      bytes + `VLLM_RESERVED`.
    - SGLang's --mem-fraction-static is a share of the memory free at its start, weights inside
      it, and it needs the rest for CUDA graphs and activations: it takes the share of the
      device plus its own reserve estimate, at most the whole device. Its default share is
      computed from the GPU's size so that the two make the whole device.
    """
    sizes = list(sizes)[: load.devices]
    ctx = load.ctx or (facts.n_ctx_train if facts is not None else 0)
    need = None if facts is None else hf_rank_need(
        facts, ctx, load.kv_element_bytes, load.tensor_parallel, load.pipeline_parallel)
    if load.engine == "vllm" and load.kv_cache_bytes is not None:
        claim = _vllm_kv_bytes(load, need, sizes, ctx, unknown)
    else:
        share = _vllm_share(load, sizes) if load.engine == "vllm" else _sglang_share(load, facts, sizes)
        claim = _against_floor(load, share, need, ctx, sizes, unknown)
    if not sizes or len(sizes) >= load.devices:
        return claim
    spans = f"tensor {load.tensor_parallel} x data {load.data_parallel} x pipeline {load.pipeline_parallel}"
    return replace(claim, short=True, detail=f"{claim.detail}; it spans {load.devices} devices ({spans}) and has "
                                              f"{len(sizes)}: it will not start")


@dataclass(frozen=True)
class _Share:
    takes: tuple[int, ...]
    fraction: float | None
    static: int
    """What must hold the weights, the KV cache and vLLM's reserve on the smallest device."""
    head: str


def _each(load: EngineLoad) -> str:
    return f"each of its {load.devices} device(s)"


def _vllm_share(load: EngineLoad, sizes: list[int]) -> _Share:
    smallest = min(sizes, default=0)
    if load.fraction is None:
        return _Share(tuple(sizes), None, smallest,
                      f"vLLM takes the memory free at its start on {_each(load)} (no --gpu-memory-utilization: "
                      "the extensible KV cache resolves it to 1.0, vllm/config/cache.py:495-501)")
    return _Share(tuple(math.ceil(size * load.fraction) for size in sizes), load.fraction,
                  math.ceil(smallest * load.fraction),
                  f"vLLM takes {load.fraction:g} of {_each(load)}, of its total memory (vllm/v1/worker/utils.py:742-743)")


def _sglang_share(load: EngineLoad, facts: ModelFacts | None, sizes: list[int]) -> _Share:
    smallest = min(sizes, default=0)
    if not sizes:  # its reserve, and its default share, follow the GPU's size
        what = f"{load.fraction:g} of the memory free at its start" if load.fraction else "a share by the GPU's size"
        return _Share((), load.fraction, 0, f"SGLang takes {what} for weights and KV, and more beside it for CUDA "
                                            "graphs and activations: give the devices to size it")
    gpu_mib = smallest / MIB
    mla = facts.mla if facts is not None else True
    reserve = sglang_reserve_mib(gpu_mib, load.tensor_parallel, load.pipeline_parallel, mla) * MIB
    guess = "" if facts is not None else ", with MLA's graph reserve as its config.json is unread"
    if load.fraction is None:
        fraction = sglang_default_fraction(gpu_mib, load.tensor_parallel, load.pipeline_parallel, mla)
        return _Share(tuple(sizes), fraction, math.floor(smallest * fraction), (
            f"SGLang without --mem-fraction-static takes {fraction:g} of a {gpu_mib:.0f} MiB GPU for weights and KV, "
            f"round((total - reserve {reserve / MIB:.0f} MiB) / total, 3) (sglang/srt/arg_groups/memory_hook.py:281-343"
            f"{guess}), and needs the rest for CUDA graphs and activations: the whole of {_each(load)}"))
    fraction = load.fraction
    head = (f"SGLang takes {fraction:g} of the memory free at its start for weights and KV "
            f"(sglang/srt/mem_cache/kv_cache_configurator.py:2990-3061) and needs {reserve / GIB:.2f} GiB beside it "
            f"for CUDA graphs and activations (its own reserve, memory_hook.py{guess})")
    if smallest * fraction + reserve > smallest:
        head += f": the whole of {_each(load)}, as {fraction:g} leaves {(1 - fraction) * smallest / GIB:.2f} GiB beside it"
    return _Share(tuple(min(size, math.ceil(size * fraction + reserve)) for size in sizes), fraction,
                  math.floor(smallest * fraction), head)


def _vllm_kv_bytes(load: EngineLoad, need: RankNeed | None, sizes: list[int], ctx: int, unknown: str) -> EngineClaim:
    assert load.kv_cache_bytes is not None
    kv = load.kv_cache_bytes
    if need is None:
        return EngineClaim(tuple(sizes), None, None, ctx, False,
                           f"vLLM's KV cache is --kv-cache-memory-bytes {kv / GIB:.2f} GiB on {_each(load)}, "
                           f"but its weights are unknown ({unknown}): it claims them whole")
    taken = need.weights + kv + VLLM_RESERVED
    parts = [f"vLLM's KV cache is --kv-cache-memory-bytes on {_each(load)}, whatever the share "
             f"(vllm/v1/worker/gpu_worker.py:688-712): weights {need.weights / GIB:.2f} + KV {kv / GIB:.2f} + "
             f"reserved {VLLM_RESERVED / GIB:.2f} = {taken / GIB:.2f} GiB"]
    if need.kv > kv:
        parts.append(f"KV at {ctx} tokens needs {need.kv / GIB:.2f} GiB: it will not start; raise "
                     "--kv-cache-memory-bytes or lower the context")
    if sizes and taken > min(sizes):
        parts.append(f"more than the device's {min(sizes) / GIB:.2f} GiB: it will not start")
    return EngineClaim(tuple(min(taken, size) for size in sizes), None, need, ctx, len(parts) > 1, "; ".join(parts))


def _against_floor(load: EngineLoad, share: _Share, need: RankNeed | None, ctx: int, sizes: list[int],
                   unknown: str) -> EngineClaim:
    """The claim, with whether what it keeps for weights and KV holds them at its context."""
    head, takes, fraction = share.head, share.takes, share.fraction
    if takes:
        head += ": " + ", ".join(dict.fromkeys(f"{taken / GIB:.2f}" for taken in takes)) + " GiB"  # each figure once
    if need is None:
        return EngineClaim(takes, fraction, None, ctx, False, f"{head}; its floor is unknown ({unknown})")
    reserved = VLLM_RESERVED if load.engine == "vllm" else 0  # SGLang's is outside its share
    floor_total = need.total + reserved
    floor = (f"weights {need.weights / GIB:.2f} + KV at {ctx} tokens {need.kv / GIB:.2f}"
             + (f" + reserved {reserved / GIB:.2f}" if reserved else "") + f" = {floor_total / GIB:.2f} GiB per rank")
    if not takes or floor_total <= share.static:
        return EngineClaim(takes, fraction, need, ctx, False, f"{head}; its floor: {floor}")
    smallest = min(sizes)
    within = (f"{fraction:g} of {smallest / GIB:.2f} GiB is {share.static / GIB:.2f} GiB" if fraction
              else f"{smallest / GIB:.2f} GiB")
    room = share.static - need.weights - reserved
    fits = int(room / need.kv_bytes_per_token) // 16 * 16 if need.kv_bytes_per_token else 0
    if load.ctx_auto and fits > 0:
        return EngineClaim(takes, fraction, need, ctx, False,
                           f"{head}; with --max-model-len auto it starts at the longest context that fits, about "
                           f"{fits} tokens ({within}; at its own {ctx}: {floor})")
    return EngineClaim(takes, fraction, need, ctx, True,
                       f"{head}, short of its floor ({floor}; {within}): it will not start; raise the share, lower "
                       "the context or add ranks")
