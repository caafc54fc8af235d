"""The `models:` section: each model's macros expanded, `${PORT}` handed out, settings read.

Ports go to models in sorted id order, and only to a model whose `cmd` asks for one, as
llama-swap hands them out. Every `${...}` left once all macros are substituted is a
fault in llama-swap's words, located in the field, or in the macro that brought it in.
A model without `cmd` loads, as in llama-swap, with `cmd=()`: it fails when started.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from swaplab.config import macros as macro_rules
from swaplab.config.cmd import split_command
from swaplab.config.kvcache import read_kv_cache
from swaplab.config.macros import ENV_NAME, ExpansionBudget, Macro, Report
from swaplab.config.model import Capabilities, ModelConfig
from swaplab.config.sleep import read_sleep
from swaplab.config.tree import Entry, Item, file_of, to_plain
from swaplab.config.upstream import is_http_url, read_filters, read_timeouts
from swaplab.config.translate import read_translate
from swaplab.config.yamlreader import YamlSection, shown

DEFAULT_PROXY = "http://localhost:${PORT}"
MODALITIES = ("text", "audio", "image")
COMFYUI_MODEL_ID = "comfyui_auto"
"""llama-swap's `/comfyui` model: its concurrency limit is at least 50 and it ignores websockets."""
COMFYUI_CONCURRENCY_LIMIT = 50
DIRECT_FIELDS = ("cmd", "cmdStop", "proxy", "checkEndpoint", "filters.stripParams", "name", "description")
"""The fields whose leftover macro llama-swap reports as `unknown macro '${X}' found in m.cmd`."""
PARAMS_BY_ID = ("filters", "setParamsByID")


@dataclass(frozen=True)
class ModelDefaults:
    """The top-level settings a model inherits unless it sets its own."""

    global_ttl: int
    unload_timeout: float
    send_loading_state: bool
    heartbeat_interval: float
    start_port: int


def read_models(
    section: YamlSection | None,
    global_macros: list[Macro],
    defaults: ModelDefaults,
    lines: Mapping[str, list[str]],
    budget: ExpansionBudget,
) -> dict[str, ModelConfig]:
    """Every model that resolves, in the file's order; `lines` are the file's, for each entry's text.

    Each key of a model's `filters.setParamsByID` (other than its own id) becomes one of its
    aliases, as in llama-swap.
    """
    if section is None:
        return {}
    next_port = defaults.start_port
    resolved: dict[str, ModelConfig] = {}
    params_lines: dict[str, dict[str, int]] = {}
    for model_id in sorted(section.entries):
        section.read_keys.add(model_id)
        entry = section.entries[model_id]
        if not entry.item.is_mapping:
            section.fault(entry, f"expected a mapping of model settings (cmd, proxy, ...), got {shown(entry.item)}")
            continue
        model, uses_port, params_lines[model_id] = _model(
            section, model_id, entry, global_macros, defaults, next_port, lines, budget
        )
        resolved[model_id] = model
        if uses_port:
            next_port += 1
    _register_params_aliases(section, resolved, params_lines)
    return {model_id: resolved[model_id] for model_id in section.entries if model_id in resolved}


def _register_params_aliases(
    section: YamlSection, models: dict[str, ModelConfig], params_lines: dict[str, dict[str, int]]
) -> None:
    """Each `setParamsByID` key becomes an alias of its model, in sorted id order, after every
    explicit alias (llama-swap's load.go): a key naming another model, or another model's
    alias, is a fault in llama-swap's words."""
    owner: dict[str, str] = {}
    for model in models.values():
        for alias in model.aliases:
            owner.setdefault(alias, model.id)
    for model_id in sorted(models):
        model = models[model_id]
        added = []
        for key in model.filters.set_params_by_id:
            line = params_lines[model_id].get(key, model.line)
            if key == model_id:
                continue
            if key in section.entries:
                section.findings.fault(
                    line, f"model {model_id} filters.setParamsByID: key '{key}' conflicts with an existing model ID"
                )
            elif key in owner:
                if owner[key] != model_id:
                    section.findings.fault(
                        line,
                        f"duplicate alias '{key}' in model {model_id} filters.setParamsByID, "
                        f"already used by model {owner[key]}",
                    )
            else:
                owner[key] = model_id
                added.append(key)
        if added:
            models[model_id] = replace(model, aliases=model.aliases + tuple(added))


