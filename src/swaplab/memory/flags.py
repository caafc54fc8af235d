"""The load a command line asks for: model file and `LoadSettings` from llama-server's flags,
or the model folder, tensor parallelism and cache type from vLLM's and SGLang's.

`--flag value` and `--flag=value` both count, the last one wins, as in llama.cpp's own
parser. Flags that do not size memory are skipped; a value that is not a number where one
must be is a `FlagError` naming it.
"""

from __future__ import annotations

import os
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
    if name == "tensor_split":
        try:
            return tuple(float(part) for part in value.replace("/", ",").split(",") if part)
        except ValueError:
            raise FlagError(f"{flag} {value!r}: not numbers separated by commas") from None
    lowered = value.lower()
    if lowered not in CACHE_TYPES:
        raise FlagError(f"{flag} {value!r}: not a cache type llama.cpp knows ({', '.join(CACHE_TYPES)})")
    return lowered
