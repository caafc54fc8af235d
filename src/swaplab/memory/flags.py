"""The load a command line asks for: model file and `LoadSettings` from llama-server's flags,
or the model, parallelism, context, cache dtype and memory share from vLLM's and SGLang's
(their spellings and parsers as the engines' contracts have them).

`--flag value` and `--flag=value` both count, the last one wins, as in llama.cpp's own
parser. Flags that do not size memory are skipped; a value that is not a number where one
must be is a `FlagError` naming it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Literal

from swaplab.engines import contract, flag_value, has_flag
from swaplab.engines import engine_of as command_engine
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
# Their flag spellings, cache dtypes and number parsers are the engines' own, as their
# contracts have them (swaplab/engines/contracts/{vllm,sglang}.yaml, each with its file:line).

ENGINES = ("vllm", "sglang")
_MODEL_FLAGS = {"vllm": ("--model",), "sglang": ("--model-path", "--model")}
MODEL_DTYPE_BYTES = 2.0
"""Bytes per KV element where the cache takes the model's dtype (`auto`): both engines serve a
checkpoint in 16 bits unless told otherwise, a float32 one too (vllm/config/model.py:2484-2485)."""


@dataclass(frozen=True)
class EngineLoad:
    """What a vLLM or SGLang command line says about its memory."""

    engine: str
    model: str
    """A local folder or a Hugging Face repo id."""
    tensor_parallel: int = 1
    data_parallel: int = 1
    """Replicas, each on tensor_parallel x pipeline_parallel GPUs of its own."""
    pipeline_parallel: int = 1
    ctx: int = 0
    """--max-model-len / --context-length; 0 = the model's own."""
    ctx_auto: bool = False
    """vLLM's `-1`/`auto`: the longest context that fits the KV cache it gets."""
    kv_cache_dtype: str = "auto"
    kv_bytes: float | None = None
    """Bytes per K or V element of that dtype; None = the model's dtype (`kv_element_bytes`)."""
    fraction: float | None = None
    """The share on the command line (--gpu-memory-utilization, --mem-fraction-static); None: the engine's default."""
    kv_cache_bytes: int | None = None
    """vLLM's --kv-cache-memory-bytes: the KV cache's size on each GPU, whatever the share."""

    @property
    def devices(self) -> int:
        """GPUs the load spans: tensor x data x pipeline parallel ranks."""
        return self.tensor_parallel * self.data_parallel * self.pipeline_parallel

    @property
    def kv_element_bytes(self) -> float:
        return MODEL_DTYPE_BYTES if self.kv_bytes is None else self.kv_bytes


def engine_of(argv: Sequence[str]) -> str | None:
    """"vllm" or "sglang" for a command line that runs one (its program, a `python -m` module, a
    container image, or `swaplab sim --engine` standing in for it), else None."""
    engine = command_engine(argv)
    return engine if engine in ENGINES else None


def engine_load(argv: Sequence[str]) -> EngineLoad:
    """The model, parallelism, context, KV dtype and memory flags of a vLLM/SGLang command."""
    engine = engine_of(argv)
    if engine is None:
        raise FlagError("not a vLLM or SGLang command")
    memory = contract(engine).memory
    words = list(argv)
    model = flag_value(words, _MODEL_FLAGS[engine]) or (_served(words) if engine == "vllm" else None)
    if not model:
        raise FlagError(f"no model in the {engine} command (vllm serve MODEL, --model, --model-path)")
    data_parallel = _whole(words, memory.data_parallel_flags)
    if engine == "sglang" and has_flag(words, ("--enable-dp-attention",)):
        data_parallel = 1  # --dp-size N with it is attention DP inside the TP ranks (sglang/srt/server_args.py:417-424)
    context = flag_value(words, memory.context_flags)
    ctx = context_value(engine, context) if context is not None else 0
    dtype = flag_value(words, memory.kv_cache_dtype_flags) or "auto"
    kv_cache_bytes = flag_value(words, memory.kv_cache_bytes_flags)
    kv_flag = memory.kv_cache_bytes_flags[0] if memory.kv_cache_bytes_flags else ""
    return EngineLoad(
        engine, model,
        tensor_parallel=_whole(words, memory.tensor_parallel_flags),
        data_parallel=data_parallel,
        pipeline_parallel=_whole(words, memory.pipeline_parallel_flags),
        ctx=ctx if isinstance(ctx, int) and ctx > 0 else 0,
        ctx_auto=ctx == "auto",
        kv_cache_dtype=dtype,
        kv_bytes=kv_dtype_bytes(engine, dtype),
        fraction=_fraction(words, memory.utilization.flags if memory.utilization else ()),
        kv_cache_bytes=None if kv_cache_bytes is None else human_int(engine, kv_cache_bytes, kv_flag),
    )


