"""Read a llama-swap YAML config (plus swaplab's keys) into a resolved `Config`.

One pass collects every fault, each at the line of the key that holds it; unknown keys
are warnings, because configs carry keys from newer llama-swap releases. Nothing here
touches the machine beyond reading the file and the environment: a config that names
binaries absent from this box is still valid (it may describe another box).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from swaplab.config import macros as macro_rules
from swaplab.config.cmd import split_command, strip_comment_lines
from swaplab.config.macros import Macro
from swaplab.config.model import (
    Config,
    DeviceConfig,
    Filters,
    GroupConfig,
    ModelConfig,
    PeerConfig,
    Timeouts,
)
from swaplab.config.yamltree import Entry, Item, parse, to_plain
from swaplab.errors import ConfigError, Fault

MINIMUM_HEALTH_CHECK_TIMEOUT = 15.0
DEFAULT_UNLOAD_TIMEOUT = 10.0
# swaplab: a streaming client that has heard nothing for this long gets heartbeats (SSE comments, or
# `event: ping` on /v1/messages) until the upstream's first byte: agent clients time out and retry otherwise.
DEFAULT_HEARTBEAT_INTERVAL = 10.0
DEFAULT_PROXY = "http://localhost:${PORT}"
LOG_LEVELS = ("debug", "info", "warn", "error")
PROTECTED_PARAMS = ("model",)
"""Request parameters filters may neither strip nor set: routing depends on them."""
YAML_1_1_BOOLEANS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False),
}
"""yaml.v3 still accepts these for a boolean setting (not for a value of any type)."""
ENV_NAME = re.compile(r"^env\.[a-zA-Z_][a-zA-Z0-9_]*$")


def load_config(path: str) -> Config:
    """Load and resolve the config file at `path`; raises ConfigError listing every fault."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Fault(path, 1, "no such file")]) from None
    except UnicodeDecodeError as error:
        raise ConfigError([Fault(path, 1, f"not UTF-8 text ({error.reason})")]) from None
    except OSError as error:
        raise ConfigError([Fault(path, 1, f"cannot read: {error.strerror or error}")]) from None
    return load_config_text(text, path)


def load_config_text(text: str, path: str = "<config>", environ: Mapping[str, str] | None = None) -> Config:
    """Resolve config `text` (named `path` in faults); `environ` defaults to the process environment."""
    return _ConfigReader(text, path, os.environ if environ is None else environ).read()


@dataclass
class _Findings:
    """Faults and warnings of one load, each `FILE:LINE: message`, in the order found."""

    file: str
    faults: dict[tuple[int, str], None] = field(default_factory=dict)
    warnings: dict[tuple[int, str], None] = field(default_factory=dict)

    def fault(self, line: int, message: str) -> None:
        self.faults[(line, message)] = None

    def warn(self, line: int, message: str) -> None:
        self.warnings[(line, message)] = None

    def fault_list(self) -> list[Fault]:
        return [Fault(self.file, line, message) for line, message in self.faults]

    def warning_lines(self) -> tuple[str, ...]:
        return tuple(str(Fault(self.file, line, message)) for line, message in sorted(self.warnings))


