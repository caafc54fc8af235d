"""What Ollama's `/api/tags`, `/api/ps` and `/api/show` say about a model, from the config and its file.

A llama-server model's GGUF header (read once per file version, off the loop) gives its
`details` (family, parameter size, quantization), `model_info` (the header's keys) and
`template` (the GGUF's chat template: Jinja, which the backend applies, not a Go template);
its command gives the context and whether it embeds or sees images. `digest` is the file's
sha256 where the Hugging Face cache names the file by it, else a sha256 of the config entry
and the file's identity (path, size, mtime): it changes when the model served does. Models
without a file (a sim, a peer's) are listed with what is known of them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swaplab.config.identity import entry_hash
from swaplab.config.model import ModelConfig
from swaplab.errors import SwaplabError
from swaplab.memory.facts import read_gguf_header
from swaplab.memory.flags import engine_load, engine_of, llama_load, runs_llama_server
from swaplab.memory.ggml import constants

log = logging.getLogger("swaplab.router")

_HEX64 = re.compile(r"[0-9a-f]{64}")
# `model_info` leaves out arrays longer than this (Ollama leaves out the tokenizer's unless `verbose`).
SHORT_ARRAY = 64
FOREVER_SECONDS = 2**63 / 1e9
"""Ollama's `expires_at` of a model kept loaded forever: now plus Go's longest duration."""


@dataclass(frozen=True)
class FileInfo:
    """What a model's file says: its size, age, digest, and from a GGUF header its details and metadata."""

    path: str
    size: int
    modified: float
    digest: str
    details: dict[str, Any] = field(default_factory=dict)
    model_info: dict[str, Any] = field(default_factory=dict)
    template: str = ""
    context_length: int = 0


@dataclass(frozen=True)
class CommandFacts:
    """What a model's command says: its file, its context per sequence, and what it serves."""

    path: str = ""
    context: int = 0
    embedding: bool = False
    vision: bool = False


def command_facts(model: ModelConfig) -> CommandFacts:
    argv = list(model.cmd)
    vision = any(word in ("--mmproj", "-mm", "--mmproj-url") or word.startswith("--mmproj=") for word in argv)
    embedding = any(word in ("--embedding", "--embeddings") for word in argv)
    try:
        if runs_llama_server(argv):
            load = llama_load(argv)
            settings = load.settings
            context = settings.ctx // max(1, settings.parallel) if settings.ctx and not settings.kv_unified else settings.ctx
            return CommandFacts(load.model, context, embedding, vision)
        if engine_of(argv):
            engine = engine_load(argv)
            pooling = any(word in ("embed", "pooling", "embedding") for word in argv)
            return CommandFacts(engine.model, engine.ctx, pooling, vision)
    except SwaplabError:
        pass
    return CommandFacts(embedding=embedding, vision=vision)


def file_info(model: ModelConfig) -> FileInfo | None:
    """The model's file as Ollama's listings describe it; None when its command names no file that exists."""
    path = command_facts(model).path
    if not path:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _file_info(path, stat.st_size, stat.st_mtime_ns, entry_hash(model), os.path.isdir(path))


@functools.lru_cache(maxsize=256)
def _file_info(path: str, size: int, mtime_ns: int, entry: str, folder: bool) -> FileInfo:
    modified = mtime_ns / 1e9
    if folder:
        return _folder_info(path, modified, entry)
    digest = _digest(path, size, mtime_ns, entry)
    try:
        metadata, _, tensors = read_gguf_header(path)
    except SwaplabError as error:
        log.info("no GGUF details for %s: %s", path, error)
        return FileInfo(path, size, modified, digest)
    parameters = sum(_elements(tensor.shape) for tensor in tensors)
    architecture = str(metadata.get("general.architecture") or "")
    details = {
        "parent_model": "",
        "format": "gguf",
        "family": architecture,
        "families": [architecture] if architecture else [],
        "parameter_size": str(metadata.get("general.size_label") or _human(parameters)),
        "quantization_level": _quantization(metadata, tensors),
    }
    info: dict[str, Any] = {}
    for key, value in metadata.items():
        if key == "tokenizer.chat_template":
            continue
        info[key] = [] if isinstance(value, list) and len(value) > SHORT_ARRAY else value
    info.setdefault("general.parameter_count", parameters)
    template = metadata.get("tokenizer.chat_template")
    context = metadata.get(f"{architecture}.context_length")
    return FileInfo(
        path, size, modified, digest, details, info, template if isinstance(template, str) else "",
        context if isinstance(context, int) else 0,
    )


