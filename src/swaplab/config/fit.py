"""`swaplab fit`: what a model needs in memory (weights, KV cache, compute) and the largest
context that fits the devices given; a thin skin over `swaplab.memory`."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from swaplab.argtypes import size_list
from swaplab.errors import SwaplabError, UnknownModelError
from swaplab.memory.estimate import (
    CACHE_TYPES,
    CPU,
    GIB,
    MIB,
    Estimate,
    LoadSettings,
    estimate,
)
from swaplab.memory.facts import ModelFacts, hf_folder, read_gguf, read_hf
from swaplab.memory.fit import advice, engine_claim, largest_context, shortfalls
from swaplab.memory.flags import (
    EngineLoad,
    engine_load,
    engine_of,
    kv_dtype_bytes,
    llama_load,
    runs_llama_server,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    fit = commands.add_parser(
        "fit", help="what a model needs in memory (weights, KV, compute) and the largest context that fits",
        description="Estimate, before loading, the memory llama.cpp will allocate for a model on each device.",
    )
    fit.add_argument("target", help="a GGUF file, a Hugging Face model folder, or a model id (or alias) of the config")
    fit.add_argument("--config", metavar="FILE", help="the config whose model TARGET names (default: the built-in default)")
    fit.add_argument("--config-dir", metavar="DIR", help="also every *.yml/*.yaml directly in DIR (llama-swap's -config-dir)")
    fit.add_argument("--ctx", type=int, metavar="N", help="total context (llama-server's -c; 0 = the model's own)")
    fit.add_argument("--parallel", type=int, metavar="N", help="slots (llama-server's -np)")
    fit.add_argument("--cache-type", metavar="K[,V]", help=f"KV cache type(s): {', '.join(CACHE_TYPES)}")
    fit.add_argument("--ubatch", type=int, metavar="N", help="physical batch (llama-server's -ub)")
    fit.add_argument("--flash-attn", choices=("on", "off", "auto"), help="flash attention (llama-server's -fa)")
    fit.add_argument("--gpu-layers", type=int, metavar="N", help="layers on the GPUs (llama-server's -ngl; default all)")
    fit.add_argument("--devices", type=size_list, metavar="SIZES",
                     help="GPU memory, e.g. 16GiB,8GiB (default: a CPU-only load checked against free RAM)")
    fit.add_argument("--tensor-parallel", type=int, metavar="N", help="a vLLM/SGLang model: GPUs one load spans")
    fit.add_argument("--json", action="store_true", help="the figures in bytes, as JSON")


def main(args: argparse.Namespace) -> int:
    target = Path(args.target)
    if target.is_dir():
        return _hf(args, read_hf(target), EngineLoad("vllm", str(target)))
    if target.is_file() or target.suffix == ".gguf":
        facts, settings = read_gguf(target), LoadSettings()
    else:
        argv = _entry_command(args)
        if not runs_llama_server(argv):
            load = engine_load(argv)
            return _hf(args, read_hf(hf_folder(load.model)), load)
        load = llama_load(argv)
        facts, settings = read_gguf(load.model), load.settings
    settings = _overridden(settings, args)
    gpus = args.devices or []
    result = estimate(facts, settings, gpus)
    host = None if gpus else _free_ram()
    short = shortfalls(result, gpus, host)
    largest = largest_context(facts, replace(settings, ctx=0), gpus, host)
    if args.json:
        print(json.dumps(_document(result, gpus, host, largest, short), indent=2))
    else:
        print(_text(result, gpus, host, largest, short))
    return 1 if short else 0


def _entry_command(args: argparse.Namespace) -> tuple[str, ...]:
    """The command of the config model TARGET names: llama-server, vLLM or SGLang."""
    from swaplab.config.loader import load_config_sources, load_default_config

    config = load_config_sources(args.config, args.config_dir) if args.config or args.config_dir else load_default_config()
    model_id = config.resolve_alias(args.target)
    if model_id is None:
        raise UnknownModelError(args.target, sorted(config.models))
    argv = config.models[model_id].cmd
    if not runs_llama_server(argv) and engine_of(argv) is None:
        raise SwaplabError(f"fit: {model_id!r} runs neither llama-server nor vLLM nor SGLang: nothing to estimate")
    return argv


def _overridden(settings: LoadSettings, args: argparse.Namespace) -> LoadSettings:
    changes: dict[str, Any] = {}
    if args.ctx is not None:
        changes["ctx"] = args.ctx
    if args.parallel is not None:
        changes["parallel"] = args.parallel
    if args.ubatch is not None:
        changes["ubatch"] = args.ubatch
    if args.flash_attn is not None:
        changes["flash_attn"] = args.flash_attn
    if args.gpu_layers is not None:
        changes["gpu_layers"] = args.gpu_layers
    if args.cache_type is not None:
        kinds = [kind.strip().lower() for kind in args.cache_type.split(",")]
        unknown = [kind for kind in kinds if kind not in CACHE_TYPES]
        if unknown or len(kinds) > 2:
            raise SwaplabError(f"fit: --cache-type {args.cache_type!r}: give K or K,V from {', '.join(CACHE_TYPES)}")
        changes["cache_type_k"], changes["cache_type_v"] = kinds[0], kinds[-1]
    return replace(settings, **changes)


def _free_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _describe(facts: ModelFacts) -> str:
    kinds = []
    if facts.mla:
        kinds.append(f"MLA (latent {facts.kv_lora_rank} + rope {facts.rope_dim})")
    elif facts.n_head_kv and max(facts.n_head_kv):
        heads, kv_heads = max(facts.n_head), max(facts.n_head_kv)
        kind = "MQA" if kv_heads == 1 else "GQA" if kv_heads < heads else "MHA"
        kinds.append(f"{kind} ({heads} heads, {kv_heads} KV head{'s' if kv_heads > 1 else ''}, head dim {facts.head_dim_k})")
    if facts.swa_layers and any(facts.swa_layers):
        kinds.append(f"sliding window {facts.sliding_window} on {sum(facts.swa_layers)} of {facts.n_layer} layers")
    if facts.recurrent_layers and any(facts.recurrent_layers):
        kinds.append(f"recurrent state on {sum(facts.recurrent_layers)} layers")
    if facts.n_expert:
        kinds.append(f"MoE {facts.n_expert_used} of {facts.n_expert} experts")
    return f"{facts.architecture}, {facts.n_layer} layers, " + ", ".join(kinds)


def _mib(size: float) -> str:
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / MIB:.1f} MiB"


def _text(result: Estimate, gpus: list[int], host: int | None, largest: int, short: list) -> str:
    facts, settings = result.facts, result.settings
    slots = max(1, settings.parallel)
    lines = [
        f"{os.path.basename(facts.source)}: {_describe(facts)}",
        (f"load: context {result.n_ctx} ({slots} slot{'s' if slots > 1 else ''} of {result.n_ctx_seq}), "
         f"ubatch {min(settings.ubatch, settings.batch)}, KV {settings.cache_type_k}/{settings.cache_type_v}, "
         f"flash attention {'on' if result.flash_attn else 'off'}"),
        "",
        f"{'device':<8}{'weights':>12}{'KV':>12}{'recurrent':>12}{'compute':>12}{'output':>12}{'total':>12}",
    ]
    for need in result.devices:
        lines.append(
            f"{need.device:<8}{_mib(need.weights):>12}{_mib(need.kv):>12}{_mib(need.recurrent):>12}"
            f"{_mib(need.compute):>12}{_mib(need.output):>12}{_mib(need.total):>12}"
        )
    lines += ["", f"KV cache per token of context: {result.kv_bytes_per_token:,.0f} bytes"]
    where = ", ".join(_mib(size) for size in gpus) if gpus else f"{_mib(host or 0)} of free RAM"
    own = (facts.n_ctx_train or 0) * (1 if settings.kv_unified else slots)
    capped = " (the model's own context: it is trained for no more)" if largest and largest >= own else ""
    lines.append(f"largest context that fits {where}: {largest}{capped}" if largest else f"no context fits {where}")
    for shortfall in short:
        lines.append(
            f"does not fit: {shortfall.device} needs {_mib(shortfall.needs)} and has {_mib(shortfall.has)}; "
            f"the largest term is {shortfall.largest_term} ({_mib(shortfall.largest_bytes)}): {advice(result, shortfall)}"
        )
    lines += list(result.notes)
    return "\n".join(lines)


def _document(result: Estimate, gpus: list[int], host: int | None, largest: int, short: list) -> dict[str, Any]:
    return {
        "model": result.facts.source,
        "architecture": result.facts.architecture,
        "settings": asdict(result.settings),
        "n_ctx": result.n_ctx,
        "n_ctx_seq": result.n_ctx_seq,
        "flash_attn": result.flash_attn,
        "devices": [{"device": need.device, **need.terms(), "total": need.total} for need in result.devices],
        "kv_bytes_per_token": result.kv_bytes_per_token,
        "limits": {**{f"GPU{i}": size for i, size in enumerate(gpus)}, **({CPU: host} if host is not None else {})},
        "largest_context": largest,
        "fits": not short,
        "shortfalls": [{**asdict(s), "advice": advice(result, s)} for s in short],
        "notes": list(result.notes),
    }


def _hf(args: argparse.Namespace, facts: ModelFacts, load: EngineLoad) -> int:
    changes: dict[str, Any] = {}
    if args.ctx is not None:
        changes.update(ctx=args.ctx, ctx_auto=False)
    if args.tensor_parallel:
        changes["tensor_parallel"] = args.tensor_parallel
    if args.cache_type is not None:
        dtype = args.cache_type.split(",")[0]
        changes.update(kv_cache_dtype=dtype, kv_bytes=kv_dtype_bytes(load.engine, dtype))
    load = replace(load, **changes)
    claim = engine_claim(load, facts, args.devices or [])
    need = claim.need
    assert need is not None  # the facts are given
    ctx = claim.ctx
    document = {
        "model": facts.source, "architecture": facts.architecture, "engine": load.engine, "ctx": ctx,
        "tensor_parallel": load.tensor_parallel, "devices": load.devices,
        "per_rank": {"weights": need.weights, "kv": need.kv, "total": need.total},
        "kv_bytes_per_token_per_rank": need.kv_bytes_per_token,
        "fraction": claim.fraction, "takes": list(claim.takes), "fits": not claim.short, "detail": claim.detail,
        "notes": [HF_NOTE],
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 1 if claim.short else 0
    print(f"{facts.source}: {facts.architecture}, {facts.n_layer} layers, weights {_mib(facts.weights_bytes)}"
          + (f" ({facts.weights_dtype})" if facts.weights_dtype else ""))
    print(f"per rank of {need.ranks}: weights {_mib(need.weights)}, KV at {ctx} tokens {_mib(need.kv)} "
          f"({need.kv_bytes_per_token:,.0f} bytes per token), together {_mib(need.total)}")
    if claim.takes or args.devices:
        print(claim.detail)
    print(HF_NOTE)
    return 1 if claim.short else 0


HF_NOTE = (
    "vLLM and SGLang size their KV cache to the memory they take, not to the context: what they take "
    "is their claim, and the weights and KV for the context (with vLLM's reserve) the floor it must hold"
)
