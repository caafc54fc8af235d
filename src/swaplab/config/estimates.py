"""Device claims for models that declare none, estimated from their GGUF files.

Where the config declares `devices` with `vramGiB`, a llama-server model without its own
`vramGiB` would otherwise claim its devices whole. Its command says what it loads (`-m`,
`-c`, `-np`, `-ctk`/`-ctv`, `-ngl`, `-ts`...), and `swaplab.memory` says what that takes
on each device: that becomes its claim, so two models whose estimates fit share a device.
Declared claims always win. A model whose estimate cannot be made (no -m file yet, a
device of unknown size) keeps the whole-device claim, and `detail` says why.

vLLM and SGLang entries claim what the engine takes of each of its GPUs as it sizes itself
today (`memory.fit.engine_claim`: vLLM without `--gpu-memory-utilization` the whole device, a
share of the total with it, weights + `--kv-cache-memory-bytes` + its reserve with that; SGLang
its static share plus the reserve it needs beside it), on tensor x data x pipeline parallel
devices; their model's `config.json` (a folder, or the local Hugging Face cache) says whether
that holds the weights and the KV cache for their context.
"""

from __future__ import annotations

from collections.abc import Mapping

from swaplab.config.model import ClaimEstimate, DeviceConfig, ModelConfig
from swaplab.errors import SwaplabError
from swaplab.memory.estimate import GIB, estimate
from swaplab.memory.facts import hf_folder, read_gguf, read_hf
from swaplab.memory.fit import Shortfall, advice, engine_claim
from swaplab.memory.flags import engine_load, engine_of, llama_load, runs_llama_server


def estimate_claims(models: Mapping[str, ModelConfig], devices: Mapping[int, DeviceConfig]) -> dict[str, ClaimEstimate]:
    """An estimate for each llama-server model without declared `vramGiB`, on declared devices."""
    if not devices:
        return {}
    estimates = {}
    for model_id, model in models.items():
        if model.vram_gib or not (runs_llama_server(model.cmd) or engine_of(model.cmd)):
            continue
        estimates[model_id] = claim_estimate(model, devices)
    return estimates


def claim_estimate(model: ModelConfig, devices: Mapping[int, DeviceConfig]) -> ClaimEstimate:
    targets = list(model.devices) if model.devices else sorted(devices)
    unsized = [d for d in targets if d not in devices or not devices[d].vram_gib]
    if unsized:
        return ClaimEstimate(None, f"device {', '.join(map(str, unsized))} declares no vramGiB to split the model over")
    if not runs_llama_server(model.cmd):
        return _engine_estimate(model, devices, targets)
    try:
        load = llama_load(model.cmd)
    except SwaplabError as error:
        return ClaimEstimate(None, f"no estimate: {error}")
    try:
        facts = read_gguf(load.model)
    except SwaplabError as error:
        # A file that is absent, truncated or hostile: its devices are claimed whole, and the
        # config's warnings (logged at each load) say why.
        return ClaimEstimate(None, f"no estimate: {error}", unreadable=str(error))
    sizes = [int(devices[d].vram_gib * GIB) for d in targets]
    result = estimate(facts, load.settings, sizes)
    claim: dict[int, float] = {}
    parts = []
    for index, device in enumerate(targets):
        need = result.device(f"GPU{index}")
        if not need.total:
            continue
        claim[device] = need.total / GIB
        terms = " + ".join(f"{name} {size / GIB:.2f}" for name, size in need.terms().items() if size)
        line = f"device {device}: {terms} = {need.total / GIB:.2f} GiB"
        term, size = max(need.terms().items(), key=lambda item: item[1])
        hint = advice(result, Shortfall(f"GPU{index}", need.total, sizes[index], term, size))
        parts.append(f"{line} (largest: {term}; {hint})")
    settings = result.settings
    head = (f"estimated from {load.model} at context {result.n_ctx}, {max(1, settings.parallel)} slot(s), "
            f"KV {settings.cache_type_k}/{settings.cache_type_v}")
    return ClaimEstimate(claim, head + ": " + "; ".join(parts) if parts else head + ": nothing on the GPUs")


def _engine_estimate(model: ModelConfig, devices: Mapping[int, DeviceConfig], targets: list[int]) -> ClaimEstimate:
    """vLLM and SGLang take what their flags and the GPU's size say, whatever the model needs:
    that is the claim; the model's floor (weights and KV for its context, per rank) says
    whether it can start in it."""
    try:
        load = engine_load(model.cmd)
    except SwaplabError as error:
        return ClaimEstimate(None, f"no estimate: {error}")
    try:
        facts, unknown = read_hf(hf_folder(load.model)), ""
    except SwaplabError as error:
        facts, unknown = None, str(error)
    ranks = targets[: load.devices]
    result = engine_claim(load, facts, [int(devices[device].vram_gib * GIB) for device in ranks], unknown)
    return ClaimEstimate({device: taken / GIB for device, taken in zip(ranks, result.takes)}, result.detail)
