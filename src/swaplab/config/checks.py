"""Checks across sections, once each is read: names that collide, devices that don't exist or fit."""

from __future__ import annotations

from swaplab.config.model import DeviceConfig, ModelConfig, PeerConfig
from swaplab.config.reader import Findings
from swaplab.config.tree import Entry


def check_names(
    findings: Findings,
    models: dict[str, ModelConfig],
    peers: dict[str, PeerConfig],
    model_entries: dict[str, Entry],
    peer_entries: dict[str, Entry],
) -> None:
    """An alias names one model and no model id; a model id or alias is no peer's `PEER/MODEL`,
    and no two peers produce the same `PEER/MODEL` (faults in llama-swap's words where it has them)."""
    owner: dict[str, str] = {}
    for model in sorted(models.values(), key=lambda m: m.line):
        alias_items = _alias_lines(model, model_entries)
        for alias in model.aliases:
            line = alias_items.get(alias, model.line)
            if alias in model_entries:
                findings.fault(line, f"models.{model.id}.aliases: '{alias}' is already a model id")
            elif alias in owner and owner[alias] != model.id:
                findings.fault(
                    line, f"duplicate alias {alias} found in model: {model.id} (already an alias of {owner[alias]})"
                )
            elif alias in owner:
                findings.fault(line, f"models.{model.id}.aliases: '{alias}' is listed twice")
            else:
                owner[alias] = model.id
    producers: dict[str, tuple[str, str]] = {}
    for peer_id in sorted(peers):
        for name in dict.fromkeys(peers[peer_id].models):
            qualified = f"{peer_id}/{name}"
            if qualified in producers:
                first_peer, first_name = producers[qualified]
                findings.fault(
                    peer_entries[peer_id].key_line if peer_id in peer_entries else 1,
                    f'peer model name "{qualified}" is ambiguous between peers.{first_peer} model "{first_name}" '
                    f'and peers.{peer_id} model "{name}"',
                )
                continue
            producers[qualified] = (peer_id, name)
            if qualified in models:
                findings.fault(
                    models[qualified].line, f'model ID "{qualified}" conflicts with fully qualified peer model name'
                )
            elif qualified in owner:
                model = models[owner[qualified]]
                line = _alias_lines(model, model_entries).get(qualified, model.line)
                findings.fault(
                    line, f'model {model.id} alias "{qualified}" conflicts with fully qualified peer model name'
                )


def _alias_lines(model: ModelConfig, model_entries: dict[str, Entry]) -> dict[str, int]:
    entry = model_entries.get(model.id)
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


def check_devices(findings: Findings, models: dict[str, ModelConfig], devices: dict[int, DeviceConfig]) -> None:
    """Once `devices:` is declared, every device a model names is declared there, with room for its memory."""
    if not devices:
        return
    for model in models.values():
        for device in model.devices:
            if device not in devices:
                findings.fault(model.line, f"models.{model.id}.devices: device {device} is not declared under devices")
        for device, amount in model.vram_gib.items():
            capacity = devices.get(device)
            if capacity is not None and capacity.vram_gib and amount > capacity.vram_gib:
                findings.fault(
                    model.line,
                    f"models.{model.id}.vramGiB: needs {amount:g} GiB on device {device}, "
                    f"which has {capacity.vram_gib:g} GiB",
                )
