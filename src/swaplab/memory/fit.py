"""Does a load fit the given devices, and what is the largest context that does? Pure.

Also the Hugging Face side: what a vLLM or SGLang load needs per rank from `config.json`,
with tensor parallelism splitting the weights and the KV heads (replicating KV heads when
there are fewer than ranks, and MLA's latent cache on every rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from swaplab.memory.estimate import CPU, GIB, Estimate, LoadSettings, estimate, pad
from swaplab.memory.facts import ModelFacts


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

    @property
    def total(self) -> int:
        return self.weights + self.kv


def hf_rank_need(facts: ModelFacts, ctx: int, cache_bytes: float = 2.0, tensor_parallel: int = 1) -> RankNeed:
    """Per GPU of a tensor-parallel vLLM/SGLang load: the weights split over the ranks and
    the KV cache for `ctx` tokens of context (all slots together), its heads split over the
    ranks (replicated where there are fewer KV heads than ranks; MLA's latent on every rank);
    only a hybrid's attention layers count."""
    ranks = max(1, tensor_parallel)
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
    kv = int(per_token * pad(ctx, 16) + window)
    return RankNeed(facts.weights_bytes // ranks, per_token, kv, ranks)
