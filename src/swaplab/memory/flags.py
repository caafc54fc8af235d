"""The load a command line asks for: model file and `LoadSettings` from llama-server's flags,
or the model folder, tensor parallelism and cache type from vLLM's and SGLang's.

`--flag value` and `--flag=value` both count, the last one wins, as in llama.cpp's own
parser. Flags that do not size memory are skipped; a value that is not a number where one
must be is a `FlagError` naming it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from swaplab.errors import SwaplabError
from swaplab.memory.estimate import CACHE_TYPES, LoadSettings

# llama-server's spellings -> LoadSettings field (or "model").
_LLAMA_VALUE_FLAGS = {
    "-m": "model", "--model": "model",
    "-c": "ctx", "--ctx-size": "ctx",
    "-np": "parallel", "--parallel": "parallel",
    "-b": "batch", "--batch-size": "batch",
    "-ub": "ubatch", "--ubatch-size": "ubatch",
    "-ctk": "cache_type_k", "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v",
    "-ngl": "gpu_layers", "--gpu-layers": "gpu_layers", "--n-gpu-layers": "gpu_layers",
    "-ts": "tensor_split", "--tensor-split": "tensor_split",
    "-ncmoe": "n_cpu_moe", "--n-cpu-moe": "n_cpu_moe",
    "-ot": "override_tensor", "--override-tensor": "override_tensor",
}
_LLAMA_SWITCHES = {
    "--swa-full": ("swa_full", True),
    "-kvu": ("kv_unified", True), "--kv-unified": ("kv_unified", True),
    "-nkvo": ("no_kv_offload", True), "--no-kv-offload": ("no_kv_offload", True),
    "--no-mmap": ("mmap", False),
    "-nr": ("repack", False), "--no-repack": ("repack", False),
    "-cmoe": ("n_cpu_moe", 1 << 30), "--cpu-moe": ("n_cpu_moe", 1 << 30),
}
_FLASH = ("-fa", "--flash-attn")
_INTEGERS = {"ctx", "parallel", "batch", "ubatch", "gpu_layers", "n_cpu_moe"}


class FlagError(SwaplabError):
    """A command line whose memory flags cannot be read."""


@dataclass(frozen=True)
class LlamaLoad:
    model: str
    settings: LoadSettings
    wrapper: bool
    """swaplab's built-in wrapper (its -c defaults to 4096, not the model's context)."""


def runs_llama_server(argv: Sequence[str]) -> bool:
    """Whether argv starts llama-server or swaplab's xllamacpp wrapper of it."""
    if not argv:
        return False
    return os.path.basename(argv[0]) == "llama-server" or _is_wrapper(argv)


def _is_wrapper(argv: Sequence[str]) -> bool:
    return list(argv[1:3]) == ["-m", "swaplab.builtin.llamacpp"]


def llama_load(argv: Sequence[str]) -> LlamaLoad:
    """The model and settings of a llama-server (or built-in wrapper) command line."""
    words = list(argv[3:] if _is_wrapper(argv) else argv[1:])
    wrapper = _is_wrapper(argv)
    values: dict[str, object] = {"ctx": 4096} if wrapper else {}
    model = ""
    index = 0
    while index < len(words):
        word = words[index]
        flag, equals, inline = word.partition("=")
        if flag in _LLAMA_VALUE_FLAGS:
            if equals:
                value = inline
            elif index + 1 < len(words):
                index += 1
                value = words[index]
            else:
                raise FlagError(f"{flag} needs a value")
            name = _LLAMA_VALUE_FLAGS[flag]
            if name == "model":
                model = value
            elif name == "override_tensor":  # repeatable: each -ot adds its pairs
                values[name] = (*values.get(name, ()), *_value(flag, name, value))  # type: ignore[misc]
            else:
                values[name] = _value(flag, name, value)
        elif flag in _FLASH:
            # -fa on|off|auto; older llama-server had a bare -fa meaning on.
            following = inline if equals else (words[index + 1] if index + 1 < len(words) else "")
            if following in ("on", "off", "auto", "1", "0"):
                values["flash_attn"] = {"1": "on", "0": "off"}.get(following, following)
                index += 0 if equals else 1
            else:
                values["flash_attn"] = "on"
        elif word in _LLAMA_SWITCHES:
            name, switch = _LLAMA_SWITCHES[word]
            values[name] = switch
        index += 1
    if not model:
        raise FlagError("no -m/--model FILE.gguf in the command (a -hf download has no file to read before it loads)")
    return LlamaLoad(model, replace(LoadSettings(), **values), wrapper)  # type: ignore[arg-type]


