"""Config values that remember where they were written, for the reader (`config.reader`).

`yamltree` builds a whole tree from YAML text; `launch/tomlfile` wraps each TOML value
as it is read, at the line of its key. Either way a fault lands at the key's line.
`--config-dir` merges the trees of several files into one (`config.merge`): there each
line is a `Line`, which also names its file, so a fault still lands in the right file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Self


class Line(int):
    """A 1-based line number that also names the file it is in.

    The readers pass lines around as plain ints (`Findings.fault(line, ...)`); a `Line`
    still is one, so none of them needs to know that a merged tree spans several files.
    Adding to or subtracting from it (a line inside a `|` block) keeps the file.
    """

    file: str

    def __new__(cls, number: int, file: str) -> Self:
        line = super().__new__(cls, number)
        line.file = file
        return line

    def __add__(self, other: int) -> Line:  # type: ignore[override]
        return Line(int(self) + other, self.file)

    __radd__ = __add__

    def __sub__(self, other: int) -> int:  # type: ignore[override]
        if isinstance(other, Line):
            return int(self) - int(other)  # a distance, in no file
        return Line(int(self) - other, self.file)

    def __reduce__(self) -> tuple[type[Line], tuple[int, str]]:
        return (Line, (int(self), self.file))


def file_of(line: int, default: str) -> str:
    """The file a line is in: its own for a `Line`, else `default` (the one file being read)."""
    return line.file if isinstance(line, Line) else default


@dataclass
class Item:
    """One value and its line. Scalars keep their written text; YAML collections hold Items."""

    value: Any
    """str/int/float/bool/None, list[Item], or dict[str, Entry] (a wrapped TOML value: plain data)."""
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

    def with_value(self, value: Any) -> Item:
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
    """A scalar formatted as Go's `%v` formats what yaml.v3 decoded (how llama-swap writes a
    macro's value into a string, macros.go `fmt.Sprintf("%v", macroValue)`)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and not GO_INT_RANGE[0] <= value <= GO_INT_RANGE[1]:
        # yaml.v3 decodes a plain integer past int64 and uint64 as a float64
        return go_float(float(value))
    if isinstance(value, float):
        return go_float(value)
    return str(value)


GO_INT_RANGE = (-(1 << 63), (1 << 64) - 1)
"""The integers yaml.v3 decodes as integers (int64, then uint64); past them, a float64."""


def go_float(value: float) -> str:
    """A float64 as Go's `%v` (`strconv.FormatFloat(v, 'g', -1, 64)`) writes it: the shortest
    digits that read back as the value, in exponent form when the exponent is below -4 or at
    least 6 (strconv/ftoa.go: "if precision was the shortest possible, use precision 6 for
    this decision"), the exponent with at least two digits: 1e+06, 1.5e-05, 123456.5."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    # Python's repr is the shortest round-trip form too; only the layout differs from Go's.
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent
    prefix = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= 6:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{body}e{'-' if point - 1 < 0 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{prefix}{digits}{'0' * (point - len(digits))}"
    return f"{prefix}{digits[:point]}.{digits[point:]}"