def _served(words: list[str]) -> str | None:
    """`vllm serve MODEL`: the word after `serve`, where it is not a flag."""
    for index, word in enumerate(words[:-1]):
        if word == "serve" and not words[index + 1].startswith("-"):
            return words[index + 1]
    return None


def _whole(words: list[str], spellings: Sequence[str]) -> int:
    value = flag_value(words, spellings)
    if value is None:
        return 1
    try:
        count = int(value)
    except ValueError:
        raise FlagError(f"{spellings[0]} {value!r}: not a whole number") from None
    if count < 1:
        raise FlagError(f"{spellings[0]} {value!r}: must be 1 or more")
    return count


def _fraction(words: list[str], spellings: Sequence[str]) -> float | None:
    value = flag_value(words, spellings)
    if value is None:
        return None
    try:
        fraction = float(value)
    except ValueError:
        raise FlagError(f"{spellings[0]} {value!r}: not a number") from None
    if not 0 < fraction <= 1:
        raise FlagError(f"{spellings[0]} {value!r}: a share of the GPU, above 0 and at most 1")
    return fraction


def kv_dtype_bytes(engine: str, dtype: str) -> float | None:
    """Bytes per K or V element of an engine's --kv-cache-dtype (its contract's `kv_cache_dtypes`);
    None for the model's own dtype."""
    dtypes = contract(engine).memory.kv_cache_dtypes
    if dtype not in dtypes:
        raise FlagError(f"--kv-cache-dtype {dtype!r}: not one whose size swaplab knows for {contract(engine).name} "
                        f"(one of {', '.join(dtypes)})")
    return dtypes[dtype]


def context_value(engine: str, text: str) -> int | Literal["auto"]:
    """A context flag's value as the engine parses it: vLLM's `human_readable_int_or_auto`
    ("auto" for -1 or auto), SGLang's `human_readable_int` (-1 is just -1 there)."""
    if engine == "vllm" and (text.strip() == "-1" or text.strip().lower() == "auto"):
        return "auto"  # vllm/utils/argparse_utils.py:77-93
    return human_int(engine, text, contract(engine).memory.context_flags[0])


def human_int(engine: str, text: str, flag: str) -> int:
    """An integer with the engine's own suffixes: vLLM's k/m/g/t decimal and K/M/G/T binary
    (vllm/utils/argparse_utils.py:30-74), SGLang's case-sensitive k/M/G/T and Ki/Mi/Gi/Ti
    (sglang/srt/utils/common.py:3394-3429). Decimals only with the decimal suffixes."""
    value = text.strip()
    pattern = r"(\d+(?:\.\d+)?)([kKmMgGtT])" if engine == "vllm" else r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)"
    found = re.fullmatch(pattern, value)
    if found:
        number, suffix = found.groups()
        binary = suffix.endswith("i") if engine == "sglang" else suffix.isupper()
        if binary:
            if "." in number:
                raise FlagError(f"{flag} {text!r}: no decimals with a binary suffix ({suffix})")
            return int(number) * 2 ** (10 * ("KMGT".index(suffix[0].upper()) + 1))
        power = 10 ** (3 * ("kmgt".index(suffix.lower()) + 1))
        # vLLM multiplies a float, SGLang a Decimal: 25.6k is 25600 in both, but not always alike.
        return int(float(number) * power) if engine == "vllm" else int(Decimal(number) * power)
    try:
        return int(value)
    except ValueError:
        suffixes = "k, m, g, t (x1000) or K, M, G, T (x1024)" if engine == "vllm" else "k, M, G, T or Ki, Mi, Gi, Ti"
        raise FlagError(f"{flag} {text!r}: not a whole number (suffixes: {suffixes})") from None