def _value(flag: str, name: str, value: str) -> object:
    if name in _INTEGERS:
        if name == "gpu_layers" and value in ("all", "auto"):
            return -1
        try:
            return int(value)
        except ValueError:
            raise FlagError(f"{flag} {value!r}: not a whole number") from None
    if name == "override_tensor":
        pairs = []
        for part in value.split(","):
            pattern, equals, buffer = part.rpartition("=")
            if not equals or not pattern:
                raise FlagError(f"{flag} {part!r}: give PATTERN=BUFFER, e.g. 'exps=CPU'")
            try:
                re.compile(pattern)
            except re.error as error:
                raise FlagError(f"{flag} {pattern!r}: not a regular expression ({error})") from None
            pairs.append((pattern, buffer))
        return tuple(pairs)
    if name == "tensor_split":
        try:
            return tuple(float(part) for part in value.replace("/", ",").split(",") if part)
        except ValueError:
            raise FlagError(f"{flag} {value!r}: not numbers separated by commas") from None
    lowered = value.lower()
    if lowered not in CACHE_TYPES:
        raise FlagError(f"{flag} {value!r}: not a cache type llama.cpp knows ({', '.join(CACHE_TYPES)})")
    return lowered


# -- vLLM and SGLang ------------------------------------------------------------------

_ENGINE_FLAGS = {
    "vllm": {
        "--model": "model", "--tensor-parallel-size": "tensor_parallel", "-tp": "tensor_parallel",
        "--max-model-len": "ctx", "--kv-cache-dtype": "kv_cache_dtype", "--gpu-memory-utilization": "fraction",
    },
    "sglang": {
        "--model-path": "model", "--model": "model", "--tp-size": "tensor_parallel", "--tp": "tensor_parallel",
        "--context-length": "ctx", "--kv-cache-dtype": "kv_cache_dtype", "--mem-fraction-static": "fraction",
    },
}
# vLLM's default share of each GPU; SGLang's depends on the GPU's size, so it is not assumed.
DEFAULT_FRACTION = {"vllm": 0.9}
KV_DTYPE_BYTES = {"auto": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_inc": 1.0, "bfloat16": 2.0, "float16": 2.0}


@dataclass(frozen=True)
class EngineLoad:
    """What a vLLM or SGLang command line says about its memory."""

    engine: str
    model: str
    """A local folder or a Hugging Face repo id."""
    tensor_parallel: int = 1
    ctx: int = 0
    """--max-model-len / --context-length; 0 = the model's own."""
    kv_bytes: float = 2.0
    fraction: float | None = None
    """The share of each GPU it takes (--gpu-memory-utilization, --mem-fraction-static)."""


def engine_of(argv: Sequence[str]) -> str | None:
    """"vllm" or "sglang" for a command line that runs one (its program, a `python -m` module or
    a container image), else None. A model path that merely contains the name does not count."""
    for word in argv:
        name = os.path.basename(word.split(":")[0])
        for engine in ("vllm", "sglang"):
            # `vllm`, `python -m vllm.entrypoints...`, `sglang.launch_server`, images
            # `vllm/vllm-openai:latest` and `lmsysorg/sglang:latest`.
            if name == engine or word.startswith(f"{engine}.") or name == f"{engine}-openai":
                return engine
    return None


def engine_load(argv: Sequence[str]) -> EngineLoad:
    """The model, tensor parallelism, context, KV dtype and GPU share of a vLLM/SGLang command."""
    engine = engine_of(argv)
    if engine is None:
        raise FlagError("not a vLLM or SGLang command")
    flags = _ENGINE_FLAGS[engine]
    words = list(argv)
    found: dict[str, str] = {}
    index = 0
    while index < len(words):
        flag, equals, inline = words[index].partition("=")
        if flag in flags:
            if not equals:
                if index + 1 >= len(words):
                    raise FlagError(f"{flag} needs a value")
                index += 1
                inline = words[index]
            found[flags[flag]] = inline
        elif engine == "vllm" and words[index] == "serve" and index + 1 < len(words) and not words[index + 1].startswith("-"):
            found.setdefault("model", words[index + 1])  # `vllm serve MODEL`
        index += 1
    if "model" not in found:
        raise FlagError(f"no model in the {engine} command (vllm serve MODEL, --model, --model-path)")
    dtype = found.get("kv_cache_dtype", "auto").lower()
    if dtype not in KV_DTYPE_BYTES:
        raise FlagError(f"--kv-cache-dtype {dtype!r}: not one of {', '.join(KV_DTYPE_BYTES)}")
    try:
        return EngineLoad(
            engine, found["model"],
            tensor_parallel=int(found.get("tensor_parallel", 1)),
            ctx=int(found.get("ctx", 0)),
            kv_bytes=KV_DTYPE_BYTES[dtype],
            fraction=float(found["fraction"]) if "fraction" in found else DEFAULT_FRACTION.get(engine),
        )
    except ValueError as error:
        raise FlagError(f"a {engine} memory flag is not a number ({error})") from None