def _model(
    models: YamlSection,
    model_id: str,
    entry: Entry,
    global_macros: list[Macro],
    defaults: ModelDefaults,
    port: int,
    lines: Mapping[str, list[str]],
    budget: ExpansionBudget,
) -> tuple[ModelConfig, bool, dict[str, int]]:
    path = f"models.{model_id}"
    report = models.findings.fault
    model_macros = macro_rules.read_macros(entry.item.value.get("macros"), f"{path}.macros", report, model_id)
    chain_list = macro_rules.merge(global_macros, model_macros, model_id)
    chain = macro_rules.resolve_chain(chain_list, budget)

    entries = dict(entry.item.value)
    proxy_defaulted = "proxy" not in entries or entries["proxy"].item.value is None
    if proxy_defaulted:
        entries["proxy"] = Entry("proxy", entry.key_line, Item(DEFAULT_PROXY, entry.key_line, source=DEFAULT_PROXY))
    expanded = _expand(entries, chain, model_id, report, budget)

    # ${PORT} is handed out only to a model whose cmd asks for one (llama-swap's rule).
    cmd_text = expanded["cmd"].item.value if "cmd" in expanded else None
    uses_port = isinstance(cmd_text, str) and "${PORT}" in cmd_text
    if uses_port:
        expanded = _expand(expanded, {"PORT": Macro("PORT", port, 0, port, "PORT")}, model_id, report, budget)
    _check_params_keys(expanded, model_id, report)

    for key, child in expanded.items():
        if key != "macros":
            _check_references(models, model_id, child, chain_list, chain, proxy_defaulted, entry)

    model = YamlSection(models.findings, Item(expanded, entry.item.line), ("models", model_id))
    model.entry("macros")
    model.entry("healthCheckTimeout")  # llama-swap's struct has it, and overwrites it with the global one
    built = _build_model(model_id, model, entry, defaults, lines)
    model.finish()
    return built, uses_port, _params_key_lines(expanded)


def _params_key_lines(expanded: dict[str, Entry]) -> dict[str, int]:
    """The line of each (expanded) key of `filters.setParamsByID`."""
    return {key: child.key_line for key, child in _params_by_id(expanded).items()}


def _expand(
    entries: dict[str, Entry], chain: dict[str, Macro], model_id: str, report: Report, budget: ExpansionBudget
) -> dict[str, Entry]:
    """Every value but `macros` with `chain` substituted, and the keys of `filters.setParamsByID`."""
    expanded: dict[str, Entry] = {}
    for key, child in entries.items():
        item = child.item if key == "macros" else macro_rules.expand(child.item, chain, budget)
        if key == PARAMS_BY_ID[0] and item.is_mapping:
            by_id = item.value.get(PARAMS_BY_ID[1])
            if by_id is not None and by_id.item.is_mapping:
                keyed, clashes = macro_rules.expand_keys(by_id.item, chain, budget)
                for line, first, second in clashes:
                    report(
                        line,
                        f'model {model_id} filters.setParamsByID: keys "{first}" and "{second}" resolve to the same value',
                    )
                item = item.with_value({**item.value, by_id.key: Entry(by_id.key, by_id.key_line, keyed)})
        expanded[key] = Entry(key, child.key_line, item)
    return expanded


def _params_by_id(expanded: dict[str, Entry]) -> dict[str, Entry]:
    """The entries of the model's `filters.setParamsByID` mapping (none when it has no such mapping)."""
    filters = expanded.get(PARAMS_BY_ID[0])
    by_id = filters.item.value.get(PARAMS_BY_ID[1]) if filters is not None and filters.item.is_mapping else None
    return by_id.item.value if by_id is not None and by_id.item.is_mapping else {}


def _check_params_keys(expanded: dict[str, Entry], model_id: str, report: Report) -> None:
    """A `setParamsByID` key still holding `${...}` once every macro is in is a fault."""
    for key, child in _params_by_id(expanded).items():
        for match in macro_rules.MACRO_REFERENCE.finditer(key):
            report(
                child.key_line,
                f"unknown macro '{match.group(0)}' found in model {model_id} filters.setParamsByID key",
            )
            break


