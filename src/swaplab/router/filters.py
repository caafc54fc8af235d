"""Request body rewriting: the upstream's name for the model and a model's or peer's `filters`."""

from __future__ import annotations

import json
from typing import Any

import orjson

from swaplab.config.model import Filters

PROTECTED = frozenset({"model"})


def rewrite(document: dict[str, Any], upstream_model: str | None, filters: Filters) -> dict[str, Any] | None:
    """The body to send instead of `document`, or None when nothing changes (the original bytes go)."""
    changed = False
    result = document
    if upstream_model is not None and document.get("model") != upstream_model:
        result = {**result, "model": upstream_model}
        changed = True
    strip = [key for key in filters.strip_params if key not in PROTECTED and key in result]
    if strip:
        result = {key: value for key, value in result.items() if key not in strip}
        changed = True
    if filters.set_params:
        updates = {key: value for key, value in filters.set_params.items() if key not in PROTECTED}
        if any(result.get(key, _MISSING) != value for key, value in updates.items()):
            result = {**result, **updates}
            changed = True
    return result if changed else None


def encode(document: dict[str, Any]) -> bytes:
    """The rewritten body (orjson: a long prompt is re-encoded on every request that filters apply to)."""
    try:
        return orjson.dumps(document)
    except TypeError:  # an integer beyond 64 bits, read by json's fallback
        return json.dumps(document, ensure_ascii=False).encode()


_MISSING = object()
