"""`profiles:`: named sets of pins, at most one profile active at a time; while it is, a
requested name that is a pin routes to the pin's target ("" or null: answers 404).
Validated as llama-swap validates them (internal/config/load.go validateProfiles): a
target resolves like any requested name (`config.names`) or is a selector, never another pin.
"""

from __future__ import annotations

from swaplab.config.model import ProfileConfig, SelectorConfig
from swaplab.config.model import Names
from swaplab.config.tree import Entry
from swaplab.config.yamlreader import YamlSection, shown


def read_profiles(section: YamlSection | None, names: Names, selectors: dict[str, SelectorConfig]) -> dict[str, ProfileConfig]:
    """Each profile: a description and its pins, requested name -> target ("" or null = disabled)."""
    profiles: dict[str, ProfileConfig] = {}
    if section is None:
        return profiles
    for profile_id, entry in section.entries.items():
        section.read_keys.add(profile_id)
        if not entry.item.is_mapping and entry.item.value is not None:
            section.findings.fault(
                entry.key_line,
                f"profiles.{profile_id}: profile must be a mapping with description and pins; "
                "the legacy list syntax is no longer supported",
            )
            continue
        profile = YamlSection(section.findings, entry.item, section.path + (profile_id,))
        pins = _pins(profile, profile_id, names, selectors)
        pins_entry = profile.entries.get("pins")
        if not profile_id.strip():
            profile.findings.fault(entry.key_line, "profiles: profile names cannot be empty")
        elif not pins and (pins_entry is None or pins_entry.item.value is None or pins_entry.item.is_mapping):
            profile.findings.fault(entry.key_line, f"profiles.{profile_id}.pins must contain at least one entry")
        profiles[profile_id] = ProfileConfig(id=profile_id, description=profile.string("description"), pins=pins)
        profile.finish()
    return profiles


def _pins(profile: YamlSection, profile_id: str, names: Names, selectors: dict[str, SelectorConfig]) -> dict[str, str]:
    pins_section = profile.section("pins")
    if pins_section is None:
        return {}
    pins: dict[str, str] = {}
    for pin, entry in pins_section.entries.items():
        pins_section.read_keys.add(pin)
        problem = _pin_problem(profile_id, pin, entry, names, selectors)
        if problem is not None:
            pins_section.findings.fault(entry.key_line, problem)
        if entry.item.value is not None and not entry.item.is_scalar:
            continue
        pins[pin] = entry.item.text if entry.item.value is not None else ""
    pins_section.finish()
    return pins


def _pin_problem(profile_id: str, pin: str, entry: Entry, names: Names, selectors: dict[str, SelectorConfig]) -> str | None:
    if not pin.strip():
        return f"profiles.{profile_id}.pins: pin names cannot be empty"
    if names.qualified.get(pin):
        return f'profile {profile_id} pin "{pin}" conflicts with fully qualified peer model name'
    if entry.item.value is None:
        return None
    if not entry.item.is_scalar:
        return f"profiles.{profile_id}.pins.{pin}: expected a model name, got {shown(entry.item)}"
    target = entry.item.text
    if target and names.base(target) is None and target not in selectors:
        return f'profiles.{profile_id}.pins.{pin} references unknown model "{target}"'
    return None
