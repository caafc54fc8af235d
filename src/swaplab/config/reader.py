"""Typed reads of a config file's values, every fault at the `FILE:LINE` of the key that holds it.

One reader serves the YAML config (`config.loader`) and the launcher's TOML recipes and
clusters (`launch/tomlfile.py`). A front-end parses its text into located values
(`config.tree`); a `Section` reads one mapping of them, each wrong value a fault at its
key's line; `Findings` gathers every fault and warning of the file in one pass, so a user
sees them all at once. Each format keeps its own wording of a wrong value (a `Wording`):
llama-swap's "expected X, got Y" for the YAML config, "X must be Y, not Z" for TOML.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

from swaplab.config.tree import Entry, Item, file_of
from swaplab.errors import ConfigError, Fault

KeyPath = tuple[str | int, ...]
"""A value's place in the file: table names and keys, with ints for array positions."""

Wording = Callable[[str, str, Item, Exception], str]
"""A format's fault for a wrong value: (its place, what was expected, the value, why)."""

T = TypeVar("T")

PLAIN_NAMES: Mapping[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "a table",
}
"""Plain data's kinds in words (bool before int: a bool is an int to Python)."""


MAX_FILE_BYTES = 4 << 20
"""The largest config file read (a real one is a few KiB; /dev/zero never ends)."""


def read_text(path: str | Path) -> str:
    """A config file's text; a missing, unreadable, oversized or non-UTF-8 file is a ConfigError
    (bytes that are not UTF-8 at their line)."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError([Fault(str(path), 1, "no such file")]) from None
    except OSError as error:
        raise ConfigError([Fault(str(path), 1, f"cannot read: {error.strerror or error}")]) from None
    if len(data) > MAX_FILE_BYTES:
        message = f"the file is larger than {MAX_FILE_BYTES >> 20} MiB, too large for a config"
        raise ConfigError([Fault(str(path), 1, message)])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        message = f"the file is not UTF-8 text: byte 0x{data[error.start]:02x} ({error.reason})"
        raise ConfigError([Fault(str(path), line, message)]) from None


def describe(value: Any, names: Mapping[type, str] = PLAIN_NAMES) -> str:
    """What `value` is, in a format's `names` for its kinds; text without a name is shown quoted."""
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return repr(value) if isinstance(value, str) else type(value).__name__


def dotted(key_path: KeyPath) -> str:
    """`("extra_mounts", 1, "host")` as `extra_mounts[1].host`."""
    text = ""
    for part in key_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


class Findings:
    """Every fault (in the order found) and warning (in line order) of one config, each `FILE:LINE: message`.

    A config is one file, or several merged (`--config-dir`): a line that is a `tree.Line`
    is reported in its own file, any other in `file`.
    """

    def __init__(self, file: str, *, repeats: bool = False):
        self.file = file
        self.repeats = repeats
        """Report a fault each time it is found; otherwise one place and message is one fault."""
        self._faults: list[tuple[str, int, str]] = []
        self._seen: set[tuple[str, int, str]] = set()
        self._warnings: set[tuple[str, int, str]] = set()

    def fault(self, line: int, message: str) -> None:
        found = (file_of(line, self.file), int(line), message)
        if not self.repeats and found in self._seen:
            return
        self._seen.add(found)
        self._faults.append(found)

    def warn(self, line: int, message: str) -> None:
        self._warnings.add((file_of(line, self.file), int(line), message))

    @property
    def faults(self) -> list[Fault]:
        return [Fault(file, line, message) for file, line, message in self._faults]

    @property
    def warnings(self) -> tuple[str, ...]:
        """`FILE:LINE: message` for each warning, in file and line order."""
        return tuple(str(Fault(file, line, message)) for file, line, message in sorted(self._warnings))

    def raise_faults(self) -> None:
        """Raise every fault found so far, warnings alongside, as one ConfigError."""
        if self._faults:
            raise ConfigError(self.faults, self.warnings)


class Section:
    """Typed reads of one mapping: a wrong value is a fault at its key's line, and its default stands."""

    def __init__(self, findings: Findings, item: Item, path: KeyPath, wording: Wording):
        self.findings = findings
        self.item = item
        self.path = path
        self.wording = wording
        self.entries: dict[str, Entry] = item.value if item.is_mapping else {}
        self.read_keys: set[str] = set()

    def where(self, key: str | None = None) -> str:
        """The section's place, or its key's: `models.m.ttl`."""
        return dotted(self.path if key is None else self.path + (key,))

    def entry(self, key: str) -> Entry | None:
        """The entry for `key`, or None when absent or null (a null setting means the default)."""
        self.read_keys.add(key)
        entry = self.entries.get(key)
        return entry if entry is not None and entry.item.value is not None else None

    def fault(self, entry: Entry, message: str) -> None:
        """A fault about `entry`, after its place: `models.m.ttl: message`."""
        self.findings.fault(entry.key_line, f"{self.where(entry.key)}: {message}")

    def wrong(self, line: int, where: str, expected: str, item: Item, error: Exception) -> None:
        """A fault for a wrong value, in the format's wording."""
        self.findings.fault(line, self.wording(where, expected, item, error))

    def read(self, key: str, convert: Callable[[Item], T], expected: str, default: T) -> T:
        """`convert` of the value at `key`, which raises TypeError for a wrong type and ValueError
        for a wrong value; `default` when the value is absent, null or wrong (a fault)."""
        entry = self.entry(key)
        if entry is None:
            return default
        try:
            return convert(entry.item)
        except (TypeError, ValueError) as error:
            self.wrong(entry.key_line, self.where(key), expected, entry.item, error)
            return default

    def unread(self) -> list[Entry]:
        """The entries no read has asked for (unknown keys, once the section is read)."""
        return [entry for key, entry in self.entries.items() if key not in self.read_keys]


# Plain data checks, for `convert` functions: TypeError for a wrong type, ValueError for a wrong value.


def as_string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError()
    return value


def as_integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError()
    return value


def as_positive_integer(value: Any) -> int:
    number = as_integer(value)
    if number < 1:
        raise ValueError("it must be at least 1")
    return number


def as_port(value: Any) -> int:
    number = as_integer(value)
    if not 1 <= number <= 65535:
        raise ValueError("a port is 1 to 65535")
    return number


def as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError()
    return float(value)


def as_boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError()
    return value


def one_of(choices: Collection[str], what: str) -> Callable[[Any], str]:
    """A check that the value is a string among `choices` (`what` names it in the error)."""

    def check(value: Any) -> str:
        text = as_string(value)
        if text not in choices:
            raise ValueError(f"unknown {what} {text!r}")
        return text

    return check


def as_strings(value: Any) -> tuple[str, ...]:
    """An array of strings; a single string stands for an array of one."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TypeError()
    return tuple(value)
