"""The TOML front-end of the shared config reader (`swaplab.config.reader`).

`tomllib` parses but forgets positions, so a small scanner walks the (already valid) text
once more and records the line where each key, array element and table header starts.
`Checker` then reads the document with the shared reader, each value addressed by its key
path: every fault at `FILE:LINE` of the offending key, all of them in one pass.
"""

from __future__ import annotations

import bisect
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swaplab.config.reader import (
    Findings,
    KeyPath,
    Section,
    describe,
    dotted,
    read_text,
)
from swaplab.config.tree import Entry, Item
from swaplab.errors import ConfigError, Fault

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_DECODE_POSITION = re.compile(r"\(at line (\d+), column \d+\)")


@dataclass(frozen=True)
class TomlDocument:
    """A parsed TOML file and the line where each key path starts."""

    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int]

    def line_of(self, key_path: KeyPath) -> int:
        """The line of `key_path`, or of its nearest recorded parent (1 for the top level)."""
        for length in range(len(key_path), 0, -1):
            line = self.lines.get(key_path[:length])
            if line is not None:
                return line
        return 1


def read_toml(path: Path) -> TomlDocument:
    """Read and parse `path`; a missing file or a syntax error is a ConfigError at its line."""
    return parse_toml(read_text(path), path)


def parse_toml(text: str, path: Path) -> TomlDocument:
    """Parse TOML `text` (named `path` in faults) and locate its keys."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        position = _DECODE_POSITION.search(message)
        line = int(position.group(1)) if position else 1
        raise ConfigError([Fault(str(path), line, f"not valid TOML: {_DECODE_POSITION.sub('', message).strip()}")]) from None
    return TomlDocument(path=path, data=data, lines=key_lines(text))


def key_lines(text: str) -> dict[KeyPath, int]:
    """Map every key path of valid TOML `text` to the 1-based line where it starts.

    Array-of-tables entries are numbered (`("extra_mounts", 1, "host")`), as are array
    elements (`("args", 7)`). On text the scanner does not understand it stops and
    returns what it found so far: a fault then points at a parent's line, never fails.
    """
    scanner = _KeyScanner(text)
    try:
        scanner.scan()
    except (IndexError, ValueError, tomllib.TOMLDecodeError):
        pass
    return scanner.lines


class _KeyScanner:
    """One forward pass over TOML text that tomllib has already accepted."""

    def __init__(self, text: str):
        self.text = text
        self.position = 0
        self.newlines = [index for index, character in enumerate(text) if character == "\n"]
        self.lines: dict[KeyPath, int] = {}
        self.array_tables: dict[KeyPath, int] = {}
        """Each array of tables (by resolved path) and how many entries it has so far."""

    def line(self) -> int:
        return bisect.bisect_left(self.newlines, self.position) + 1

    def record(self, key_path: KeyPath, line: int) -> None:
        self.lines.setdefault(key_path, line)

    def scan(self) -> None:
        table: KeyPath = ()
        while True:
            self.skip_blank(newlines=True)
            if self.position >= len(self.text):
                return
            line = self.line()
            if self.text.startswith("[[", self.position):
                self.position += 2
                keys = self.read_key()
                self.expect("]]")
                array = self.resolve(keys[:-1]) + (keys[-1],)
                index = self.array_tables.get(array, 0)
                self.array_tables[array] = index + 1
                self.record(array, line)
                table = array + (index,)
                self.record(table, line)
            elif self.text[self.position] == "[":
                self.position += 1
                keys = self.read_key()
                self.expect("]")
                table = self.resolve(keys)
                self.record(table, line)
            else:
                self.read_key_value(table)

    def resolve(self, keys: tuple[str, ...]) -> KeyPath:
        """A header's path with the current entry index after each array of tables it passes."""
        resolved: KeyPath = ()
        for key in keys:
            resolved += (key,)
            if resolved in self.array_tables:
                resolved += (self.array_tables[resolved] - 1,)
        return resolved

    def read_key_value(self, table: KeyPath) -> None:
        line = self.line()
        keys = self.read_key()
        for length in range(1, len(keys) + 1):
            self.record(table + keys[:length], line)
        self.skip_blank()
        self.expect("=")
        self.skip_blank()
        self.read_value(table + keys)

    def read_key(self) -> tuple[str, ...]:
        keys: list[str] = []
        while True:
            self.skip_blank()
            character = self.text[self.position]
            if character in "\"'":
                start = self.position
                self.skip_single_line_string(character)
                keys.append(tomllib.loads("k = " + self.text[start : self.position])["k"])
            else:
                match = _BARE_KEY.match(self.text, self.position)
                if match is None:
                    raise ValueError(f"no key at offset {self.position}")
                keys.append(match.group())
                self.position = match.end()
            self.skip_blank()
            if self.position < len(self.text) and self.text[self.position] == ".":
                self.position += 1
                continue
            return tuple(keys)

    def read_value(self, key_path: KeyPath) -> None:
        text = self.text
        if text.startswith('"""', self.position) or text.startswith("'''", self.position):
            self.skip_multiline_string(text[self.position] * 3)
        elif text[self.position] in "\"'":
            self.skip_single_line_string(text[self.position])
        elif text[self.position] == "[":
            self.position += 1
            index = 0
            while True:
                self.skip_blank(newlines=True)
                if text[self.position] == "]":
                    self.position += 1
                    return
                self.record(key_path + (index,), self.line())
                self.read_value(key_path + (index,))
                self.skip_blank(newlines=True)
                if text[self.position] == ",":
                    self.position += 1
                index += 1
        elif text[self.position] == "{":
            self.position += 1
            while True:
                self.skip_blank(newlines=True)
                if text[self.position] == "}":
                    self.position += 1
                    return
                self.read_key_value(key_path)
                self.skip_blank(newlines=True)
                if text[self.position] == ",":
                    self.position += 1
        else:
            # Numbers, booleans and dates end where the enclosing construct goes on.
            while self.position < len(text) and text[self.position] not in ",]}\n#":
                self.position += 1

    def skip_single_line_string(self, quote: str) -> None:
        self.position += 1
        while self.text[self.position] != quote:
            self.position += 2 if quote == '"' and self.text[self.position] == "\\" else 1
        self.position += 1

    def skip_multiline_string(self, delimiter: str) -> None:
        self.position += 3
        while not self.text.startswith(delimiter, self.position):
            self.position += 2 if delimiter == '"""' and self.text[self.position] == "\\" else 1
        self.position += 3
        # Up to two quotes right before the delimiter belong to the string: `""""a"""""`.
        for _ in range(2):
            if self.position < len(self.text) and self.text[self.position] == delimiter[0]:
                self.position += 1

    def skip_blank(self, newlines: bool = False) -> None:
        """Skip spaces and comments, and line breaks too where the grammar allows them."""
        text = self.text
        while self.position < len(text):
            character = text[self.position]
            if character in " \t\r" or (newlines and character == "\n"):
                self.position += 1
            elif character == "#":
                end = text.find("\n", self.position)
                self.position = len(text) if end < 0 else end
            else:
                return

    def expect(self, token: str) -> None:
        self.skip_blank()
        if not self.text.startswith(token, self.position):
            raise ValueError(f"expected {token!r} at offset {self.position}")
        self.position += len(token)


