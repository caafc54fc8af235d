"""YAML text to a tree of values that remember their line numbers (`config.tree`).

llama-swap decodes with Go's yaml.v3 (YAML 1.2 core schema), PyYAML speaks YAML 1.1,
where `on`, `no` and `1:20` are not strings. The loader here resolves plain scalars
the 1.2 way so a config means the same thing to both, and it reports a duplicate key
as an error the way yaml.v3 does instead of silently keeping the last one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from swaplab.config.tree import Entry, Item, Line
from swaplab.errors import Fault


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
            return Item(None, Line(node.start_mark.line + 1, self.file))
        self._building.add(id(node))
        try:
            return self._build(node)
        finally:
            self._building.discard(id(node))

    def _build(self, node: Node) -> Item:
        line = Line(node.start_mark.line + 1, self.file)
        end = Line(self._last_line(node), self.file)
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
            entries[key] = Entry(key, Line(key_node.start_mark.line + 1, self.file), self.build(value_node))
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
