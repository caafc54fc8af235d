"""The `models:` section: each model's macros expanded, `${PORT}` handed out, settings read.

Ports go to models in sorted id order, and only to a model whose `cmd` asks for one, as
llama-swap hands them out. Every `${...}` left once all macros are substituted is a
fault, located in the field, or in the macro that brought it in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from swaplab.config import macros as macro_rules
from swaplab.config.cmd import split_command
from swaplab.config.macros import ENV_NAME, Macro
from swaplab.config.model import ModelConfig
from swaplab.config.tree import Entry, Item, file_of, to_plain
from swaplab.config.upstream import is_http_url, read_filters, read_timeouts
from swaplab.config.yamlreader import YamlSection, shown

DEFAULT_PROXY = "http://localhost:${PORT}"


@dataclass(frozen=True)
class ModelDefaults:
    """The top-level settings a model inherits unless it sets its own."""

    global_ttl: int
    unload_timeout: float
    send_loading_state: bool
    heartbeat_interval: float
    start_port: int


def read_models(
    section: YamlSection | None, global_macros: list[Macro], defaults: ModelDefaults, lines: Mapping[str, list[str]]
) -> dict[str, ModelConfig]:
    """Every model that resolves, in the file's order; `lines` are the file's, for each entry's text."""
    if section is None:
        return {}
    next_port = defaults.start_port
    resolved: dict[str, ModelConfig] = {}
    for model_id in sorted(section.entries):
        section.read_keys.add(model_id)
        entry = section.entries[model_id]
        if not entry.item.is_mapping:
            section.fault(entry, f"expected a mapping of model settings (cmd, proxy, ...), got {shown(entry.item)}")
            continue
        resolved[model_id], uses_port = _model(section, model_id, entry, global_macros, defaults, next_port, lines)
        if uses_port:
            next_port += 1
    return {model_id: resolved[model_id] for model_id in section.entries if model_id in resolved}


def _model(
    models: YamlSection,
    model_id: str,
    entry: Entry,
    global_macros: list[Macro],
    defaults: ModelDefaults,
    port: int,
    lines: Mapping[str, list[str]],
) -> tuple[ModelConfig, bool]:
    path = f"models.{model_id}"
    report = models.findings.fault
    model_macros = macro_rules.read_macros(entry.item.value.get("macros"), f"{path}.macros", report)
    chain_list = macro_rules.merge(global_macros, model_macros, model_id)
    chain = macro_rules.resolve_chain(chain_list, report)

    entries = dict(entry.item.value)
    proxy_defaulted = "proxy" not in entries or entries["proxy"].item.value is None
    if proxy_defaulted:
        entries["proxy"] = Entry("proxy", entry.key_line, Item(DEFAULT_PROXY, entry.key_line, source=DEFAULT_PROXY))
    expanded: dict[str, Entry] = {}
    for key, child in entries.items():
        if key == "macros":
            expanded[key] = child
            continue
        expanded[key] = Entry(key, child.key_line, macro_rules.expand(child.item, chain, f"{path}.{key}", report))

    # ${PORT} is handed out only to a model whose cmd asks for one (llama-swap's rule).
    cmd_text = expanded["cmd"].item.value if "cmd" in expanded else None
    uses_port = isinstance(cmd_text, str) and "${PORT}" in cmd_text
    if uses_port:
        port_macro = {"PORT": Macro("PORT", port, 0, port, "PORT")}
        for key, child in expanded.items():
            if key != "macros":
                expanded[key] = Entry(key, child.key_line, macro_rules.expand(child.item, port_macro, path, report))

    for key, child in expanded.items():
        if key != "macros":
            _check_references(models, child, f"{path}.{key}", chain_list, chain, proxy_defaulted, entry)

    model = YamlSection(models.findings, Item(expanded, entry.item.line), ("models", model_id))
    model.entry("macros")
    built = _build_model(model_id, model, entry, defaults, lines)
    model.finish()
    return built, uses_port


def _check_references(
    models: YamlSection,
    child: Entry,
    path: str,
    chain_list: list[Macro],
    chain: dict[str, Macro],
    proxy_defaulted: bool,
    model_entry: Entry,
) -> None:
    """Fault every `${...}` still in `child` once all macros and `${PORT}` are substituted."""
    report = models.findings.fault
    for item, name in macro_rules.references(child.item):
        if ENV_NAME.match(name):
            continue  # reported as an unset variable already
        if name == "PID":
            if child.key != "cmdStop":
                line = macro_rules.locate(item, "${PID}") or item.line
                report(line, f"{path}: ${{PID}} is only available in cmdStop")
            continue
        if name == "PORT":
            if child.key == "proxy" and proxy_defaulted:
                report(
                    model_entry.key_line,
                    f"{path.rsplit('.', 1)[0]}: cmd does not use ${{PORT}}, so proxy must be set "
                    f"(the default {DEFAULT_PROXY} needs a port from cmd)",
                )
            else:
                line = macro_rules.locate(item, "${PORT}") or item.line
                report(line, f"{path}: uses ${{PORT}} but cmd does not; a port is assigned only when cmd uses ${{PORT}}")
            continue
        explained = macro_rules.explain_unresolved(item, name, chain_list, chain, path)
        if explained is not None:
            report(*explained)


