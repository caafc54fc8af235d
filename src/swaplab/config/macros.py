"""Macros: `${env.NAME}`, user macros, and the built-in `${MODEL_ID}`, `${PORT}`, `${PID}`.

Semantics follow llama-swap: a macro sees only the macros declared before it (plus
`MODEL_ID`, which comes first), a per-model macro replaces a global one of the same name
in place, and a string that is exactly `${name}` takes the macro's value with its type.
Unlike llama-swap, which substitutes in a handful of fields, swaplab substitutes in
every string value of a model or peer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from swaplab.config.tree import Entry, Item, from_plain, scalar_text, to_plain
from swaplab.config.yamltree import resolve_plain

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")
MAX_NAME_LENGTH = 63
MACRO_REFERENCE = re.compile(r"\$\{([a-zA-Z0-9_-]+)\}")
ENV_REFERENCE = re.compile(r"\$\{env\.([a-zA-Z_][a-zA-Z0-9_]*)\}")
ANY_REFERENCE = re.compile(r"\$\{([^}]*)\}")
ENV_NAME = re.compile(r"^env\.[a-zA-Z_][a-zA-Z0-9_]*$")
"""An `${env.NAME}` reference's name (one left unsubstituted is reported as unset already)."""
RESERVED = ("PORT", "PID", "MODEL_ID")
"""Filled in by swaplab itself; a config may not define them."""

Report = Callable[[int, str], None]
"""Records a fault: (line, message)."""


@dataclass(frozen=True)
class Macro:
    name: str
    value: Any
    """A scalar, or a mapping (usable only as a whole value)."""
    line: int
    written: Any = None
    """The value as declared, before the macros it uses were substituted."""
    where: str = ""
    """Its path in the config, e.g. `macros.x` or `models.m.macros.x`."""


def is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def locate(item: Item, needle: str) -> int | None:
    """The line of `needle` in the text written at `item` (inside a `|` block, the exact line).

    None when the text as written does not contain it (it came in through a macro).
    """
    origin = item.origin
    if not isinstance(origin, str) or needle not in origin:
        return None
    if item.block_line is None:
        return item.line
    for offset, line in enumerate(origin.split("\n")):
        if needle in line and not line.strip().startswith("#"):
            return item.block_line + offset
    return item.line


def substitute_env(item: Item, environ: Mapping[str, str], report: Report, path: str = "") -> Item:
    """Replace every `${env.NAME}` in string values; an unset variable is a fault."""
    if item.is_mapping:
        return item.with_value({
            key: Entry(key, entry.key_line, substitute_env(entry.item, environ, report, f"{path}.{key}".lstrip(".")))
            for key, entry in item.value.items()
        })
    if item.is_sequence:
        return item.with_value([substitute_env(child, environ, report, path) for child in item.value])
    if not isinstance(item.value, str) or "${env." not in item.value:
        return item

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        line = locate(item, match.group(0)) or item.line
        if name not in environ:
            report(line, f"{path}: environment variable '{name}' is not set")
            return match.group(0)
        value = environ[name]
        if any(char in value for char in "\n\r\x00"):
            report(line, f"{path}: environment variable '{name}' holds a newline or NUL, which a config value cannot")
            return match.group(0)
        return value

    text = ENV_REFERENCE.sub(replace, item.value)
    # llama-swap substitutes env values into the YAML text, so an unquoted `ttl: ${env.TTL}` is a number.
    return item.with_value(resolve_plain(text) if item.plain else text)


def read_macros(entry: Entry | None, path: str, report: Report) -> list[Macro]:
    """The `macros:` mapping at `path`, validated as llama-swap validates it."""
    if entry is None or entry.item.value is None:
        return []
    if not entry.item.is_mapping:
        report(entry.key_line, f"{path}: expected a mapping of macro names to values")
        return []
    macros = []
    for name, macro_entry in entry.item.value.items():
        line = macro_entry.key_line
        value = to_plain(macro_entry.item)
        where = f"{path}.{name}"
        if len(name) > MAX_NAME_LENGTH:
            report(line, f"{where}: macro name is longer than {MAX_NAME_LENGTH} characters")
            continue
        if not NAME_PATTERN.match(name):
            report(line, f"{where}: macro name may only hold letters, digits, '_' and '-'")
            continue
        if name in RESERVED:
            report(line, f"{where}: macro name '{name}' is reserved (swaplab fills in ${{{name}}} itself)")
            continue
        if not (is_scalar(value) or isinstance(value, dict)):
            kind = "empty" if value is None else "a list"
            report(line, f"{where}: a macro's value must be a string, number, boolean or mapping, not {kind}")
            continue
        if f"${{{name}}}" in _all_text(value):
            report(line, f"{where}: macro refers to itself")
            continue
        macros.append(Macro(name, value, line, value, where))
    return macros


def merge(global_macros: list[Macro], model_macros: list[Macro], model_id: str | None) -> list[Macro]:
    """MODEL_ID first, then the globals; a model macro replaces a global of the same name in place."""
    merged = [Macro("MODEL_ID", model_id, 0, model_id)] if model_id is not None else []
    merged += global_macros
    for macro in model_macros:
        for index, existing in enumerate(merged):
            if existing.name == macro.name:
                merged[index] = macro
                break
        else:
            merged.append(macro)
    return merged