class _Section:
    """Typed reads of one YAML mapping; the keys never read are reported as unknown."""

    def __init__(self, findings: _Findings, item: Item, path: str):
        self.findings = findings
        self.item = item
        self.path = path
        self.entries: dict[str, Entry] = item.value
        self.read: set[str] = set()

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def entry(self, key: str) -> Entry | None:
        """The entry for `key`, or None when absent or null (a null setting means the default)."""
        self.read.add(key)
        entry = self.entries.get(key)
        return entry if entry is not None and entry.item.value is not None else None

    def fault(self, entry: Entry, message: str) -> None:
        self.findings.fault(entry.key_line, f"{self.where(entry.key)}: {message}")

    def string(self, key: str, default: str = "") -> str:
        entry = self.entry(key)
        if entry is None:
            return default
        if not entry.item.is_scalar:
            self.fault(entry, f"expected a string, got {_describe(entry.item)}")
            return default
        return entry.item.text

    def integer(self, key: str, default: int, minimum: int | None = None) -> int:
        entry = self.entry(key)
        if entry is None:
            return default
        value = entry.item.value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fault(entry, f"expected a whole number, got {_describe(entry.item)}")
            return default
        if minimum is not None and value < minimum:
            self.fault(entry, f"must be at least {minimum}, got {value}")
            return default
        return value

    def number(self, key: str, default: float | None, unit: str = "seconds") -> float | None:
        """A non-negative int or float; a string such as "3600s" is a fault, as in llama-swap."""
        entry = self.entry(key)
        if entry is None:
            return default
        value = entry.item.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = ""
            if isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*[a-zA-Z]+\s*", value):
                hint = f" (write a plain number of {unit}, without a unit, as llama-swap requires)"
            self.fault(entry, f"expected a number of {unit}, got {_describe(entry.item)}{hint}")
            return default
        if value < 0:
            self.fault(entry, f"must not be negative, got {entry.item.text}")
            return default
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        entry = self.entry(key)
        if entry is None:
            return default
        value = entry.item.value
        if isinstance(value, bool):
            return value
        if entry.item.plain and isinstance(value, str) and value in YAML_1_1_BOOLEANS:
            return YAML_1_1_BOOLEANS[value]
        self.fault(entry, f"expected true or false, got {_describe(entry.item)}")
        return default

    def strings(self, key: str) -> list[Item]:
        """A list of scalars (each kept as an Item, for its line)."""
        entry = self.entry(key)
        if entry is None:
            return []
        if not entry.item.is_sequence:
            self.fault(entry, f"expected a list, got {_describe(entry.item)}")
            return []
        items = []
        for child in entry.item.value:
            if child.value is None or not child.is_scalar:
                self.findings.fault(child.line, f"{self.where(key)}: expected a string, got {_describe(child)}")
            else:
                items.append(child)
        return items

    def mapping(self, key: str) -> Entry | None:
        entry = self.entry(key)
        if entry is not None and not entry.item.is_mapping:
            self.fault(entry, f"expected a mapping, got {_describe(entry.item)}")
            return None
        return entry

    def section(self, key: str) -> "_Section | None":
        entry = self.mapping(key)
        return _Section(self.findings, entry.item, self.where(key)) if entry is not None else None

    def finish(self) -> None:
        for key, entry in self.entries.items():
            if key not in self.read:
                self.findings.warn(entry.key_line, f"unknown key '{key}' ignored")


def _describe(item: Item) -> str:
    if item.is_mapping:
        return "a mapping"
    if item.is_sequence:
        return "a list"
    if item.value is None:
        return "nothing"
    return repr(item.text)


