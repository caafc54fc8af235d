"""YAML text to a tree of values that remember their line numbers (`config.tree`).

llama-swap decodes with Go's yaml.v3 (YAML 1.2 core schema), PyYAML speaks YAML 1.1,
where `on`, `no` and `1:20` are not strings. The loader here resolves plain scalars
the 1.2 way so a config means the same thing to both, and it reports a duplicate key
as an error the way yaml.v3 does instead of silently keeping the last one.

A file is a config only within limits that no real one nears, each a fault at its line
rather than a hang, a MemoryError or a RecursionError: values nest at most `MAX_DEPTH`
levels (PyYAML's composer recurses once per level), and the tree holds at most
`MAX_NODES` values and `MAX_TEXT` characters of scalars, an alias counted each time it
is expanded (nine lines of nested aliases would otherwise build a billion values). A
character YAML does not allow (a NUL byte: a binary file) is a fault at its line too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from swaplab.config.tree import Entry, Item, Line
from swaplab.config.yamlerrors import explain
from swaplab.errors import Fault


MAX_DEPTH = 100
"""Levels a value may nest (a real config nests under ten)."""
MAX_NODES = 50_000
"""Values (scalars, lists, mappings) in the tree, an alias's counted each time it is expanded: over
200 times the largest of llama-swap's corpus (223), and what PyYAML's pure-Python composer and
the tree build in about a second and 60 MB. The composer counts each value as it starts it, so
a file past the budget stops there (a 480 KB flat list at its 50,001st value) rather than being
composed whole and refused after (18 s and 341 MB with the old budget of 250,000)."""
MAX_TEXT = 4 << 20
"""Characters of scalar text in the tree, an alias's counted each time it is expanded."""
MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """A document past one of the limits: where, and which limit."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


@dataclass
class ParsedYaml:
    root: Item | None
    faults: list[Fault] = field(default_factory=list)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema resolution of plain scalars (as yaml.v3 does), that
    refuses to compose past `MAX_DEPTH` or `MAX_NODES` and remembers each alias's line."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth = 0
        self.composed = 0
        self.alias_lines: dict[tuple[int, int], int] = {}
        """The line of each alias, by its place: (its parent's id, its index or its key's id)."""

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, AliasEvent):
            node = super().compose_node(parent, index)
            self.alias_lines[_place(parent, index)] = line
            return node
        self.composed += 1
        if self.composed > MAX_NODES:
            raise _Refused(line, f"the config holds more than {MAX_NODES} values")
        if self.depth >= MAX_DEPTH:
            raise _Refused(line, f"values nest deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _place(parent: Node | None, index: Any) -> tuple[int, int]:
    """A child's place in its parent: a list's index, or the id of a mapping value's key node."""
    return id(parent), index if isinstance(index, int) else id(index)


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
    """Compose `text` into Items; YAML errors, duplicate keys and a document past the limits
    (`MAX_DEPTH`, `MAX_NODES`, `MAX_TEXT`) become faults with lines."""
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as error:
        return ParsedYaml(None, [_character_fault(error, text, file)])
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        return ParsedYaml(None, [_yaml_fault(error, text, file)])
    except yaml.YAMLError as error:
        return ParsedYaml(None, [Fault(file, 1, f"invalid YAML: {error}")])
    except _Refused as refused:
        return ParsedYaml(None, [Fault(file, refused.line, refused.message)])
    builder = _Builder(loader, file, text.split("\n"))
    try:
        root = builder.build(node) if node is not None else None
    except yaml.MarkedYAMLError as error:
        return ParsedYaml(None, [*builder.faults, _yaml_fault(error, text, file)])
    except _Refused as refused:
        return ParsedYaml(None, [*builder.faults, Fault(file, refused.line, refused.message)])
    finally:
        loader.dispose()
    return ParsedYaml(root, builder.faults)


def _character_fault(error: yaml.reader.ReaderError, text: str, file: str) -> Fault:
    """A character YAML does not allow, at its line: a NUL byte is most likely a binary file."""
    line = text.count("\n", 0, error.position) + 1
    if error.character == 0:
        return Fault(file, line, "the file is not text: a NUL byte (is it a binary file?)")
    return Fault(file, line, f"the file is not text: character U+{error.character:04X}, which YAML does not allow")


