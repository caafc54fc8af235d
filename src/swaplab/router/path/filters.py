"""Request body rewriting: the upstream's name for the model and a model's or peer's `filters`.

In llama-swap's order: `useModelName`, `stripParams`, `setParams`, then `setParamsByID`
for the name the request asked for, so a per-name value overrides `setParams`. Keys are
sjson paths (`jsonpath`): `a.b` reaches into a nested object.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from swaplab.config.model import Filters
from swaplab.router.path.jsonpath import delete_path, is_path, set_path
from swaplab.router.path.targets import UnreadableBody

PROTECTED = frozenset({"model"})


def rewrite(
    document: dict[str, Any], upstream_model: str | None, filters: Filters, requested: str | None = None
) -> dict[str, Any] | None:
    """The body to send instead of `document`, or None when nothing changes (the original bytes go).

    `requested` is the name the request routes by (after a profile's or a selector's
    rewriting): its `setParamsByID` entry, if any, applies last.
    """
    changed = False
    result = document
    if upstream_model is not None and document.get("model") != upstream_model:
        result = {**result, "model": upstream_model}
        changed = True
    if filters.strip_params:
        stripped = _strip(result, filters.strip_params)
        if stripped is not result:
            result = stripped
            changed = True
    if filters.set_params:
        result, changed = _set(result, filters.set_params, changed)
    if filters.set_params_by_id and requested is not None:
        by_name = filters.set_params_by_id.get(requested)
        if by_name:
            result, changed = _set(result, by_name, changed)
    return result if changed else None


def _strip(document: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """`document` without `names` (the same object when none of them is there)."""
    flat = [name for name in names if name not in PROTECTED and name in document and not is_path(name)]
    result = {key: value for key, value in document.items() if key not in flat} if flat else document
    for name in names:
        if is_path(name):
            result = delete_path(result, name)
    return result


def _set(document: dict[str, Any], params: dict[str, Any], changed: bool) -> tuple[dict[str, Any], bool]:
    """`params` set on `document`, in sorted key order; whether anything (now or before) changed."""
    if any(map(is_path, params)):
        for name in sorted(params):  # an `a` and an `a.b` apply in llama-swap's order
            if name not in PROTECTED:
                document = set_path(document, name, params[name])
        return document, True
    updates = {key: value for key, value in params.items() if key not in PROTECTED}
    if any(document.get(key, _MISSING) != value for key, value in updates.items()):
        return {**document, **updates}, True
    return document, changed


def encode(document: dict[str, Any]) -> bytes:
    """The rewritten body (orjson: a long prompt is re-encoded on every request that filters apply to);
    UnreadableBody for one nested deeper than json writes."""
    try:
        return orjson.dumps(document)
    except TypeError:  # an integer beyond 64 bits, read by json's fallback; nesting past orjson's 254 levels
        try:
            return json.dumps(document, ensure_ascii=False).encode()
        except RecursionError:  # read (up to 1024 levels) but not written again: json stops short of that
            message = "the body nests too deeply to be rewritten for its model (filters, its name)"
            raise UnreadableBody(400, message) from None


_MISSING = object()
