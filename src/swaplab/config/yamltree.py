"""YAML text to a tree of values that remember their line numbers.

llama-swap decodes with Go's yaml.v3 (YAML 1.2 core schema), PyYAML speaks YAML 1.1,
where `on`, `no` and `1:20` are not strings. The loader here resolves plain scalars
the 1.2 way so a config means the same thing to both, and it reports a duplicate key
as an error the way yaml.v3 does instead of silently keeping the last one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from swaplab.errors import Fault


@dataclass
class Item:
    """One YAML value. Scalars keep their written text; collections hold Items."""

    value: Any
    """str/int/float/bool/None, list[Item], or dict[str, Entry]."""
    line: int
    """1-based line where the value starts."""
    source: str | None = None
    """A scalar's text as written (for a literal block, its content)."""
    plain: bool = False
    """An unquoted scalar: substituting text into it re-resolves its type, as llama-swap does."""
    block_line: int | None = None
    """For a literal `|` block: the line of its first content line, so a fault can point inside it."""
    end_line: int = 0
    """1-based last line the value's text may occupy (trailing comments included)."""
    origin: str | None = None
    """The text first written here, before any substitution (to locate a fault in it)."""

    def __post_init__(self) -> None:
        if self.origin is None:
            self.origin = self.source

    @property
    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    @property
    def is_sequence(self) -> bool:
        return isinstance(self.value, list)

    @property
    def is_scalar(self) -> bool:
        return not (self.is_mapping or self.is_sequence)

    @property
    def text(self) -> str:
        """A scalar as a string, as yaml.v3 gives it to a string field: the text as written."""
        return self.source if self.source is not None else scalar_text(self.value)

    def with_value(self, value: Any) -> "Item":
        """A copy holding a substituted value, still located where the original was written."""
        source = None if isinstance(value, (dict, list)) else scalar_text(value)
        return Item(
            value=value, line=self.line, source=source, plain=self.plain,
            block_line=self.block_line, end_line=self.end_line, origin=self.origin,
        )


@dataclass
class Entry:
    """A mapping entry: the key's text and line, and its value."""

    key: str
    key_line: int
    item: Item


@dataclass
class ParsedYaml:
    root: Item | None
    faults: list[Fault] = field(default_factory=list)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema resolution of plain scalars (as yaml.v3 does)."""


_Loader.yaml_implicit_resolvers = {}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0o[0-7_]+|0x[0-9a-fA-F_]+|0b[01_]+|0[0-7_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)
_Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
_Loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])


def resolve_plain(text: str) -> Any:
    """The value an unquoted scalar with this text has (YAML 1.2 core schema)."""
    loader = _Loader("")
    try:
        tag = loader.resolve(ScalarNode, text, (True, False))
        return loader.construct_object(ScalarNode(tag, text))
    except (yaml.YAMLError, ValueError):
        return text
    finally:
        loader.dispose()


def parse(text: str, file: str) -> ParsedYaml:
    """Compose `text` into Items; YAML errors and duplicate keys become faults with lines."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        return ParsedYaml(None, [_yaml_fault(error, file)])
    except yaml.YAMLError as error:
        return ParsedYaml(None, [Fault(file, 1, f"invalid YAML: {error}")])
    builder = _Builder(loader, file, text.split("\n"))
    try:
        root = builder.build(node) if node is not None else None
    except yaml.MarkedYAMLError as error:
        return ParsedYaml(None, [*builder.faults, _yaml_fault(error, file)])
    finally:
        loader.dispose()
    return ParsedYaml(root, builder.faults)


def _yaml_fault(error: yaml.MarkedYAMLError, file: str) -> Fault:
    mark = error.problem_mark or error.context_mark
    line = mark.line + 1 if mark is not None else 1
    parts = [part for part in (error.context, error.problem) if part]
    return Fault(file, line, "invalid YAML: " + ", ".join(parts))


class _Builder:
    def __init__(self, loader: _Loader, file: str, lines: list[str]):
        self.loader = loader
        self.file = file
        self.lines = lines
        self.faults: list[Fault] = []
        self._building: set[int] = set()
        self._flattened: set[int] = set()

    def build(self, node: Node) -> Item:
        if id(node) in self._building:
            self.faults.append(Fault(self.file, node.start_mark.line + 1, "invalid YAML: an alias refers to itself"))
            return Item(None, node.start_mark.line + 1)
        self._building.add(id(node))
        try:
            return self._build(node)
        finally:
            self._building.discard(id(node))

    def _build(self, node: Node) -> Item:
        line = node.start_mark.line + 1
        end = self._last_line(node)
        if isinstance(node, ScalarNode):
            value = self.loader.construct_object(node)
            block_line = line + 1 if node.style == "|" else None
            return Item(value, line, source=node.value, plain=node.style is None, block_line=block_line, end_line=end)
        if isinstance(node, SequenceNode):
            return Item([self.build(child) for child in node.value], line, end_line=end)
        assert isinstance(node, MappingNode)
        if id(node) not in self._flattened:  # an aliased mapping is built again; it is flat by then
            self._check_duplicate_keys(node)
            self.loader.flatten_mapping(node)
            self._flattened.add(id(node))
        entries: dict[str, Entry] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.faults.append(Fault(self.file, key_node.start_mark.line + 1, "a mapping key must be a plain value"))
                continue
            key = key_node.value
            # a key written after a `<<` merge overrides the merged one
            entries[key] = Entry(key, key_node.start_mark.line + 1, self.build(value_node))
        return Item(entries, line, end_line=end)

    def _last_line(self, node: Node) -> int:
        """1-based last line of the node's text: a block ends where the next token starts."""
        mark = node.end_mark
        before = self.lines[mark.line][: mark.column] if mark.line < len(self.lines) else ""
        return mark.line + (1 if before.strip() else 0)

    def _check_duplicate_keys(self, node: MappingNode) -> None:
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            line = key_node.start_mark.line + 1
            if key_node.value in seen:
                self.faults.append(
                    Fault(self.file, line, f"key '{key_node.value}' already defined at line {seen[key_node.value]}")
                )
            else:
                seen[key_node.value] = line


def to_plain(item: Item | None) -> Any:
    """The Item's value as plain Python data (dicts, lists, scalars)."""
    if item is None:
        return None
    if item.is_mapping:
        return {key: to_plain(entry.item) for key, entry in item.value.items()}
    if item.is_sequence:
        return [to_plain(child) for child in item.value]
    return item.value


def from_plain(value: Any, like: Item) -> Item:
    """Items for plain data substituted in place of `like` (a macro's value), located at `like`."""
    if isinstance(value, dict):
        entries = {str(k): Entry(str(k), like.line, from_plain(v, like)) for k, v in value.items()}
        return like.with_value(entries)
    if isinstance(value, list):
        return like.with_value([from_plain(v, like) for v in value])
    return like.with_value(value)


def scalar_text(value: Any) -> str:
    """A scalar formatted as Go's `%v` does (how llama-swap writes a macro's value into a string)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _go_float(value)
    return str(value)


def _go_float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    # Shortest round-trip digits, fixed notation unless the exponent is < -4 or >= 21.
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent
    prefix = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= 21:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{body}e{'-' if point - 1 < 0 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{prefix}{digits}{'0' * (point - len(digits))}"
    return f"{prefix}{digits[:point]}.{digits[point:]}"
