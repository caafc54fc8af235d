"""Macros: `${env.NAME}`, user macros, and the built-in `${MODEL_ID}`, `${PORT}`, `${PID}`.

Semantics follow llama-swap: a macro sees only the macros declared before it (plus
`MODEL_ID`, which comes first), a per-model macro replaces a global one of the same name
in place, and a string that is exactly `${name}` takes the macro's value with its type.
The global macros expand in every string value of every top-level setting except
`models` (which gets MODEL_ID, the globals and its own), map keys excepted: only a
model's `filters.setParamsByID` keys are expanded (`expand_keys`). Faults use
llama-swap's words (`unknown macro '${X}' found in m.cmd`) at the line of the `${X}`.

Substitution builds text within limits (`ExpansionBudget`): macros that double each
other (`m1: "${m0}${m0}"`, forty deep) would otherwise fill the memory, so a string past
`MAX_STRING` or a load's strings past `MAX_EXPANDED` in all stop the load with a fault
naming the macro, before the text is built.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from swaplab.config.tree import Entry, Item, file_of, scalar_text, to_plain
from swaplab.config.yamltree import resolve_plain
from swaplab.errors import ConfigError, Fault

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
MAX_STRING = 1 << 20
"""Characters one string (a macro's value, a setting) may have once macros are substituted."""
MAX_EXPANDED = 4 << 20
"""Characters that substituting macros may build in one config load, every string together."""


class ExpansionBudget:
    """What is left of one config load's `MAX_EXPANDED`: one budget serves the whole load."""

    def __init__(self, total: int = MAX_EXPANDED):
        self.left = total

    def spend(self, size: int, line: int, name: str, where: str | None) -> None:
        """Take `size` characters for the string at `line` (`where`: the macro it is the value of)
        that `${name}` grows most; past a limit, the load stops with that fault (a ConfigError)."""
        subject = f"{where}: macro '${{{name}}}' expands it" if where else f"macro '${{{name}}}' expands this value"
        if size > MAX_STRING:
            message = f"{subject} past {MAX_STRING >> 20} MiB; no setting needs that much text"
        elif size > self.left:
            message = f"{subject}, and the macros' text passes {MAX_EXPANDED >> 20} MiB in all; no config needs that"
        else:
            self.left -= size
            return
        raise ConfigError([Fault(file_of(line, "<config>"), line, message)])


@dataclass(frozen=True)
class Macro:
    name: str
    value: Any
    """A scalar: string, number or boolean."""
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
            report(line, f"{path}: environment variable '{name}' contains newlines or null bytes which are not allowed")
            return match.group(0)
        return value

    text = ENV_REFERENCE.sub(replace, item.value)
    # llama-swap substitutes env values into the YAML text, so an unquoted `ttl: ${env.TTL}` is a number.
    return item.with_value(resolve_plain(text) if item.plain else text)


def substitute_env_text(text: str, environ: Mapping[str, str], report: Report) -> str:
    """`${env.NAME}` replaced in the raw text, as llama-swap replaces it before parsing: only for
    a file that is not YAML until then (`apiKeys: [${env.KEY}]`). Comment lines are skipped; a
    value's `\\` and `"` are escaped as llama-swap escapes them (right inside double quotes)."""
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("#") or "${env." not in line:
            continue

        def replace(match: re.Match[str], number: int = number) -> str:
            name = match.group(1)
            value = environ.get(name)
            if value is None:
                report(number, f"environment variable '{name}' is not set")
                return match.group(0)
            if any(char in value for char in "\n\r\x00"):
                report(number, f"environment variable '{name}' contains newlines or null bytes which are not allowed")
                return match.group(0)
            return value.replace("\\", "\\\\").replace('"', '\\"')

        lines[number - 1] = ENV_REFERENCE.sub(replace, line)
    return "\n".join(lines)


def read_macros(entry: Entry | None, path: str, report: Report, model_id: str | None = None) -> list[Macro]:
    """The `macros:` mapping at `path`, validated as llama-swap validates it (a model's faults
    start `model ID:`, as llama-swap's do)."""
    if entry is None or entry.item.value is None:
        return []
    if not entry.item.is_mapping:
        report(entry.key_line, f"{path}: macros must be a mapping")
        return []
    macros = []
    for name, macro_entry in entry.item.value.items():
        line = macro_entry.key_line
        value = to_plain(macro_entry.item)
        where = f"{path}.{name}"
        prefix = f"model {model_id}: " if model_id is not None else f"{where}: "
        problem = _macro_problem(name, value)
        if problem is not None:
            report(line, prefix + problem)
            continue
        macros.append(Macro(name, value, line, value, where))
    return macros


def _macro_problem(name: str, value: Any) -> str | None:
    """llama-swap's objection to a macro declaration (macros.go validateMacro), in its words."""
    if len(name) > MAX_NAME_LENGTH:
        return f"macro name '{name}' exceeds maximum length of {MAX_NAME_LENGTH} characters"
    if not NAME_PATTERN.match(name):
        return f"macro name '{name}' contains invalid characters, must match pattern ^[a-zA-Z0-9_-]+$"
    if not is_scalar(value):
        kind = "map" if isinstance(value, dict) else "list" if isinstance(value, list) else "empty"
        return f"macro '{name}' has invalid type ({kind}), must be a scalar type (string, int, float, or bool)"
    if isinstance(value, str) and f"${{{name}}}" in value:
        return f"macro '{name}' contains self-reference"
    if name in RESERVED:
        return f"macro name '{name}' is reserved (swaplab fills in ${{{name}}} itself)"
    return None


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


def resolve_chain(macros: list[Macro], budget: ExpansionBudget) -> dict[str, Macro]:
    """Each macro's value with the macros declared before it substituted (nesting)."""
    resolved: dict[str, Macro] = {}
    for macro in macros:
        value = macro.value
        if isinstance(value, str):
            value = _substitute_string(value, resolved, budget, macro.line, macro.where or macro.name)
        resolved[macro.name] = Macro(macro.name, value, macro.line, macro.written, macro.where)
    return resolved


def expand(item: Item, macros: Mapping[str, Macro], budget: ExpansionBudget) -> Item:
    """`item` with macros substituted in every string value (not in map keys), each result
    located where it was written; a string that is exactly `${name}` takes the macro's type."""
    if item.is_mapping:
        return item.with_value(
            {key: Entry(key, entry.key_line, expand(entry.item, macros, budget)) for key, entry in item.value.items()}
        )
    if item.is_sequence:
        return item.with_value([expand(child, macros, budget) for child in item.value])
    if not isinstance(item.value, str) or "${" not in item.value:
        return item
    value = _substitute_string(item.value, macros, budget, item.line)
    return item if value is item.value else item.with_value(value)


def expand_keys(
    item: Item, macros: Mapping[str, Macro], budget: ExpansionBudget
) -> tuple[Item, list[tuple[int, str, str]]]:
    """A mapping with macros substituted in its keys (llama-swap does this for a model's
    `filters.setParamsByID` only), and (line, first key, second key) for two keys that
    became the same."""
    entries: dict[str, Entry] = {}
    written: dict[str, str] = {}
    clashes = []
    for key, entry in item.value.items():
        text = _substitute_string(key, macros, budget, entry.key_line)
        new_key = text if isinstance(text, str) else scalar_text(text)
        if new_key in entries:
            clashes.append((entry.key_line, written[new_key], key))
            continue
        written[new_key] = key
        entries[new_key] = Entry(new_key, entry.key_line, entry.item)
    return item.with_value(entries), clashes


def _substitute_string(
    text: str, macros: Mapping[str, Macro], budget: ExpansionBudget, line: int, where: str | None = None
) -> Any:
    whole = MACRO_REFERENCE.fullmatch(text)
    if whole and whole.group(1) in macros:
        return macros[whole.group(1)].value
    # The result's size is known before it is built, so a bomb is refused without building it.
    size, grows_most, longest = len(text), None, -1
    for match in MACRO_REFERENCE.finditer(text):
        macro = macros.get(match.group(1))
        if macro is not None:
            length = len(scalar_text(macro.value))
            size += length - len(match.group(0))
            if length > longest:
                grows_most, longest = macro.name, length
    if grows_most is None:
        return text
    budget.spend(size, line, grows_most, where)

    def replace(match: re.Match[str]) -> str:
        macro = macros.get(match.group(1))
        return match.group(0) if macro is None else scalar_text(macro.value)

    result = MACRO_REFERENCE.sub(replace, text)
    return text if result == text else result


def references(item: Item, path: str = "") -> Iterator[tuple[Item, str, str]]:
    """Every `${...}` left in a string value of `item`: the Item holding it, the name, and the
    holder's place in llama-swap's notation (`peers.p.filters.setParams.x`, `apiKeys[1]`)."""
    if item.is_mapping:
        for key, entry in item.value.items():
            yield from references(entry.item, f"{path}.{key}" if path else key)
    elif item.is_sequence:
        for index, child in enumerate(item.value):
            yield from references(child, f"{path}[{index}]")
    elif isinstance(item.value, str):
        for match in ANY_REFERENCE.finditer(item.value):
            yield item, match.group(1), path


def unknown_macro(where: str, name: str) -> str:
    """llama-swap's fault for a macro left unexpanded outside a model (`peers.p.apiKey: ...`)."""
    return f"{where}: unknown macro '${{{name}}}'"


def explain_unresolved(
    item: Item, name: str, chain: list[Macro], resolved: Mapping[str, Macro], message: str
) -> tuple[int, str]:
    """Where an unresolved `${name}` was written, and the fault to report there.

    Written in the field itself: `message`, at its line. Otherwise it came through a macro's
    value: the fault points at that macro, and says when the macro it wants is declared after it.
    """
    needle = f"${{{name}}}"
    line = locate(item, needle)
    if line is not None:
        return line, message
    names = [macro.name for macro in chain]
    for index, macro in enumerate(chain):
        if isinstance(macro.written, str) and needle in macro.written:
            if name in names[index + 1 :]:
                return macro.line, (
                    f"{macro.where}: unknown macro '{needle}': '{name}' is declared after '{macro.name}', "
                    f"and a macro sees only the macros declared before it"
                )
            return macro.line, unknown_macro(macro.where, name)
    return item.line, message


def expand_global(
    item: Item,
    path: str,
    global_macros: list[Macro],
    chain: Mapping[str, Macro],
    report: Report,
    budget: ExpansionBudget,
) -> Item:
    """A top-level setting (anything but `models`) with the global macros substituted; a
    `${...}` left over is a fault, as llama-swap checks the settings it knows."""
    expanded = expand(item, chain, budget)
    for holder, name, where in references(expanded, path):
        if ENV_NAME.match(name):
            continue  # reported as an unset variable already
        message = unknown_macro(where, name)
        if name in RESERVED:
            message += f" (${{{name}}} is only available in a model)"
        report(*explain_unresolved(holder, name, global_macros, chain, message))
    return expanded
