"""The config's top-level settings: timeouts, ports, TTL, log level, notes, API keys, devices."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from swaplab.config.model import DeviceConfig
from swaplab.config.yamlreader import YamlSection, shown

MINIMUM_HEALTH_CHECK_TIMEOUT = 15.0
DEFAULT_UNLOAD_TIMEOUT = 10.0
# swaplab: a streaming client that has heard nothing for this long gets heartbeats (SSE comments, or
# `event: ping` on /v1/messages) until the upstream's first byte: agent clients time out and retry otherwise.
DEFAULT_HEARTBEAT_INTERVAL = 10.0
LOG_LEVELS = ("debug", "info", "warn", "error")


@dataclass(frozen=True)
class Settings:
    """The top-level scalar settings, defaults applied."""

    health_check_timeout: float
    log_level: str
    start_port: int
    global_ttl: int
    unload_timeout: float
    include_aliases_in_list: bool
    send_loading_state: bool
    heartbeat_interval: float
    notes: str | None


def read_settings(top: YamlSection, config_path: str) -> Settings:
    """The top-level scalars; a health-check timeout below 15 s or an unknown log level is a
    warning and falls back, as llama-swap falls back silently."""
    health_check_timeout = top.number("healthCheckTimeout", 120.0)
    if health_check_timeout < MINIMUM_HEALTH_CHECK_TIMEOUT:
        entry = top.entries["healthCheckTimeout"]
        top.findings.warn(
            entry.key_line,
            f"healthCheckTimeout {entry.item.text} is below the minimum "
            f"{MINIMUM_HEALTH_CHECK_TIMEOUT:g}; using {MINIMUM_HEALTH_CHECK_TIMEOUT:g}",
        )
        health_check_timeout = MINIMUM_HEALTH_CHECK_TIMEOUT
    log_level = top.string("logLevel", "info").strip().lower()
    if log_level not in LOG_LEVELS:
        top.findings.warn(
            top.entries["logLevel"].key_line,
            f"logLevel '{log_level}' is not one of {', '.join(LOG_LEVELS)}; using info",
        )
        log_level = "info"
    return Settings(
        health_check_timeout=health_check_timeout,
        log_level=log_level,
        start_port=_at_least(top, "startPort", 5800, 1, "startPort must be greater than 1"),
        global_ttl=_at_least(top, "globalTTL", 0, 0, "globalTTL must be >= 0"),
        unload_timeout=_unload_timeout(top),
        include_aliases_in_list=top.boolean("includeAliasesInList", False),
        send_loading_state=top.boolean("sendLoadingState", False),
        heartbeat_interval=top.number("heartbeatInterval", DEFAULT_HEARTBEAT_INTERVAL),
        notes=_notes_folder(top.string("notes"), config_path),
    )


def _at_least(top: YamlSection, key: str, default: int, minimum: int, fault: str) -> int:
    """A whole number of at least `minimum`; below it is llama-swap's `fault`, and the default stands."""
    value = top.integer(key, default)
    if value < minimum:
        top.findings.fault(top.entries[key].key_line, f"{fault}, got {value}")
        return default
    return value


def _unload_timeout(top: YamlSection) -> float:
    """Seconds a stopping model gets; 0 means llama-swap's default 10, below 0 is a fault."""
    entry = top.entry("unloadTimeout")
    value = entry.item.value if entry is not None else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        top.findings.fault(entry.key_line, f"unloadTimeout must be >= 0, got {entry.item.text}")
        return DEFAULT_UNLOAD_TIMEOUT
    return top.number("unloadTimeout", DEFAULT_UNLOAD_TIMEOUT) or DEFAULT_UNLOAD_TIMEOUT


def _notes_folder(text: str, config_path: str) -> str | None:
    """The catalogue's notes folder, or None when the config names none."""
    return path_beside_config(text, config_path) if text else None


def path_beside_config(text: str, config_path: str) -> str:
    """A folder the config names: `~` expanded, a relative path taken from the config file's folder."""
    return os.path.join(os.path.dirname(config_path), os.path.expanduser(text))


def read_api_keys(top: YamlSection) -> tuple[str, ...]:
    """`apiKeys:` (global macros already expanded); an empty key or one with a space is a fault."""
    keys = []
    for index, item in enumerate(top.strings("apiKeys")):
        key = item.text
        if not key:
            top.findings.fault(item.line, "empty api key found in apiKeys")
        elif " " in key:
            top.findings.fault(item.line, f"apiKeys[{index}]: api key cannot contain spaces")
        else:
            keys.append(key)
    return tuple(keys)


def read_devices(section: YamlSection | None) -> dict[int, DeviceConfig]:
    """`devices:`, each named by its index, with an optional name and memory size."""
    devices: dict[int, DeviceConfig] = {}
    if section is None:
        return devices
    for key, entry in section.entries.items():
        section.read_keys.add(key)
        if not re.fullmatch(r"\d+", key):
            section.fault(entry, "a device is named by its index (0, 1, ...)")
            continue
        if entry.item.value is None:
            devices[int(key)] = DeviceConfig(id=int(key))
            continue
        if not entry.item.is_mapping:
            section.fault(entry, f"expected a mapping (name, vramGiB), got {shown(entry.item)}")
            continue
        device = YamlSection(section.findings, entry.item, section.path + (key,))
        devices[int(key)] = DeviceConfig(
            id=int(key), name=device.string("name"), vram_gib=device.number("vramGiB", 0.0, unit="GiB") or 0.0
        )
        device.finish()
    return devices