def resolve_chain(macros: list[Macro], report: Report) -> dict[str, Macro]:
    """Each macro's value with the macros declared before it substituted (nesting)."""
    resolved: dict[str, Macro] = {}
    for macro in macros:
        value, misuse = substitute(macro.value, resolved)
        for name in misuse:
            report(macro.line, _mapping_misuse(macro.where, name))
        resolved[macro.name] = Macro(macro.name, value, macro.line, macro.written, macro.where)
    return resolved


def substitute(value: Any, macros: Mapping[str, Macro]) -> tuple[Any, list[str]]:
    """`value` (plain data) with macros substituted; also the mapping macros wrongly used inside a string."""
    misuse: list[str] = []

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: walk(child) for key, child in value.items()}
        if isinstance(value, list):
            return [walk(child) for child in value]
        if isinstance(value, str):
            return _substitute_string(value, macros, misuse)
        return value

    return walk(value), misuse


def expand(item: Item, macros: Mapping[str, Macro], path: str, report: Report) -> Item:
    """`item` with macros substituted in every string value, each result located where it was written."""
    if item.is_mapping:
        return item.with_value(
            {key: Entry(key, entry.key_line, expand(entry.item, macros, path, report)) for key, entry in item.value.items()}
        )
    if item.is_sequence:
        return item.with_value([expand(child, macros, path, report) for child in item.value])
    if not isinstance(item.value, str) or "${" not in item.value:
        return item
    misuse: list[str] = []
    value = _substitute_string(item.value, macros, misuse)
    for name in misuse:
        report(locate(item, f"${{{name}}}") or item.line, _mapping_misuse(path, name))
    if value is item.value:
        return item
    return from_plain(value, item) if isinstance(value, (dict, list)) else item.with_value(value)


def _substitute_string(text: str, macros: Mapping[str, Macro], misuse: list[str]) -> Any:
    whole = MACRO_REFERENCE.fullmatch(text)
    if whole and whole.group(1) in macros:
        return macros[whole.group(1)].value

    def replace(match: re.Match[str]) -> str:
        macro = macros.get(match.group(1))
        if macro is None:
            return match.group(0)
        if not is_scalar(macro.value):
            misuse.append(macro.name)
            return match.group(0)
        return scalar_text(macro.value)

    result = MACRO_REFERENCE.sub(replace, text)
    return text if result == text else result


def _mapping_misuse(path: str, name: str) -> str:
    return f"{path}: macro '{name}' holds a mapping; use it as a whole value, not inside a string"


def references(item: Item) -> Iterator[tuple[Item, str]]:
    """Every `${...}` left in a string value of `item`, with the Item holding it."""
    if item.is_mapping:
        for entry in item.value.values():
            yield from references(entry.item)
    elif item.is_sequence:
        for child in item.value:
            yield from references(child)
    elif isinstance(item.value, str):
        for match in ANY_REFERENCE.finditer(item.value):
            yield item, match.group(1)


def explain_unresolved(
    item: Item, name: str, chain: list[Macro], resolved: Mapping[str, Macro], path: str
) -> tuple[int, str] | None:
    """Where an unresolved `${name}` was written and what is wrong with it.

    Written in the field itself: an unknown macro. Otherwise it came through a macro's value:
    point at that macro, and say when the macro it wants is declared after it. None when it
    names a mapping macro used inside a string, which `expand` has reported already.
    """
    if name in resolved and not is_scalar(resolved[name].value):
        return None
    needle = f"${{{name}}}"
    line = locate(item, needle)
    if line is not None:
        return line, f"{path}: unknown macro '{name}'"
    names = [macro.name for macro in chain]
    for index, macro in enumerate(chain):
        if needle in _all_text(macro.written):
            if name in names[index + 1 :]:
                return macro.line, (
                    f"{macro.where}: uses macro '{name}', which is declared after it; declare '{name}' first"
                )
            return macro.line, f"{macro.where}: unknown macro '{name}'"
    return item.line, f"{path}: unknown macro '{name}'"



def expand_global(
    item: Item, path: str, global_macros: list[Macro], chain: Mapping[str, Macro], report: Report
) -> Item:
    """`item` (outside any model) with the global macros substituted; anything left as `${...}` is a fault."""
    expanded = expand(item, chain, path, report)
    for holder, name in references(expanded):
        if ENV_NAME.match(name):
            continue
        if name in RESERVED:
            line = locate(holder, f"${{{name}}}") or holder.line
            report(line, f"{path}: ${{{name}}} is only available in a model")
            continue
        explained = explain_unresolved(holder, name, global_macros, chain, path)
        if explained is not None:
            report(*explained)
    return expanded


def _all_text(value: Any) -> str:
    if isinstance(value, dict):
        return "\n".join(_all_text(child) for child in value.values())
    if isinstance(value, list):
        return "\n".join(_all_text(child) for child in value)
    return value if isinstance(value, str) else ""