def _folder_info(path: str, modified: float, entry: str) -> FileInfo:
    """A Hugging Face model folder (vLLM, SGLang): safetensors, its config's model type as the family."""
    import json

    size = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                size += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    family = ""
    try:
        config = json.loads(Path(path, "config.json").read_text())
        family = str(config.get("model_type") or "") if isinstance(config, dict) else ""
    except (OSError, ValueError):
        pass
    details = {"parent_model": "", "format": "safetensors", "family": family, "families": [family] if family else [],
               "parameter_size": "", "quantization_level": ""}
    return FileInfo(path, size, modified, _digest(path, size, int(modified * 1e9), entry), details)


def _digest(path: str, size: int, mtime_ns: int, entry: str) -> str:
    real = os.path.realpath(path)
    if os.path.basename(os.path.dirname(real)) == "blobs" and _HEX64.fullmatch(os.path.basename(real)):
        return os.path.basename(real)  # the Hugging Face cache names a blob by its sha256
    return hashlib.sha256(f"{entry}\0{real}\0{size}\0{mtime_ns}".encode()).hexdigest()


def name_digest(name: str) -> str:
    """A model without a file (a sim, a peer's): a sha256 of its name, as 64 hex digits like any other."""
    return hashlib.sha256(name.encode()).hexdigest()


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _human(count: int) -> str:
    """A parameter count as Ollama writes one: `7.6B`, `135M`."""
    if count >= 1_000_000_000:
        return f"{count / 1e9:.1f}B"
    if count >= 1_000_000:
        return f"{count / 1e6:.0f}M"
    if count >= 1000:
        return f"{count / 1e3:.0f}K"
    return str(count)


def _quantization(metadata: dict[str, Any], tensors: list) -> str:
    """`general.file_type` by llama.cpp's name for it (`Q4_K_M`), else the most common tensor type."""
    file_type = metadata.get("general.file_type")
    if isinstance(file_type, int):
        try:
            name = constants().LlamaFileType(file_type).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    counts: dict[str, int] = {}
    for tensor in tensors:
        counts[tensor.type_name] = counts.get(tensor.type_name, 0) + tensor.n_bytes
    return max(counts, key=counts.__getitem__) if counts else ""


def capabilities(model: ModelConfig, info: FileInfo | None) -> list[str]:
    """Ollama's capability names, from the command, the config's `capabilities` and the chat template."""
    facts = command_facts(model)
    template = info.template if info is not None else ""
    found = ["embedding"] if facts.embedding else ["completion"]
    if not facts.embedding:
        if model.capabilities.tools or "tools" in template:
            found.append("tools")
        if "<think>" in template or "enable_thinking" in template or "reasoning_content" in template:
            found.append("thinking")
    if facts.vision or "image" in model.capabilities.input:
        found.append("vision")
    return found


def ollama_name(name: str) -> str:
    """A name as Ollama lists it: with its tag, `:latest` where it has none."""
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def parameters_text(model: ModelConfig, context: int) -> str:
    """`/api/show`'s `parameters`: what the config fixes for every request, one `name value` per line."""
    lines = []
    if context:
        lines.append(f"num_ctx {context}")
    for key, value in sorted((model.filters.set_params or {}).items()):
        lines.append(f"{key} {value}")
    return "\n".join(f"{line.split(' ', 1)[0]:<30} {line.split(' ', 1)[1]}" for line in lines)