def _model_field_fault(model_id: str, field_path: str, name: str) -> str:
    """llama-swap's fault for a macro left in a model's field (macros.go validateMacroUses)."""
    field_path = re.sub(r"\[\d+\]", "", field_path)  # llama-swap names a list, not its item
    if field_path in DIRECT_FIELDS:
        if name in ("PORT", "MODEL_ID"):
            return f"macro '${{{name}}}' should have been substituted in {model_id}.{field_path}"
        return f"unknown macro '${{{name}}}' found in {model_id}.{field_path}"
    top = field_path.split(".")[0]
    context = f"model {model_id} {top if top in ('capabilities', 'metadata') else field_path}"
    return f"{context}: unknown macro '${{{name}}}'"


def _check_references(
    models: YamlSection,
    model_id: str,
    child: Entry,
    chain_list: list[Macro],
    chain: dict[str, Macro],
    proxy_defaulted: bool,
    model_entry: Entry,
) -> None:
    """Fault every `${...}` still in `child` once all macros and `${PORT}` are substituted."""
    report = models.findings.fault
    for item, name, field_path in macro_rules.references(child.item, child.key):
        if ENV_NAME.match(name):
            continue  # reported as an unset variable already
        if name == "PID" and child.key == "cmdStop":
            continue  # the fleet fills it in at stop time
        line = macro_rules.locate(item, f"${{{name}}}")
        if name == "PORT" and child.key == "proxy":
            message = (
                f"model {model_id}: proxy uses ${{PORT}} but cmd does not - ${{PORT}} is only available when used in cmd"
            )
            if proxy_defaulted:
                message += f" (the default proxy {DEFAULT_PROXY} needs it: set proxy)"
            report(model_entry.key_line if proxy_defaulted else line or item.line, message)
            continue
        message = _model_field_fault(model_id, field_path, name)
        if name == "PORT":
            message += " (a port is assigned only when cmd uses ${PORT})"
        elif name == "PID":
            message += " (${PID} is only available in cmdStop)"
        if name in ("PORT", "PID"):
            report(line or item.line, message)
            continue
        report(*macro_rules.explain_unresolved(item, name, chain_list, chain, message))


def _build_model(
    model_id: str, model: YamlSection, entry: Entry, defaults: ModelDefaults, lines: Mapping[str, list[str]]
) -> ModelConfig:
    cmd = _command(model, "cmd")
    if cmd is None and model.entry("cmd") is None:
        model.findings.warn(
            entry.key_line, f"{model.where()}: no cmd, so starting this model fails (llama-swap loads it too)"
        )
    cmd_stop = _command(model, "cmdStop")
    proxy = model.string("proxy", DEFAULT_PROXY)
    proxy_entry = model.entry("proxy")
    if "${" not in proxy and not is_http_url(proxy):
        model.fault(proxy_entry, f"expected an http:// or https:// URL, got '{proxy}'")

    ttl = model.read("ttl", _whole, "a whole number", -1)
    if ttl < -1:
        model.findings.fault(model.entries["ttl"].key_line, f"model {model_id}: invalid TTL value {ttl}")
    if ttl < 0:  # -1 is llama-swap's "not set": the global TTL applies
        ttl = defaults.global_ttl
    env = _env(model)
    unload_timeout = model.read("unloadTimeout", _seconds, "a number of seconds", 0.0)
    if unload_timeout < 0:
        model.findings.fault(
            model.entries["unloadTimeout"].key_line,
            f"model {model_id}: invalid unloadTimeout value {model.entries['unloadTimeout'].item.text}",
        )
    unload_timeout = unload_timeout if unload_timeout > 0 else defaults.unload_timeout
    concurrency_limit = model.integer("concurrencyLimit", 0, minimum=0)
    ignore_websockets = _compat(model)
    if model_id == COMFYUI_MODEL_ID:  # llama-swap's overrides for its /comfyui endpoint
        concurrency_limit = max(concurrency_limit, COMFYUI_CONCURRENCY_LIMIT)
        ignore_websockets = True
    devices = _devices(model)
    vram_gib = _vram(model, devices)
    metadata = model.mapping("metadata")
    return ModelConfig(
        id=model_id,
        cmd=tuple(cmd or ()),
        cmd_stop=tuple(cmd_stop) if cmd_stop is not None else None,
        proxy=proxy,
        check_endpoint=_check_endpoint(model),
        ttl=ttl,
        # an alias equal to the model's own id names it already: accepted and dropped, as llama-swap accepts it
        aliases=tuple(item.text for item in model.strings("aliases") if item.text != model_id),
        env=env,
        name=model.string("name"),
        description=model.string("description"),
        unlisted=model.boolean("unlisted", False),
        use_model_name=model.string("useModelName"),
        concurrency_limit=concurrency_limit,
        unload_timeout=unload_timeout,
        send_loading_state=model.boolean("sendLoadingState", defaults.send_loading_state),
        heartbeat_interval=model.number("heartbeatInterval", defaults.heartbeat_interval),
        metadata=to_plain(metadata) if metadata is not None else {},
        filters=read_filters(model, legacy_names=True),
        timeouts=read_timeouts(model, response_header=None),
        capabilities=_capabilities(model_id, model),
        ignore_websockets=ignore_websockets,
        devices=devices,
        vram_gib=vram_gib,
        sleep=read_sleep(model),
        kv_cache=read_kv_cache(model),
        api_key=model.string("apiKey"),
        translate=read_translate(model),
        raw_text=_raw_text(entry, lines),
        line=entry.key_line,
    )