def _build_model(
    model_id: str, model: YamlSection, entry: Entry, defaults: ModelDefaults, lines: Mapping[str, list[str]]
) -> ModelConfig:
    cmd = _command(model, "cmd")
    if cmd is None and model.entry("cmd") is None:
        model.findings.fault(entry.key_line, f"{model.where()}: cmd is required")
    cmd_stop = _command(model, "cmdStop")
    proxy = model.string("proxy", DEFAULT_PROXY)
    proxy_entry = model.entry("proxy")
    if "${" not in proxy and not is_http_url(proxy):
        model.fault(proxy_entry, f"expected an http:// or https:// URL, got '{proxy}'")

    ttl = model.integer("ttl", -1)
    if ttl < -1:
        model.fault(model.entries["ttl"], f"must be 0 (never unload) or more seconds, got {ttl}")
    if ttl < 0:  # -1 is llama-swap's "not set": the global TTL applies
        ttl = defaults.global_ttl
    env = _env(model)
    unload_timeout = model.number("unloadTimeout", 0.0) or defaults.unload_timeout
    devices = _devices(model)
    vram_gib = _vram(model, devices)
    metadata = model.mapping("metadata")
    return ModelConfig(
        id=model_id,
        cmd=tuple(cmd or ()),
        cmd_stop=tuple(cmd_stop) if cmd_stop is not None else None,
        proxy=proxy,
        check_endpoint=model.string("checkEndpoint", "/health"),
        ttl=ttl,
        aliases=tuple(item.text for item in model.strings("aliases")),
        env=env,
        name=model.string("name"),
        description=model.string("description"),
        unlisted=model.boolean("unlisted", False),
        use_model_name=model.string("useModelName"),
        concurrency_limit=model.integer("concurrencyLimit", 0, minimum=0),
        unload_timeout=unload_timeout,
        send_loading_state=model.boolean("sendLoadingState", defaults.send_loading_state),
        heartbeat_interval=model.number("heartbeatInterval", defaults.heartbeat_interval),
        metadata=to_plain(metadata) if metadata is not None else {},
        filters=read_filters(model, legacy_names=True),
        timeouts=read_timeouts(model, response_header=None),
        devices=devices,
        vram_gib=vram_gib,
        raw_text=_raw_text(entry, lines),
        line=entry.key_line,
    )


def _command(model: YamlSection, key: str) -> list[str] | None:
    entry = model.entry(key)
    if entry is None:
        return None
    if not entry.item.is_scalar:
        model.fault(entry, f"expected a command line, got {shown(entry.item)}")
        return None
    try:
        argv = split_command(entry.item.text)
    except ValueError as error:
        model.fault(entry, f"cannot split into arguments: {error}")
        return None
    if not argv:
        model.fault(entry, "is empty once its comment lines are dropped")
        return None
    return argv


def _env(model: YamlSection) -> tuple[tuple[str, str], ...]:
    env = []
    for item in model.strings("env"):
        name, equals, value = item.text.partition("=")
        if not equals or not name.strip():
            model.findings.fault(item.line, f"{model.where('env')}: expected NAME=VALUE, got {item.text!r}")
        else:
            env.append((name, value))
    return tuple(env)


def _devices(model: YamlSection) -> tuple[int, ...]:
    devices = []
    for item in model.strings("devices"):
        value = item.value
        where = model.where("devices")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            model.findings.fault(item.line, f"{where}: expected a device index (0, 1, ...), got {item.text!r}")
        elif value in devices:
            model.findings.fault(item.line, f"{where}: device {value} is listed twice")
        else:
            devices.append(value)
    return tuple(devices)


def _vram(model: YamlSection, devices: tuple[int, ...]) -> dict[int, float]:
    entry = model.entry("vramGiB")
    if entry is None:
        return {}
    if not devices:
        model.fault(entry, "needs devices: [...] to say which devices the memory is on")
        return {}
    value = entry.item.value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            model.fault(entry, f"must not be negative, got {entry.item.text}")
            return {}
        return {device: float(value) for device in devices}
    if not entry.item.is_mapping:
        model.fault(entry, f"expected GiB as a number or a mapping of device to GiB, got {shown(entry.item)}")
        return {}
    vram = {}
    per_device = YamlSection(model.findings, entry.item, model.path + ("vramGiB",))
    for key, child in entry.item.value.items():
        if not re.fullmatch(r"\d+", key) or int(key) not in devices:
            per_device.read_keys.add(key)
            per_device.fault(child, f"device {key} is not in this model's devices {list(devices)}")
            continue
        amount = per_device.number(key, None, unit="GiB")
        if amount is not None:
            vram[int(key)] = amount
    per_device.finish()
    return vram


def _raw_text(entry: Entry, sources: Mapping[str, list[str]]) -> str:
    """The entry as written, from its key line to its last line of its own (in the file it is in)."""
    first = entry.key_line
    lines = sources.get(file_of(first, ""), [])
    if not 0 < first <= len(lines):
        return ""
    last = max(entry.item.end_line, first)
    key_indent = len(lines[first - 1]) - len(lines[first - 1].lstrip())
    while last > first:
        line = lines[last - 1] if last - 1 < len(lines) else ""
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        # Blank lines and comments no deeper than the key introduce what follows.
        if not stripped or (stripped.startswith("#") and indent <= key_indent):
            last -= 1
        else:
            break
    return "\n".join(lines[first - 1 : last])
