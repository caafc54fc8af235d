"""When two model entries are the same config: what a reload keeps running, what a result was measured with.

An entry's comments and its place in the file don't count; every resolved setting does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace

from swaplab.config.model import ModelConfig


def _resolved(model: ModelConfig) -> ModelConfig:
    """A model's entry as it runs: its comments and its position in the file don't count."""
    # `kv_cache` counts, as `sleep` does: it is a resolved setting, and a result measured with a
    # restored context (a short time to first token) was not measured with the same config as one
    # without it. A reload that only changes it restarts the model: one cold start, one rule.
    return replace(model, raw_text="", line=0)


def same_entry(old: ModelConfig, new: ModelConfig) -> bool:
    """Does a reload leave this model's running server as it is?"""
    return _resolved(old) == _resolved(new)


def entry_hash(model: ModelConfig) -> str:
    """A short, stable fingerprint of the resolved entry, for results measured through the router."""
    document = json.dumps(asdict(_resolved(model)), sort_keys=True, default=str)
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def context_hash(model: ModelConfig) -> str:
    """The entry's fingerprint as far as a saved KV cache is concerned: every resolved setting but
    `kvCache`'s own, which say when a cache is saved, not what it holds (`fleet.kvstore`)."""
    return entry_hash(replace(model, kv_cache=None))
