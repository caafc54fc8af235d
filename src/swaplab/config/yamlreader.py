"""The shared reader (`config.reader`) as the YAML config needs it: yaml.v3's types, llama-swap's words.

A string setting takes the text as written (`1.10` stays `1.10`), a whole number may be
written `3.0`, a boolean may be one of yaml.v3's legacy spellings (`yes`, `off`). A wrong
value reads `models.m.ttl: expected a whole number, got 'soon'`; an unknown key is only a
warning, because configs carry keys from newer llama-swap releases.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from swaplab.config.reader import (
    Findings,
    KeyPath,
    Section,
    as_boolean,
    as_integer,
    as_number,
    describe,
)
from swaplab.config.tree import Item

YAML_1_1_BOOLEANS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False),
}
"""yaml.v3 still accepts these for a boolean setting (not for a value of any type)."""
KIND_NAMES = {dict: "a mapping", list: "a list", type(None): "nothing"}
"""llama-swap's words for a YAML value's kind; a scalar is shown as written instead."""
NUMBER_WITH_UNIT = re.compile(r"\s*\d+(\.\d+)?\s*[a-zA-Z]+\s*")


def shown(item: Item) -> str:
    """A YAML value in a fault message: its kind, or a scalar's text as written."""
    return describe(item.text if item.is_scalar and item.value is not None else item.value, KIND_NAMES)


def llama_swap_wording(where: str, expected: str, item: Item, error: Exception) -> str:
    """`where: expected X, got Y (hint)` for a wrong type, `where: why` for a wrong value."""
    if isinstance(error, TypeError):
        hint = f" ({error})" if str(error) else ""
        return f"{where}: expected {expected}, got {shown(item)}{hint}"
    return f"{where}: {error}"


class YamlSection(Section):
    """Typed reads of one YAML mapping; the keys never read are reported as unknown by `finish`."""

    def __init__(self, findings: Findings, item: Item, path: KeyPath):
        super().__init__(findings, item, path, llama_swap_wording)

    def string(self, key: str, default: str = "") -> str:
        return self.read(key, _text, "a string", default)

    def integer(self, key: str, default: int, minimum: int | None = None) -> int:
        return self.read(key, lambda item: _whole_number(item, minimum), "a whole number", default)

    def number(self, key: str, default: float | None, unit: str = "seconds") -> float | None:
        """A non-negative int or float; a string such as "3600s" is a fault, as in llama-swap."""
        return self.read(key, lambda item: _amount(item, unit), f"a number of {unit}", default)

    def boolean(self, key: str, default: bool) -> bool:
        return self.read(key, _boolean, "true or false", default)

    def strings(self, key: str) -> list[Item]:
        """A list of scalars (each kept as an Item, for its line)."""
        items = []
        for child in self.read(key, _list, "a list", []):
            if child.value is None or not child.is_scalar:
                self.wrong(child.line, self.where(key), "a string", child, TypeError())
            else:
                items.append(child)
        return items

    def mapping(self, key: str) -> Item | None:
        return self.read(key, _mapping, "a mapping", None)

    def section(self, key: str) -> YamlSection | None:
        item = self.mapping(key)
        return YamlSection(self.findings, item, self.path + (key,)) if item is not None else None

    def finish(self) -> None:
        """Warn of every key no read asked for, with the known key it is closest to when one is close."""
        unread = self.unread()
        # Every key a read asked for, present or not: what this section knows.
        known = sorted(key for key in self.read_keys if isinstance(key, str))
        for entry in unread:
            self.findings.warn(entry.key_line, f"unknown key '{entry.key}' ignored{did_you_mean(str(entry.key), known)}")


def did_you_mean(key: str, known: list[str]) -> str:
    """` (did you mean 'aliases'?)` when one known key is close to `key` (a typo), else nothing."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
    if not close:  # a typo in case only (`healthchecktimeout`)
        close = [name for name in known if name.lower() == key.lower()][:1]
    return f" (did you mean '{close[0]}'?)" if close else ""


def _text(item: Item) -> str:
    if not item.is_scalar:
        raise TypeError()
    return item.text


def _whole_number(item: Item, minimum: int | None) -> int:
    value: Any = item.value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    value = as_integer(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"must be at least {minimum}, got {value}")
    return value


def _amount(item: Item, unit: str) -> float:
    try:
        value = as_number(item.value)
    except TypeError:
        if isinstance(item.value, str) and NUMBER_WITH_UNIT.fullmatch(item.value):
            raise TypeError(f"write a plain number of {unit}, without a unit, as llama-swap requires") from None
        raise
    if value < 0:
        raise ValueError(f"must not be negative, got {item.text}")
    return value


def _boolean(item: Item) -> bool:
    if item.plain and isinstance(item.value, str) and item.value in YAML_1_1_BOOLEANS:
        return YAML_1_1_BOOLEANS[item.value]
    return as_boolean(item.value)


def _list(item: Item) -> list[Item]:
    if not item.is_sequence:
        raise TypeError()
    return item.value


def _mapping(item: Item) -> Item:
    if not item.is_mapping:
        raise TypeError()
    return item
