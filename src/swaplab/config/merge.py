"""`--config-dir`: several config files merged into one tree, by llama-swap's rules.

llama-swap (`-config-dir`) merges the `-config` file and then every `*.yml`/`*.yaml`
directly in the folder, in sorted path order, and loads the result as one config. The
rules, by the place a value has in the config:

- an *identity map* (`models`, `groups`, `profiles`, `selectors`, `peers`, `matrix`,
  `routing.router.settings.groups`, `routing.router.settings.matrix`) names one thing
  per key: the keys of every file are unioned, and the same key in two files is a
  fault (one model split across two files is a mistake, not a patch);
- any other mapping merges key by key (so `macros` collect by name, the keys of
  `routing.scheduler.settings.fifo.priority` too); keys keep their first file's order,
  new ones are appended;
- two lists concatenate (`apiKeys`, `hooks.on_startup.preload`, `upstream.ignorePaths`);
- two scalars must be equal, in value and in type; a different one is a conflict;
- a null (an empty value, or `~`) yields to the other side;
- anything else (a list where another file has a mapping) is a conflict.

The trees merged are the located ones (`config.tree`), so every value keeps the file
and line it was written at: a fault found while merging, or later while reading the
merged tree, is reported in the file that holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from swaplab.config.tree import Entry, Item, file_of

IDENTITY_MAPS = frozenset({
    ("models",),
    ("groups",),
    ("profiles",),
    ("selectors",),
    ("peers",),
    ("matrix",),
    ("routing", "router", "settings", "groups"),
    ("routing", "router", "settings", "matrix"),
})
"""Mappings whose keys each name one thing: a key defined in two files is a fault."""

Report = Callable[[int, str], None]
"""Records a fault: (line, message); the line knows its file (`tree.Line`)."""


def merge_trees(roots: Sequence[Item], report: Report) -> Item:
    """The top-level mappings of the files, in the order given, merged into one tree.

    Every fault is reported at the line of the later file's key; the earlier value stands.
    """
    merged = roots[0]
    for root in roots[1:]:
        merged = _merge_mappings(merged, root, (), report)
    return merged


def _merge_mappings(base: Item, overlay: Item, path: tuple[str, ...], report: Report) -> Item:
    entries = dict(base.value)
    identity = path in IDENTITY_MAPS
    for key, entry in overlay.value.items():
        earlier = entries.get(key)
        if earlier is None:
            entries[key] = entry
        elif identity:
            report(entry.key_line, f'duplicate {path[-1]} "{key}" (already defined at {_place(earlier.key_line)})')
        else:
            merged = _merge_values(earlier, entry, path + (key,), report)
            entries[key] = Entry(earlier.key, earlier.key_line, merged)
    return Item(entries, base.line, end_line=base.end_line)


def _merge_values(earlier: Entry, later: Entry, path: tuple[str, ...], report: Report) -> Item:
    base, overlay = earlier.item, later.item
    if overlay.value is None:
        return base
    if base.value is None:
        return overlay
    if base.is_mapping and overlay.is_mapping:
        return _merge_mappings(base, overlay, path, report)
    if base.is_sequence and overlay.is_sequence:
        return Item(base.value + overlay.value, base.line, end_line=base.end_line)
    where = ".".join(path)
    if base.is_scalar and overlay.is_scalar:
        if type(base.value) is not type(overlay.value) or base.text != overlay.text:
            report(
                later.key_line,
                f'conflict at "{where}": {overlay.text!r} differs from {base.text!r} set at {_place(earlier.key_line)}',
            )
        return base
    report(
        later.key_line,
        f'conflict at "{where}": incompatible YAML node kinds ({_kind(overlay)} here, '
        f"{_kind(base)} at {_place(earlier.key_line)})",
    )
    return base


def _kind(item: Item) -> str:
    return "a mapping" if item.is_mapping else "a list" if item.is_sequence else "a scalar"


def _place(line: int) -> str:
    return f"{file_of(line, '?')}:{line}"
