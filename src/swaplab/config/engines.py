"""Preconditions an engine's release sets, checked on each model entry before they bite.

A vLLM entry whose requests name a model the server does not serve never becomes ready; a
`sleep:` whose engine was started without its sleep flags answers 200 and frees nothing, or
wakes with garbage weights; a TabbyAPI sleep without its admin key gets 401 every time.
Each rule reads the engine's contract (`swaplab.engines`) and says, at the entry's
`FILE:LINE`, what to add. A fault where the entry cannot work, a warning where part of it
cannot (an alias that will be refused).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping

from swaplab.config.model import ModelConfig
from swaplab.config.reader import Findings
from swaplab.config.tree import Entry
from swaplab.engines import Contract, command_env, contract, engine_of, flag_value, flag_values, has_flag
from swaplab.errors import SwaplabError
from swaplab.memory.flags import engine_load


def check_engines(
    findings: Findings, models: Mapping[str, ModelConfig], model_entries: Mapping[str, Entry],
    environ: Mapping[str, str] | None = None,
) -> None:
    """Each model whose command runs a known engine, held to that engine's contract."""
    environ = os.environ if environ is None else environ
    for model in models.values():
        engine = engine_of(model.cmd)
        lines = _key_lines(model_entries.get(model.id))
        if engine is not None:
            _served_name(findings, model, contract(engine), lines)
        if model.sleep is not None:
            _sleep_engine(findings, model, engine, lines, environ)


def _sleep_engine(
    findings: Findings, model: ModelConfig, engine: str | None, lines: dict[str, int], environ: Mapping[str, str]
) -> None:
    """A `sleep:` held to the engine its cmd runs: the same engine, its sleep flags and env, its keys."""
    assert model.sleep is not None
    line = lines.get("sleep", model.line)
    declared = model.sleep.engine
    if engine is not None and declared == engine:
        _sleep_flags(findings, model, contract(engine), lines, environ)
    elif declared in ("vllm", "sglang") and engine is not None:
        findings.fault(line, f"models.{model.id}.sleep: engine {declared} but its cmd runs {contract(engine).name}")
    elif declared in ("vllm", "sglang") and model.cmd:
        name = contract(declared).name
        findings.warn(line, f"models.{model.id}.sleep: its cmd does not show {name} (a wrapper script?), so its sleep "
                            f"flags cannot be checked here: a sleep is believed only where {name}'s own report or NVML "
                            "shows memory freed (docs/sleep.md)")
    if engine == "tabby" and not engine_key(model)[0]:
        tabby = contract("tabby")
        disabled = flag_value(model.cmd, getattr(tabby.auth, "disable_flags", None) or ())
        if (disabled or "").lower() not in ("true", "1"):
            findings.fault(
                line,
                f"models.{model.id}.sleep: {tabby.name} refuses its load and unload calls without its admin key "
                f"({_refusal(tabby)}): give the entry `apiKey:` (the admin_key of its api_tokens.yml, e.g. "
                "`${env.TABBY_ADMIN_KEY}`), or start it with --disable-auth true",
            )


def served_names(model: ModelConfig, facts: Contract) -> tuple[str, ...] | None:
    """The names the engine answers to, from its command line; None when it answers to any."""
    if facts.served_name.any_name_accepted or facts.served_name.unknown_model is None:
        return None
    names = flag_values(model.cmd, facts.served_name.flags)
    if names:
        return tuple(names)
    try:
        return (engine_load(model.cmd).model,)
    except SwaplabError:
        return None  # no model on the command line: nothing to hold the names to


def sent_names(model: ModelConfig) -> tuple[str, ...]:
    """The `model` values requests for this entry carry upstream: `useModelName`, else each name it is asked by."""
    return (model.use_model_name,) if model.use_model_name else (model.id, *model.aliases)


def _served_name(findings: Findings, model: ModelConfig, facts: Contract, lines: dict[str, int]) -> None:
    served = served_names(model, facts)
    if served is None:
        return
    refused = facts.served_name.unknown_model
    assert refused is not None
    how = f"{facts.name} answers {refused.status} to any other model ({refused.origin})"
    first, *aliases = sent_names(model)
    if first not in served:
        line = lines.get("useModelName" if model.use_model_name else "cmd", model.line)
        findings.fault(
            line,
            f"models.{model.id}: requests reach {facts.name} as model '{first}', but it serves only "
            f"{_names(served)}: {how}, so it never becomes ready. Add `useModelName: {served[0]}` to the entry, "
            f"or `{facts.served_name.flags[0] if facts.served_name.flags else '--served-model-name'} {model.id}` to its cmd",
        )
    missing = [alias for alias in aliases if alias not in served]
    if missing and first in served:
        findings.warn(
            lines.get("aliases", model.line),
            f"models.{model.id}.aliases: {_names(tuple(missing))} reach {facts.name} under that name, which it does "
            f"not serve ({how}): add `useModelName: {served[0]}` to the entry",
        )


