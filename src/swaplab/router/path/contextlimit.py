"""A request too long for its model's context, answered with what to change.

llama.cpp, vLLM and SGLang refuse such a request with a 400 in their own words ("request
(9000 tokens) exceeds the available context size (8192 tokens), try increasing it"), which
name neither the config entry nor its flag. `explain` adds both to the message: the entry,
the flag with its value now, and what to raise. The body keeps the engine's JSON shape
(OpenAI's and Anthropic's `error.message`, SGLang's top-level `message`); only the message
changes. The engines' messages and flags are their contracts' (`errors.exceed_context`,
`memory.context_flags`, `memory.slots`). The relay hands it an upstream's answer only when
that is a small error, so a success never comes here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from swaplab.builtin.defaults import DEFAULT_CONFIG_NAME
from swaplab.config.model import ModelConfig
from swaplab.engines import Contract, contract, engine_of
from swaplab.engines.commandline import flag_given

# llama.cpp pads each slot's share of --ctx-size up to a multiple of this (llama-context.cpp:294).
LLAMA_CONTEXT_PAD = 256


def explain(config_path: str, model: ModelConfig, status: int, body: bytes) -> bytes | None:
    """`body` with what to change added to its message, when it is the model's engine refusing a
    request too long for its context; None for any other answer."""
    engine = engine_of(model.cmd)
    if engine is None:
        return None
    facts = contract(engine)
    limit = facts.errors.exceed_context
    if limit is None or status != limit.status:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    holder = _message_holder(document)
    if holder is None:
        return None
    message: str = holder["message"].rstrip()
    figures = limit.figures(message)
    if figures is None or "context_tokens" not in figures:
        return None
    stop = "" if message.endswith(".") else "."
    holder["message"] = f"{message}{stop} {advice(config_path, model.id, model.cmd, facts, figures)}"
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def _message_holder(document: Any) -> dict[str, Any] | None:
    """The mapping whose `message` is the error's: `error` (OpenAI, Anthropic, llama.cpp, vLLM) or the
    document itself (SGLang's `{"object": "error", "message": ...}`)."""
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error
    if isinstance(document.get("message"), str):
        return document
    return None


def advice(config_path: str, model_id: str, argv: Sequence[str], facts: Contract, figures: dict[str, int]) -> str:
    """What to change in the entry so a request of `figures["prompt_tokens"]` fits: the entry, its
    context flag as written, and (llama.cpp) the slots that split it."""
    context = figures["context_tokens"]
    prompt = figures.get("prompt_tokens")
    memory = facts.memory
    flag = next((spelling for spelling in memory.context_flags if spelling.startswith("--")), "its context flag")
    given = flag_given(argv, memory.context_flags)
    size = _whole(given[1]) if given is not None else None
    slots, parallel = _slots(argv, facts)
    unified = _unified(argv, facts)
    split = slots is not None and parallel > 1 and not unified
    where = "the built-in default" if config_path == DEFAULT_CONFIG_NAME else config_path
    cmd = f"models.{model_id}.cmd"

    if given is None:
        setting = f"its cmd sets no {flag}, so {facts.name} chose it"
    elif split:
        setting = f"{given[0]} {given[1]} / {slots} {parallel}"
    elif slots is not None and parallel > 1:
        setting = f"{given[0]} {given[1]}, shared by {slots} {parallel} slots"
    else:
        setting = f"{given[0]} {given[1]}"
    text = f"Model {model_id} in {where} gives each request {context:,} tokens ({setting}); "

    asked = _per_request(size, parallel if split else 1)
    if size == 0 or (asked is not None and asked > context):
        # The engine gave less than the flags ask, or all it can (llama.cpp's -c 0): the model's
        # trained context caps it, so a bigger flag changes nothing.
        cap = f" (the {asked:,} its flags ask is capped at the model's trained context)" if size else ""
        text += f"that is the most {facts.name} gives this model{cap}: a longer request needs a model trained for one"
    else:
        named = given[0] if given is not None else flag
        text += f"{'raise' if given is not None else 'set'} {named} in {cmd}"
        if prompt is not None:
            text += f" above {prompt * (parallel if split else 1):,}"
            if split:
                text += f" ({prompt:,} tokens x {parallel} slots)"
        if split:
            text += f", or lower {slots}"
    text += "."
    if config_path == DEFAULT_CONFIG_NAME:
        text += " `swaplab config init FILE` writes the built-in default to a file to edit, for `swaplab serve --config FILE`."
    return text


def _slots(argv: Sequence[str], facts: Contract) -> tuple[str | None, int]:
    """The slots flag as written and its value (llama.cpp's --parallel), or (None, 1) where there is none."""
    if facts.memory.slots is None:
        return None, 1
    given = flag_given(argv, facts.memory.slots.flags)
    parallel = _whole(given[1]) if given is not None else None
    if given is None or parallel is None or parallel < 1:
        return None, 1
    return given[0], parallel


def _unified(argv: Sequence[str], facts: Contract) -> bool:
    """Whether every slot may use the whole context (llama.cpp's --kv-unified, the last spelling given)."""
    if facts.memory.slots is None:
        return False
    given = flag_given(argv, facts.memory.slots.kv_unified_flags)
    return given is not None and not given[0].lstrip("-").startswith("no")


def _per_request(size: int | None, parallel: int) -> int | None:
    """What a context flag of `size` over `parallel` slots gives each request, padded as llama.cpp pads it."""
    if size is None or size <= 0:
        return None
    if parallel <= 1:
        return size
    return math.ceil(size / parallel / LLAMA_CONTEXT_PAD) * LLAMA_CONTEXT_PAD


def _whole(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