def _yaml_fault(error: yaml.MarkedYAMLError, text: str, file: str) -> Fault:
    """A syntax error at the line of the mistake, in plain words (`yamlerrors`)."""
    line, message = explain(error, text)
    return Fault(file, line, message)


class _Builder:
    def __init__(self, loader: _Loader, file: str, lines: list[str]):
        self.loader = loader
        self.file = file
        self.lines = lines
        self.faults: list[Fault] = []
        self._building: set[int] = set()
        self._merges: dict[int, tuple[int | None, set[int]]] = {}
        """Each flattened mapping's `<<` line and the ids of the pairs written in it (not merged)."""
        self._nodes_left = MAX_NODES
        self._text_left = MAX_TEXT
        self._depth = 0
        self._alias_line: int | None = None
        """While an alias is expanded: the line of the outermost one, where a limit's fault goes."""

    def build(self, node: Node, alias_line: int | None = None) -> Item:
        """`node` as an Item; `alias_line` is the line of the alias it was reached through."""
        if id(node) in self._building:
            self.faults.append(Fault(self.file, node.start_mark.line + 1, "invalid YAML: an alias refers to itself"))
            return Item(None, Line(node.start_mark.line + 1, self.file))
        outer_alias = self._alias_line
        if outer_alias is None:
            self._alias_line = alias_line
        self._spend(node)
        self._building.add(id(node))
        self._depth += 1
        try:
            return self._build(node)
        finally:
            self._depth -= 1
            self._building.discard(id(node))
            self._alias_line = outer_alias

    def _spend(self, node: Node) -> None:
        """Count `node` against the limits; past one, refuse at the alias that expanded it."""
        self._nodes_left -= 1
        if isinstance(node, ScalarNode):
            self._text_left -= len(node.value)
        line = self._alias_line or node.start_mark.line + 1
        if self._depth >= MAX_DEPTH:
            raise _Refused(line, f"aliases nest values deeper than {MAX_DEPTH} levels")
        if self._nodes_left < 0:
            raise _Refused(line, f"aliases expand past {MAX_NODES} values")
        if self._text_left < 0:
            raise _Refused(line, f"aliases expand past {MAX_TEXT >> 20} MiB of text")

    def _build(self, node: Node) -> Item:
        line = Line(node.start_mark.line + 1, self.file)
        end = Line(self._last_line(node), self.file)
        if isinstance(node, ScalarNode):
            value = self.loader.construct_object(node)
            block_line = line + 1 if node.style == "|" else None
            return Item(value, line, source=node.value, plain=node.style is None, block_line=block_line, end_line=end)
        if isinstance(node, SequenceNode):
            children = [self.build(child, self._alias_at(node, index)) for index, child in enumerate(node.value)]
            return Item(children, line, end_line=end)
        assert isinstance(node, MappingNode)
        if id(node) not in self._merges:  # an aliased mapping is built again; it is flat by then
            self._check_duplicate_keys(node)
            merge_line = next((key.start_mark.line + 1 for key, _ in node.value if key.tag == MERGE_TAG), None)
            written = {id(pair) for pair in node.value}
            self.loader.flatten_mapping(node)
            self._merges[id(node)] = (merge_line, written)
        merge_line, written = self._merges[id(node)]
        entries: dict[str, Entry] = {}
        for pair in node.value:
            key_node, value_node = pair
            if not isinstance(key_node, ScalarNode):
                self.faults.append(Fault(self.file, key_node.start_mark.line + 1, "a mapping key must be a plain value"))
                continue
            key = key_node.value
            # a merged value is an alias's too: the `<<` line's
            alias_line = self._alias_at(node, key_node) if id(pair) in written else merge_line
            # a key written after a `<<` merge overrides the merged one
            entries[key] = Entry(key, Line(key_node.start_mark.line + 1, self.file), self.build(value_node, alias_line))
        return Item(entries, line, end_line=end)

    def _alias_at(self, parent: Node, index: Any) -> int | None:
        """The line of the alias written at this place in `parent`; None where a value is written."""
        return self.loader.alias_lines.get(_place(parent, index))

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
