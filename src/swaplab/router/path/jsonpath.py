"""sjson's dotted paths over a parsed JSON body: how llama-swap's filters name the field they set or strip.

`a.b` is field `b` inside object `a`; `\\.` is a literal dot; a number indexes an array
(`-1` appends; past the end pads with null), and `:2313` forces an object key that looks
like a number. A path that does not exist yet is created: objects, or an array where the
part is a number. Neither function changes its argument: the containers along the path
are copied, the rest shared.
"""

from __future__ import annotations

from typing import Any


def is_path(key: str) -> bool:
    """Whether `key` means more than a top-level field of that exact name."""
    return "." in key or "\\" in key or key.startswith(":")


def split(path: str) -> list[tuple[str, bool]]:
    """The parts of `path`, each with whether it was forced to be an object key (`:`)."""
    parts: list[tuple[str, bool]] = []
    current: list[str] = []
    escaped = False
    for character in path:
        if escaped:
            current.append(character)
            escaped = False
        elif character == "\\":
            escaped = True
        elif character == ".":
            parts.append(_part("".join(current)))
            current = []
        else:
            current.append(character)
    parts.append(_part("".join(current)))
    return parts


def _part(text: str) -> tuple[str, bool]:
    if text.startswith(":"):
        return text[1:], True
    return text, False


def _index(part: str, forced: bool) -> int | None:
    """The array index a part names (-1 = append), or None for an object key."""
    if forced:
        return None
    if part == "-1":
        return -1
    return int(part) if part.isascii() and part.isdigit() else None


def set_path(document: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`document` with `value` at `path` (sjson's `Set`)."""
    return _set(document, split(path), value)


def _set(node: Any, parts: list[tuple[str, bool]], value: Any) -> Any:
    (part, forced), rest = parts[0], parts[1:]
    index = _index(part, forced)
    if isinstance(node, list) and index is not None:
        result = list(node)
        if index == -1:
            result.append(_set(None, rest, value) if rest else value)
            return result
        while len(result) <= index:
            result.append(None)
        result[index] = _set(result[index], rest, value) if rest else value
        return result
    if not isinstance(node, dict):
        if index is not None:  # a new array where the part is a number
            return _set([], parts, value)
        node = {}
    result = dict(node)
    result[part] = _set(node.get(part), rest, value) if rest else value
    return result


def delete_path(document: dict[str, Any], path: str) -> dict[str, Any]:
    """`document` without what `path` names (sjson's `Delete`); the same object when it names nothing."""
    return _delete(document, split(path))


def _delete(node: Any, parts: list[tuple[str, bool]]) -> Any:
    (part, forced), rest = parts[0], parts[1:]
    if isinstance(node, list):
        index = _index(part, forced)
        if index is None or not node or index >= len(node):
            return node
        if index == -1:
            index = len(node) - 1
        if not rest:
            return node[:index] + node[index + 1:]
        child = _delete(node[index], rest)
        return node if child is node[index] else [*node[:index], child, *node[index + 1:]]
    if not isinstance(node, dict) or part not in node:
        return node
    if not rest:
        return {key: item for key, item in node.items() if key != part}
    child = _delete(node[part], rest)
    return node if child is node[part] else {**node, part: child}
