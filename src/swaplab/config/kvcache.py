"""A model's `kvCache:` and the top-level `kvCache:`: swaps that keep the context (issue 23).

```yaml
kvCache:
  path: ~/swaplab-kvcache   # default: the user data folder's kvcache/; relative: from this file's folder
  budgetGiB: 20             # disk all models' saved caches share; least recently used removed first
models:
  qwen:
    cmd: llama-server --port ${PORT} --slot-save-path ...
    kvCache: true           # or, with the defaults written out:
    # kvCache: {enabled: true, minTokens: 1024, saveTimeout: 30}
```

Only the config so far: nothing saves or restores a cache yet (docs/kvcache.md).
"""

from __future__ import annotations

from swaplab.config.model import KvCacheConfig, KvCacheStore, default_kvcache_path
from swaplab.config.settings import path_beside_config
from swaplab.config.yamlreader import YamlSection, shown

DEFAULT_MIN_TOKENS = 1024
DEFAULT_SAVE_TIMEOUT = 30.0
DEFAULT_BUDGET_GIB = 20.0


def read_kv_cache(model: YamlSection) -> KvCacheConfig | None:
    """The model's `kvCache:` (true, false or a mapping); None when absent or switched off."""
    entry = model.entry("kvCache")
    if entry is None:
        return None
    if entry.item.is_scalar:
        return KvCacheConfig() if model.boolean("kvCache", False) else None
    if not entry.item.is_mapping:
        model.fault(entry, f"expected true, false or a mapping, got {shown(entry.item)}")
        return None
    section = YamlSection(model.findings, entry.item, model.path + ("kvCache",))
    enabled = section.boolean("enabled", True)
    # The other keys are read even when switched off: a mistake should not wait for the day it is turned on.
    min_tokens = section.integer("minTokens", DEFAULT_MIN_TOKENS, minimum=1)
    save_timeout = section.number("saveTimeout", DEFAULT_SAVE_TIMEOUT)
    if save_timeout == 0:
        section.fault(section.entries["saveTimeout"], "must be more than 0 seconds")
    section.finish()
    if not enabled:
        return None
    return KvCacheConfig(min_tokens=min_tokens, save_timeout=save_timeout or DEFAULT_SAVE_TIMEOUT)


def read_kv_cache_store(section: YamlSection | None, config_path: str) -> KvCacheStore:
    """The top-level `kvCache:`; absent: the user data folder's kvcache/ and 20 GiB."""
    if section is None:
        return KvCacheStore(path=default_kvcache_path(), budget_gib=DEFAULT_BUDGET_GIB)
    path_entry = section.entry("path")
    path = section.string("path", "")
    if path_entry is not None and path_entry.item.is_scalar and not path.strip():
        section.fault(path_entry, "names the folder for saved KV caches; leave it out for the default")
    budget = section.number("budgetGiB", DEFAULT_BUDGET_GIB, unit="GiB")
    if budget == 0:
        section.fault(section.entries["budgetGiB"], "must be more than 0 GiB")
    section.finish()
    return KvCacheStore(
        path=path_beside_config(path, config_path) if path.strip() else default_kvcache_path(),
        budget_gib=budget or DEFAULT_BUDGET_GIB,
    )