class _ConfigReader:
    def __init__(self, text: str, path: str, environ: Mapping[str, str]):
        self.text = text
        self.path = path
        self.environ = environ
        self.findings = _Findings(path)
        self.lines = text.split("\n")
        self._model_entries: dict[str, Entry] = {}
        """Every model as written, even one too broken to resolve (so it is not reported twice)."""

    def read(self) -> Config:
        parsed = parse(self.text, self.path)
        for fault in parsed.faults:
            self.findings.fault(fault.line, fault.message)
        if parsed.root is None and parsed.faults:
            raise ConfigError(self.findings.fault_list(), self.findings.warning_lines())
        root = parsed.root or Item({}, 1)
        if not root.is_mapping:
            self.findings.fault(root.line, "a config is a mapping of settings (healthCheckTimeout, models, ...)")
            raise ConfigError(self.findings.fault_list(), self.findings.warning_lines())

        _strip_command_comments(root)
        root = macro_rules.substitute_env(root, self.environ, self.findings.fault)
        top = _Section(self.findings, root, "")
        models_entry = root.value.get("models")
        if models_entry is not None and models_entry.item.is_mapping:
            self._model_entries = dict(models_entry.item.value)

        health_check_timeout = top.number("healthCheckTimeout", 120.0)
        if health_check_timeout < MINIMUM_HEALTH_CHECK_TIMEOUT:
            entry = top.entries["healthCheckTimeout"]
            self.findings.warn(
                entry.key_line,
                f"healthCheckTimeout {entry.item.text} is below the minimum "
                f"{MINIMUM_HEALTH_CHECK_TIMEOUT:g}; using {MINIMUM_HEALTH_CHECK_TIMEOUT:g}",
            )
            health_check_timeout = MINIMUM_HEALTH_CHECK_TIMEOUT
        log_level = top.string("logLevel", "info")
        if log_level not in LOG_LEVELS:
            self.findings.warn(
                top.entries["logLevel"].key_line,
                f"logLevel '{log_level}' is not one of {', '.join(LOG_LEVELS)}; using info",
            )
            log_level = "info"
        start_port = top.integer("startPort", 5800, minimum=1)
        global_ttl = top.integer("globalTTL", 0, minimum=0)
        unload_timeout = top.number("unloadTimeout", DEFAULT_UNLOAD_TIMEOUT) or DEFAULT_UNLOAD_TIMEOUT
        include_aliases_in_list = top.boolean("includeAliasesInList", False)
        send_loading_state = top.boolean("sendLoadingState", False)
        heartbeat_interval = top.number("heartbeatInterval", DEFAULT_HEARTBEAT_INTERVAL)
        notes = _notes_folder(top.string("notes"), self.path)

        global_macros = macro_rules.read_macros(top.entry("macros"), "macros", self.findings.fault)
        global_chain = macro_rules.resolve_chain(global_macros, self.findings.fault)
        api_keys = self._api_keys(top, global_macros, global_chain)
        devices = self._devices(top.section("devices"))

        model_defaults = _ModelDefaults(global_ttl, unload_timeout, send_loading_state, heartbeat_interval, start_port)
        models = self._models(top.section("models"), global_macros, model_defaults)
        groups = self._groups(top.section("groups"), models)
        peers = self._peers(top.section("peers"), global_macros, global_chain)
        preload = self._preload(top.section("hooks"), models)
        top.finish()

        self._check_names(models, peers)
        self._check_devices(models, devices)
        if self.findings.faults:
            raise ConfigError(self.findings.fault_list(), self.findings.warning_lines())
        return Config(
            path=self.path,
            health_check_timeout=health_check_timeout,
            log_level=log_level,
            start_port=start_port,
            global_ttl=global_ttl,
            unload_timeout=unload_timeout,
            api_keys=api_keys,
            include_aliases_in_list=include_aliases_in_list,
            send_loading_state=send_loading_state,
            heartbeat_interval=heartbeat_interval,
            preload=preload,
            models=models,
            groups=groups,
            peers=peers,
            devices=devices,
            warnings=self.findings.warning_lines(),
            notes=notes,
        )

    # -- top level ---------------------------------------------------------------------

    def _api_keys(self, top: _Section, global_macros: list[Macro], chain: dict[str, Macro]) -> tuple[str, ...]:
        keys = []
        for item in top.strings("apiKeys"):
            item = self._expand(item, "apiKeys", global_macros, chain)
            key = item.text
            if not key:
                self.findings.fault(item.line, "apiKeys: an API key may not be empty")
            elif " " in key:
                self.findings.fault(item.line, "apiKeys: an API key may not contain spaces")
            else:
                keys.append(key)
        return tuple(keys)

    def _devices(self, section: _Section | None) -> dict[int, DeviceConfig]:
        devices: dict[int, DeviceConfig] = {}
        if section is None:
            return devices
        for key, entry in section.entries.items():
            section.read.add(key)
            if not re.fullmatch(r"\d+", key):
                section.fault(entry, "a device is named by its index (0, 1, ...)")
                continue
            if entry.item.value is None:
                devices[int(key)] = DeviceConfig(id=int(key))
                continue
            if not entry.item.is_mapping:
                section.fault(entry, f"expected a mapping (name, vramGiB), got {_describe(entry.item)}")
                continue
            device = _Section(self.findings, entry.item, section.where(key))
            devices[int(key)] = DeviceConfig(
                id=int(key), name=device.string("name"), vram_gib=device.number("vramGiB", 0.0, unit="GiB") or 0.0
            )
            device.finish()
        return devices

    def _preload(self, hooks: _Section | None, models: dict[str, ModelConfig]) -> tuple[str, ...]:
        if hooks is None:
            return ()
        on_startup = hooks.section("on_startup")
        hooks.finish()
        if on_startup is None:
            return ()
        preload = []
        for item in on_startup.strings("preload"):
            name = item.text.strip()
            if not name:
                continue
            model_id = _resolve(models, name)
            if model_id is None:
                self.findings.fault(
                    item.line, f"hooks.on_startup.preload: '{name}' is not a model id or alias"
                )
            elif model_id not in preload:
                preload.append(model_id)
        on_startup.finish()
        return tuple(preload)

    # -- models ------------------------------------------------------------------------

    def _models(
        self, section: _Section | None, global_macros: list[Macro], defaults: "_ModelDefaults"
    ) -> dict[str, ModelConfig]:
        if section is None:
            return {}
        next_port = defaults.start_port
        resolved: dict[str, ModelConfig] = {}
        # Ports go to models in sorted id order, as llama-swap hands them out.
        for model_id in sorted(section.entries):
            section.read.add(model_id)
            entry = section.entries[model_id]
            if not entry.item.is_mapping:
                section.fault(entry, f"expected a mapping of model settings (cmd, proxy, ...), got {_describe(entry.item)}")
                continue
            resolved[model_id], uses_port = self._model(model_id, entry, global_macros, defaults, next_port)
            if uses_port:
                next_port += 1
        return {model_id: resolved[model_id] for model_id in section.entries if model_id in resolved}

    def _model(
        self, model_id: str, entry: Entry, global_macros: list[Macro], defaults: "_ModelDefaults", port: int
    ) -> tuple[ModelConfig, bool]:
        path = f"models.{model_id}"
        report = self.findings.fault
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
                self._check_references(child, f"{path}.{key}", chain_list, chain, proxy_defaulted, entry)

        model = _Section(self.findings, Item(expanded, entry.item.line), path)
        model.entry("macros")
        built = self._build_model(model_id, model, entry, defaults)
        model.finish()
        return built, uses_port

    def _check_references(
        self,
        child: Entry,
        path: str,
        chain_list: list[Macro],
        chain: dict[str, Macro],
        proxy_defaulted: bool,
        model_entry: Entry,
    ) -> None:
        """Fault every `${...}` still in `child` once all macros and `${PORT}` are substituted."""
        for item, name in macro_rules.references(child.item):
            if ENV_NAME.match(name):
                continue  # reported as an unset variable already
            if name == "PID":
                if child.key != "cmdStop":
                    line = macro_rules.locate(item, "${PID}") or item.line
                    self.findings.fault(line, f"{path}: ${{PID}} is only available in cmdStop")
                continue
            if name == "PORT":
                if child.key == "proxy" and proxy_defaulted:
                    self.findings.fault(
                        model_entry.key_line,
                        f"{path.rsplit('.', 1)[0]}: cmd does not use ${{PORT}}, so proxy must be set "
                        f"(the default {DEFAULT_PROXY} needs a port from cmd)",
                    )
                else:
                    line = macro_rules.locate(item, "${PORT}") or item.line
                    self.findings.fault(line, f"{path}: uses ${{PORT}} but cmd does not; a port is assigned only when cmd uses ${{PORT}}")
                continue
            explained = macro_rules.explain_unresolved(item, name, chain_list, chain, path)
            if explained is not None:
                self.findings.fault(*explained)

    def _build_model(
        self, model_id: str, model: _Section, entry: Entry, defaults: "_ModelDefaults"
    ) -> ModelConfig:
        path = model.path
        cmd = self._command(model, "cmd")
        if cmd is None and model.entry("cmd") is None:
            self.findings.fault(entry.key_line, f"{path}: cmd is required")
        cmd_stop = self._command(model, "cmdStop")
        proxy = model.string("proxy", DEFAULT_PROXY)
        proxy_entry = model.entry("proxy")
        if "${" not in proxy and not _is_http_url(proxy):
            model.fault(proxy_entry, f"expected an http:// or https:// URL, got '{proxy}'")

        ttl = model.integer("ttl", -1)
        if ttl < -1:
            model.fault(model.entries["ttl"], f"must be 0 (never unload) or more seconds, got {ttl}")
        if ttl < 0:  # -1 is llama-swap's "not set": the global TTL applies
            ttl = defaults.global_ttl
        env = self._env(model)
        unload_timeout = model.number("unloadTimeout", 0.0) or defaults.unload_timeout
        devices = self._model_devices(model)
        vram_gib = self._vram(model, devices)
        metadata_entry = model.mapping("metadata")
        built = ModelConfig(
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
            metadata=to_plain(metadata_entry.item) if metadata_entry is not None else {},
            filters=self._filters(model, legacy_names=True),
            timeouts=self._timeouts(model, response_header=None),
            devices=devices,
            vram_gib=vram_gib,
            raw_text=self._raw_text(entry),
            line=entry.key_line,
        )
        return built

    def _command(self, model: _Section, key: str) -> list[str] | None:
        entry = model.entry(key)
        if entry is None:
            return None
        if not entry.item.is_scalar:
            model.fault(entry, f"expected a command line, got {_describe(entry.item)}")
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

    def _env(self, model: _Section) -> tuple[tuple[str, str], ...]:
        env = []
        for item in model.strings("env"):
            name, equals, value = item.text.partition("=")
            if not equals or not name.strip():
                self.findings.fault(item.line, f"{model.where('env')}: expected NAME=VALUE, got {item.text!r}")
            else:
                env.append((name, value))
        return tuple(env)

    def _model_devices(self, model: _Section) -> tuple[int, ...]:
        devices = []
        for item in model.strings("devices"):
            value = item.value
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                self.findings.fault(item.line, f"{model.where('devices')}: expected a device index (0, 1, ...), got {item.text!r}")
            elif value in devices:
                self.findings.fault(item.line, f"{model.where('devices')}: device {value} is listed twice")
            else:
                devices.append(value)
        return tuple(devices)

    def _vram(self, model: _Section, devices: tuple[int, ...]) -> dict[int, float]:
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
            model.fault(entry, f"expected GiB as a number or a mapping of device to GiB, got {_describe(entry.item)}")
            return {}
        vram = {}
        per_device = _Section(self.findings, entry.item, model.where("vramGiB"))
        for key, child in entry.item.value.items():
            if not re.fullmatch(r"\d+", key) or int(key) not in devices:
                per_device.read.add(key)
                per_device.fault(child, f"device {key} is not in this model's devices {list(devices)}")
                continue
            amount = per_device.number(key, None, unit="GiB")
            if amount is not None:
                vram[int(key)] = amount
        per_device.finish()
        return vram

    def _filters(self, owner: _Section, legacy_names: bool) -> Filters:
        section = owner.section("filters")
        if section is None:
            return Filters()
        strip = self._strip_params(section, "stripParams")
        if legacy_names and not strip:
            strip = self._strip_params(section, "strip_params")
        set_entry = section.mapping("setParams")
        set_params = to_plain(set_entry.item) if set_entry is not None else {}
        for name in PROTECTED_PARAMS:
            if name in set_params:
                del set_params[name]
                self.findings.warn(set_entry.item.value[name].key_line, f"{section.where('setParams')}.{name}: '{name}' cannot be set; ignored")
        section.finish()
        return Filters(strip_params=strip, set_params=set_params)

    def _strip_params(self, section: _Section, key: str) -> tuple[str, ...]:
        entry = section.entry(key)
        if entry is None:
            return ()
        if entry.item.is_sequence:
            names = [item.text for item in section.strings(key)]
        elif entry.item.is_scalar:
            names = entry.item.text.split(",")
        else:
            section.fault(entry, f"expected a comma-separated string or a list, got {_describe(entry.item)}")
            return ()
        # llama-swap's sanitising: trimmed, deduplicated, sorted, `model` never stripped.
        return tuple(sorted({name.strip() for name in names} - {"", *PROTECTED_PARAMS}))

    def _timeouts(self, owner: _Section, response_header: float | None) -> Timeouts:
        # llama-swap's defaults (Go's http.DefaultTransport); 0 means no limit.
        defaults = Timeouts(connect=30.0, response_header=response_header, idle_conn=90.0)
        section = owner.section("timeouts")
        if section is None:
            return defaults

        def read(key: str, default: float | None) -> float | None:
            value = section.number(key, default)
            return None if value == 0 else value

        timeouts = Timeouts(
            connect=read("connect", defaults.connect),
            response_header=read("responseHeader", defaults.response_header),
            idle_conn=read("idleConn", defaults.idle_conn),
        )
        section.finish()
        return timeouts

    def _raw_text(self, entry: Entry) -> str:
        """The entry as written, from its key line to its last line of its own."""
        first = entry.key_line
        last = max(entry.item.end_line, first)
        key_indent = len(self.lines[first - 1]) - len(self.lines[first - 1].lstrip())
        while last > first:
            line = self.lines[last - 1] if last - 1 < len(self.lines) else ""
            stripped = line.strip()
            indent = len(line) - len(line.lstrip())
            # Blank lines and comments no deeper than the key introduce what follows.
            if not stripped or (stripped.startswith("#") and indent <= key_indent):
                last -= 1
            else:
                break
        return "\n".join(self.lines[first - 1 : last])

    # -- groups and peers --------------------------------------------------------------

    def _groups(self, section: _Section | None, models: dict[str, ModelConfig]) -> dict[str, GroupConfig]:
        groups: dict[str, GroupConfig] = {}
        if section is None:
            return groups
        member_of: dict[str, str] = {}
        for group_id, entry in section.entries.items():
            section.read.add(group_id)
            if not entry.item.is_mapping:
                section.fault(entry, f"expected a mapping (swap, exclusive, persistent, members), got {_describe(entry.item)}")
                continue
            group = _Section(self.findings, entry.item, section.where(group_id))
            members: list[str] = []
            for item in group.strings("members"):
                member = item.text
                where = group.where("members")
                if member in members:
                    self.findings.fault(item.line, f"{where}: '{member}' is listed twice")
                    continue
                if member not in self._model_entries:
                    hint = ""
                    target = _resolve(models, member)
                    if target is not None:
                        hint = f" (it is an alias of '{target}'; list the model id)"
                    self.findings.fault(item.line, f"{where}: '{member}' is not a model{hint}")
                elif member in member_of:
                    self.findings.fault(item.line, f"{where}: model '{member}' is already in group '{member_of[member]}'")
                else:
                    member_of[member] = group_id
                members.append(member)
            groups[group_id] = GroupConfig(
                id=group_id,
                swap=group.boolean("swap", True),
                exclusive=group.boolean("exclusive", True),
                persistent=group.boolean("persistent", False),
                members=tuple(members),
            )
            group.finish()
        return groups

    def _peers(
        self, section: _Section | None, global_macros: list[Macro], chain: dict[str, Macro]
    ) -> dict[str, PeerConfig]:
        peers: dict[str, PeerConfig] = {}
        if section is None:
            return peers
        for peer_id, entry in section.entries.items():
            section.read.add(peer_id)
            path = section.where(peer_id)
            if not entry.item.is_mapping:
                section.fault(entry, f"expected a mapping (proxy, apiKey, models, ...), got {_describe(entry.item)}")
                continue
            item = self._expand(entry.item, path, global_macros, chain)
            peer = _Section(self.findings, item, path)
            proxy = peer.string("proxy")
            if not proxy:
                self.findings.fault(entry.key_line, f"{path}: proxy is required")
            elif "${" not in proxy and not _is_http_url(proxy):
                peer.fault(peer.entries["proxy"], f"expected an http:// or https:// URL, got '{proxy}'")
            models: list[str] = []
            for model in peer.strings("models"):
                if model.text not in models:
                    models.append(model.text)
            models_entry = peer.entries.get("models")
            wrong_type = models_entry is not None and models_entry.item.value is not None and not models_entry.item.is_sequence
            if not models and not wrong_type:  # a wrong type is reported already
                self.findings.fault(entry.key_line, f"{path}: models must list at least one model")
            peers[peer_id] = PeerConfig(
                id=peer_id,
                proxy=proxy,
                api_key=peer.string("apiKey"),
                models=tuple(models),
                filters=self._filters(peer, legacy_names=False),
                timeouts=self._timeouts(peer, response_header=60.0),
                probe=peer.number("probe", 0.0) or 0.0,
            )
            peer.finish()
        return peers

    def _expand(self, item: Item, path: str, global_macros: list[Macro], chain: dict[str, Macro]) -> Item:
        """Global macros substituted in `item`; anything left as `${...}` is a fault."""
        expanded = macro_rules.expand(item, chain, path, self.findings.fault)
        for holder, name in macro_rules.references(expanded):
            if ENV_NAME.match(name):
                continue
            if name in macro_rules.RESERVED:
                line = macro_rules.locate(holder, f"${{{name}}}") or holder.line
                self.findings.fault(line, f"{path}: ${{{name}}} is only available in a model")
                continue
            explained = macro_rules.explain_unresolved(holder, name, global_macros, chain, path)
            if explained is not None:
                self.findings.fault(*explained)
        return expanded

    # -- cross checks ------------------------------------------------------------------

    def _check_names(self, models: dict[str, ModelConfig], peers: dict[str, PeerConfig]) -> None:
        owner: dict[str, str] = {}
        for model in sorted(models.values(), key=lambda m: m.line):
            alias_items = self._alias_lines(model)
            for alias in model.aliases:
                line = alias_items.get(alias, model.line)
                if alias in self._model_entries:
                    self.findings.fault(line, f"models.{model.id}.aliases: '{alias}' is already a model id")
                elif alias in owner:
                    other = owner[alias]
                    where = "this model" if other == model.id else f"model '{other}'"
                    self.findings.fault(line, f"models.{model.id}.aliases: '{alias}' is already an alias of {where}")
                else:
                    owner[alias] = model.id
        for peer in peers.values():
            for name in peer.models:
                qualified = f"{peer.id}/{name}"
                if qualified in models:
                    self.findings.fault(models[qualified].line, f"models.{qualified}: id is also peer {peer.id}'s model name")
                elif qualified in owner:
                    model = models[owner[qualified]]
                    line = self._alias_lines(model).get(qualified, model.line)
                    self.findings.fault(line, f"models.{model.id}.aliases: '{qualified}' is also peer {peer.id}'s model name")

    def _alias_lines(self, model: ModelConfig) -> dict[str, int]:
        entry = self._model_entries.get(model.id)
        if entry is None or "aliases" not in entry.item.value:
            return {}
        aliases = entry.item.value["aliases"].item
        if not aliases.is_sequence:
            return {}
        lines: dict[str, int] = {}
        for child in aliases.value:
            if child.is_scalar and child.value is not None:
                lines.setdefault(child.text, child.line)
        return lines

    def _check_devices(self, models: dict[str, ModelConfig], devices: dict[int, DeviceConfig]) -> None:
        if not devices:
            return
        for model in models.values():
            for device in model.devices:
                if device not in devices:
                    self.findings.fault(
                        model.line, f"models.{model.id}.devices: device {device} is not declared under devices"
                    )
            for device, amount in model.vram_gib.items():
                capacity = devices.get(device)
                if capacity is not None and capacity.vram_gib and amount > capacity.vram_gib:
                    self.findings.fault(
                        model.line,
                        f"models.{model.id}.vramGiB: needs {amount:g} GiB on device {device}, "
                        f"which has {capacity.vram_gib:g} GiB",
                    )


