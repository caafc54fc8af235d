"""The config's top-level settings: timeouts, ports, TTL, log level, notes, API keys, devices."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from swaplab.config import macros as macro_rules
from swaplab.config.macros import Macro
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
    """The top-level scalars; an out-of-range timeout or log level is a warning and falls back."""
    health_check_timeout = top.number("healthCheckTimeout", 120.0)
    if health_check_timeout < MINIMUM_HEALTH_CHECK_TIMEOUT:
        entry = top.entries["healthCheckTimeout"]
        top.findings.warn(
            entry.key_line,
            f"healthCheckTimeout {entry.item.text} is below the minimum "
            f"{MINIMUM_HEALTH_CHECK_TIMEOUT:g}; using {MINIMUM_HEALTH_CHECK_TIMEOUT:g}",
        )
        health_check_timeout = MINIMUM_HEALTH_CHECK_TIMEOUT
    log_level = top.string("logLevel", "info")
    if log_level not in LOG_LEVELS:
        top.findings.warn(
            top.entries["logLevel"].key_line,
            f"logLevel '{log_level}' is not one of {', '.join(LOG_LEVELS)}; using info",
        )
        log_level = "info"
    return Settings(
        health_check_timeout=health_check_timeout,
        log_level=log_level,
        start_port=top.integer("startPort", 5800, minimum=1),
        global_ttl=top.integer("globalTTL", 0, minimum=0),
        unload_timeout=top.number("unloadTimeout", DEFAULT_UNLOAD_TIMEOUT) or DEFAULT_UNLOAD_TIMEOUT,
        include_aliases_in_list=top.boolean("includeAliasesInList", False),
        send_loading_state=top.boolean("sendLoadingState", False),
        heartbeat_interval=top.number("heartbeatInterval", DEFAULT_HEARTBEAT_INTERVAL),
        notes=_notes_folder(top.string("notes"), config_path),
    )


def _notes_folder(text: str, config_path: str) -> str | None:
    """The catalogue's notes folder: `~` expanded, a relative path taken from the config file's folder."""
    if not text:
        return None
    return os.path.join(os.path.dirname(config_path), os.path.expanduser(text))


def read_api_keys(top: YamlSection, global_macros: list[Macro], chain: dict[str, Macro]) -> tuple[str, ...]:
    """`apiKeys:`, global macros expanded; an empty key or one with a space is a fault."""
    keys = []
    for item in top.strings("apiKeys"):
        item = macro_rules.expand_global(item, "apiKeys", global_macros, chain, top.findings.fault)
        key = item.text
        if not key:
            top.findings.fault(item.line, "apiKeys: an API key may not be empty")
        elif " " in key:
            top.findings.fault(item.line, "apiKeys: an API key may not contain spaces")
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