def _sleep_flags(
    findings: Findings, model: ModelConfig, facts: Contract, lines: dict[str, int], environ: Mapping[str, str]
) -> None:
    sleep = facts.sleep
    if sleep is None or model.sleep is None or model.sleep.engine == "http":
        return
    line = lines.get("sleep", model.line)
    missing = [flag for flag in sleep.requires.flags if not has_flag(model.cmd, (flag,))]
    if missing:
        findings.fault(
            line,
            f"models.{model.id}.sleep: its cmd lacks {' '.join(missing)}: without it {facts.name} answers the sleep call "
            f"and frees nothing ({_origin(sleep.requires.why, missing[0])}), so the next model runs out of memory. "
            f"Add {' '.join(missing)} to its cmd",
        )
    env = {**environ, **command_env(model.cmd, model.env)}
    unset = [f"{name}={value}" for name, value in sleep.requires.env.items() if env.get(name) != value]
    if unset:
        findings.fault(
            line,
            f"models.{model.id}.sleep: {facts.name} serves its sleep calls only with {' '.join(unset)} in its "
            f"environment ({_origin(sleep.requires.why, unset[0].split('=')[0])}): add `env: [{', '.join(unset)}]` to the entry",
        )
    back = sleep.weights_back_requires
    if back is not None:
        absent = [flag for flag in back.flags if not has_flag(model.cmd, (flag,))]
        if absent:
            findings.fault(
                line,
                f"models.{model.id}.sleep: its cmd lacks {' '.join(absent)}: {facts.name} would wake with its weights "
                f"gone and still pass a readiness check ({_origin(back.why, absent[0])}). Add {' '.join(absent)} to its cmd",
            )


def _origin(why: str, near: str = "") -> str:
    """The `file:line` a contract's prose cites first after it names `near` (else its first), for a
    message; the whole text is in the fixture and docs/."""
    citation = r"[\w./-]+\.(?:py|cpp|h):[\d-]+"
    found = re.search(citation, why[max(0, why.find(near)):] if near else why) or re.search(citation, why)
    return found.group(0) if found else "see docs/sleep.md"


def engine_key(model: ModelConfig) -> tuple[str, str]:
    """The keys the router's own calls to the model's server carry: (its API key, its admin key), each
    "" when none. The entry's `apiKey` wins; else the engine's own flags and environment (`--api-key`,
    `VLLM_API_KEY`, SGLang's `--admin-api-key`)."""
    return _engine_key(model.cmd, model.api_key, model.env)


@functools.lru_cache(maxsize=256)  # asked on every request to a model: read its command once
def _engine_key(cmd: tuple[str, ...], api_key: str, entry_env: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    engine = engine_of(cmd)
    if engine is None:
        return api_key, ""
    auth = contract(engine).auth
    # `--api-key a,b` (llama.cpp) and `--api-key a b` (vLLM) take several: the first serves.
    key = api_key or (flag_value(cmd, auth.flags) or "").split(",")[0]
    if not key:
        env = command_env(cmd, entry_env)
        key = next((env[name] for name in auth.env if env.get(name)), "")
    admin = flag_value(cmd, auth.admin.flags) if auth.admin is not None else None
    return key, admin or ""


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{name}'" for name in names)


def _key_lines(entry: Entry | None) -> dict[str, int]:
    """The line of each key of a model's entry."""
    if entry is None or not entry.item.is_mapping:
        return {}
    return {key: child.key_line for key, child in entry.item.value.items()}


def call_headers(model: ModelConfig, path: str) -> dict[str, str]:
    """The credentials for the router's own call to `path` on the model's server (readiness, `/slots`,
    sleep and wake), sent as the engine reads them; {} when its server has no key."""
    key, admin = engine_key(model)
    if not key and not admin:
        return {}
    engine = engine_of(model.cmd)
    auth = contract(engine).auth if engine is not None else None
    route = path.split("?", 1)[0]
    if auth is not None and auth.admin is not None and route in auth.admin.routes and admin:
        key = admin
    if not key:
        return {}
    return auth.headers(key) if auth is not None else {"Authorization": f"Bearer {key}"}


def _refusal(facts: Contract) -> str:
    """How the engine refuses an admin call without its key: status and origin."""
    refused = facts.auth.admin.refused if facts.auth.admin is not None else None
    refused = refused or facts.auth.refused
    return f"{refused.status}; {refused.origin}" if refused is not None else "401"
