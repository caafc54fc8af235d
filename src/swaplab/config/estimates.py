"""Device claims for models that declare none, estimated from their GGUF files.

Where the config declares `devices` with `vramGiB`, a llama-server model without its own
`vramGiB` would otherwise claim its devices whole. Its command says what it loads (`-m`,
`-c`, `-np`, `-ctk`/`-ctv`, `-ngl`, `-ts`...), and `swaplab.memory` says what that takes
on each device: that becomes its claim, so two models whose estimates fit share a device.
Declared claims always win. A model whose estimate cannot be made (no -m file yet, not
llama-server) keeps the whole-device claim, and `detail` says why.
"""

from __future__ import annotations

from collections.abc import Mapping

from swaplab.config.model import ClaimEstimate, DeviceConfig, ModelConfig
from swaplab.errors import SwaplabError
from swaplab.memory.estimate import GIB, estimate
from swaplab.memory.facts import read_gguf
from swaplab.memory.fit import Shortfall, advice
from swaplab.memory.flags import llama_load, runs_llama_server


def estimate_claims(models: Mapping[str, ModelConfig], devices: Mapping[int, DeviceConfig]) -> dict[str, ClaimEstimate]:
    """An estimate for each llama-server model without declared `vramGiB`, on declared devices."""
    if not devices:
        return {}
    estimates = {}
    for model_id, model in models.items():
        if model.vram_gib or not runs_llama_server(model.cmd):
            continue
        estimates[model_id] = claim_estimate(model, devices)
    return estimates


def claim_estimate(model: ModelConfig, devices: Mapping[int, DeviceConfig]) -> ClaimEstimate:
    targets = list(model.devices) if model.devices else sorted(devices)
    unsized = [d for d in targets if d not in devices or not devices[d].vram_gib]
    if unsized:
        return ClaimEstimate(None, f"device {', '.join(map(str, unsized))} declares no vramGiB to split the model over")
    try:
        load = llama_load(model.cmd)
        facts = read_gguf(load.model)
    except SwaplabError as error:
        return ClaimEstimate(None, f"no estimate: {error}")
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