def must_be(where: str, expected: str, item: Item, error: Exception) -> str:
    """The TOML files' wording of a wrong value: `port must be a port number, not an integer 70000: why`."""
    detail = f": {error}" if str(error) else ""
    return f"{where} must be {expected}, not {describe(item.value)} {item.value!r}{detail}"


class Checker:
    """The shared reader over one TOML document, each value addressed by its key path."""

    def __init__(self, document: TomlDocument):
        self.document = document
        # Every fault as often as it is found: two equal flags on one line are two faults.
        self.findings = Findings(str(document.path), repeats=True)

    def fault(self, key_path: KeyPath, message: str) -> None:
        self.findings.fault(self.document.line_of(key_path), message)

    def raise_faults(self) -> None:
        """Raise every fault found so far as one ConfigError."""
        self.findings.raise_faults()

    def table(self, value: Any, key_path: KeyPath, known: tuple[str, ...]) -> dict[str, Any]:
        """`value` as a table whose keys must all be `known`; anything else is a fault."""
        if not isinstance(value, dict):
            self.fault(key_path, f"{dotted(key_path)} must be a table, not {describe(value)}")
            return {}
        for key in value:
            if key not in known:
                where = f" in {dotted(key_path)}" if key_path else ""
                self.fault(key_path + (key,), f"unknown key {key!r}{where}; known keys: {', '.join(known)}")
        return value

    def array_of_tables(self, value: Any, key: str) -> list[tuple[KeyPath, Any]]:
        """The `[[key]]` entries of the top level, each with its key path; anything but an array is
        a fault (and no entry)."""
        if not isinstance(value, list):
            self.fault((key,), f"{key} must be [[{key}]] tables, not {describe(value)}")
            return []
        return [((key, index), item) for index, item in enumerate(value)]

    def get(
        self,
        table: dict[str, Any],
        key_path: KeyPath,
        key: str,
        convert: Callable[[Any], Any],
        expected: str,
        *,
        required: bool = False,
        default: Any = None,
    ) -> Any:
        """`table[key]` passed through `convert`, which raises TypeError/ValueError on a wrong
        value; a fault (`expected` says what was wanted) leaves `default` in its place."""
        if key not in table:
            if required:
                where = f"[{dotted(key_path)}]" if key_path else "the top level"
                self.fault(key_path, f"missing required key {key!r} ({expected}) in {where}")
            return default
        return self.section(table, key_path).read(key, lambda item: convert(item.value), expected, default)

    def section(self, table: dict[str, Any], key_path: KeyPath) -> Section:
        """`table` (the one at `key_path`) for the shared reader, each value at its key's line."""
        line_of = self.document.line_of
        entries = {
            key: Entry(key, line_of(key_path + (key,)), Item(value, line_of(key_path + (key,))))
            for key, value in table.items()
        }
        return Section(self.findings, Item(entries, line_of(key_path)), key_path, must_be)