def _check_endpoint(model: YamlSection) -> str:
    """`checkEndpoint`; a path without its leading `/` is asked with one, as llama-swap joins it to
    `proxy`, with a warning (it reads like a typo)."""
    check = model.string("checkEndpoint", "/health")
    entry = model.entry("checkEndpoint")
    if entry is not None and check and check.strip() not in ("none", "generate") and not check.startswith("/") \
            and not is_http_url(check) and "${" not in check:
        model.findings.warn(
            entry.key_line,
            f"{model.where()}: checkEndpoint '{check}' has no leading '/': asked as '/{check}', as llama-swap "
            f"joins it to proxy; write '/{check}'",
        )
    return check


def _command(model: YamlSection, key: str) -> list[str] | None:
    """The command at `key` as argv; None when absent or wrong, [] when blank or only comments
    (llama-swap loads such a model, and fails when it starts)."""
    entry = model.entry(key)
    if entry is None:
        return None
    if not entry.item.is_scalar:
        model.fault(entry, f"expected a command line, got {shown(entry.item)}")
        return None
    try:
        return split_command(entry.item.text)
    except ValueError as error:
        model.fault(entry, f"cannot split into arguments: {error}")
        return None


def _whole(item: Item) -> int:
    """A whole number, negative allowed (the caller says what a negative one means)."""
    value = item.value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError()
    return value


def _seconds(item: Item) -> float:
    """A number of seconds, negative allowed (the caller says what a negative one means)."""
    if isinstance(item.value, bool) or not isinstance(item.value, (int, float)):
        raise TypeError()
    return float(item.value)


def _compat(model: YamlSection) -> bool:
    compat = model.section("compat")
    if compat is None:
        return False
    ignore = compat.boolean("ignoreWebsockets", False)
    compat.finish()
    return ignore


def _capabilities(model_id: str, model: YamlSection) -> Capabilities:
    """`capabilities:`, validated as llama-swap validates it (modalities, context >= 0)."""
    section = model.section("capabilities")
    if section is None:
        return Capabilities()
    modalities = {}
    for key in ("in", "out"):
        names = []
        for item in section.strings(key):
            if item.text not in MODALITIES:
                section.findings.fault(
                    item.line,
                    f'model {model_id}: capabilities.{key}: invalid modality "{item.text}", '
                    f"must be one of: {', '.join(MODALITIES)}",
                )
            else:
                names.append(item.text)
        modalities[key] = tuple(names)
    context = section.read("context", _whole, "a whole number", 0)
    if context < 0:
        section.findings.fault(section.entries["context"].key_line, f"model {model_id}: capabilities.context: must be >= 0")
        context = 0
    capabilities = Capabilities(
        input=modalities["in"],
        output=modalities["out"],
        tools=section.boolean("tools", False),
        reranker=section.boolean("reranker", False),
        context=context,
    )
    section.finish()
    return capabilities


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