@dataclass(frozen=True)
class _ModelDefaults:
    global_ttl: int
    unload_timeout: float
    send_loading_state: bool
    heartbeat_interval: float
    start_port: int


def _strip_command_comments(root: Item) -> None:
    """Drop comment lines from every model's cmd and cmdStop before anything reads them.

    The seed keeps dozens of notes inside `cmd`, with apostrophes and `${...}` that must
    never reach shlex or the macro expander.
    """
    models = root.value.get("models")
    if models is None or not models.item.is_mapping:
        return
    for model in models.item.value.values():
        if not model.item.is_mapping:
            continue
        for key in ("cmd", "cmdStop"):
            command = model.item.value.get(key)
            if command is not None and isinstance(command.item.value, str):
                command.item.value = strip_comment_lines(command.item.value)
                command.item.source = command.item.value


def _notes_folder(text: str, config_path: str) -> str | None:
    """The catalogue's notes folder: `~` expanded, a relative path taken from the config file's folder."""
    if not text:
        return None
    return os.path.join(os.path.dirname(config_path), os.path.expanduser(text))


def _is_http_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _resolve(models: dict[str, ModelConfig], name: str) -> str | None:
    if name in models:
        return name
    for model in models.values():
        if name in model.aliases:
            return model.id
    return None
