"""A model's `kvCache:` and the top-level `kvCache:` (issue 23): defaults, the shorthand, what is refused and where."""

from __future__ import annotations

import os

import platformdirs
from configtext import faults_of, load

from swaplab.config import load_config_text
from swaplab.config.identity import entry_hash, same_entry
from swaplab.config.model import KvCacheConfig, KvCacheStore


def test_absent_is_off_and_the_store_has_its_defaults():
    config = load("""
        models:
          a:
            cmd: llama-server --port ${PORT}
    """)
    assert config.models["a"].kv_cache is None
    expected = os.path.join(platformdirs.user_data_dir("swaplab"), "kvcache")
    assert config.kv_cache_store == KvCacheStore(path=expected, budget_gib=20.0)


def test_true_is_the_defaults_and_false_is_off():
    config = load("""
        models:
          a:
            cmd: llama-server --port ${PORT}
            kvCache: true
          b:
            cmd: llama-server --port ${PORT}
            kvCache: false
          c:
            cmd: llama-server --port ${PORT}
            kvCache: yes
    """)
    assert config.models["a"].kv_cache == KvCacheConfig(min_tokens=1024, save_timeout=30.0)
    assert config.models["b"].kv_cache is None
    assert config.models["c"].kv_cache == KvCacheConfig()


def test_a_mapping_is_on_unless_it_says_enabled_false():
    config = load("""
        models:
          a:
            cmd: llama-server --port ${PORT}
            kvCache: {minTokens: 256, saveTimeout: 2.5}
          b:
            cmd: llama-server --port ${PORT}
            kvCache:
              enabled: true
          c:
            cmd: llama-server --port ${PORT}
            kvCache: {enabled: false, minTokens: 4096}
    """)
    assert config.models["a"].kv_cache == KvCacheConfig(min_tokens=256, save_timeout=2.5)
    assert config.models["b"].kv_cache == KvCacheConfig()
    assert config.models["c"].kv_cache is None


def test_the_store_path_expands_home_and_is_taken_from_the_config_files_folder(tmp_path):
    text = "kvCache:\n  path: {}\n  budgetGiB: 2.5\nmodels:\n  a:\n    cmd: llama-server --port ${{PORT}}\n"
    config_path = str(tmp_path / "config.yaml")
    relative = load_config_text(text.format("caches/kv"), config_path, environ={})
    assert relative.kv_cache_store == KvCacheStore(path=str(tmp_path / "caches" / "kv"), budget_gib=2.5)
    home = load_config_text(text.format("~/kv"), config_path, environ={})
    assert home.kv_cache_store.path == os.path.expanduser("~/kv")
    absolute = load_config_text(text.format("/var/cache/kv"), config_path, environ={})
    assert absolute.kv_cache_store.path == "/var/cache/kv"


def test_a_store_section_without_a_path_keeps_the_default_folder():
    config = load("""
        kvCache:
          budgetGiB: 100
    """)
    assert config.kv_cache_store.path == os.path.join(platformdirs.user_data_dir("swaplab"), "kvcache")
    assert config.kv_cache_store.budget_gib == 100


def test_macros_reach_both_sections():
    config = load("""
        macros:
          kvdir: /srv/kv
          least: 64
        kvCache:
          path: ${kvdir}
        models:
          a:
            cmd: llama-server --port ${PORT}
            kvCache: {minTokens: "${least}"}
    """)
    assert config.kv_cache_store.path == "/srv/kv"
    kv_cache = config.models["a"].kv_cache
    assert kv_cache is not None and kv_cache.min_tokens == 64


def test_a_changed_kv_cache_is_a_changed_entry():
    def model(kv_cache: str):
        return load(f"""
            models:
              a:
                cmd: llama-server --port ${{PORT}}
                {kv_cache}
        """).models["a"]

    plain, on, fewer = model(""), model("kvCache: true"), model("kvCache: {minTokens: 8}")
    assert not same_entry(plain, on) and not same_entry(on, fewer)
    assert same_entry(on, model("kvCache: {enabled: true, minTokens: 1024, saveTimeout: 30}"))
    assert same_entry(plain, model("kvCache: false"))
    assert len({entry_hash(plain), entry_hash(on), entry_hash(fewer)}) == 3


def test_every_mistake_is_a_fault_at_its_line():
    faults = faults_of("""
        kvCache:
          path: ""
          budgetGiB: 0
        models:
          a:
            cmd: x --port ${PORT}
            kvCache: maybe
          b:
            cmd: x --port ${PORT}
            kvCache: [on]
          c:
            cmd: x --port ${PORT}
            kvCache:
              enabled: sometimes
              minTokens: 0
              saveTimeout: 0
          d:
            cmd: x --port ${PORT}
            kvCache: {minTokens: 1.5, saveTimeout: -1}
          e:
            cmd: x --port ${PORT}
            kvCache: {minTokens: lots, saveTimeout: 30s}
          f:
            cmd: x --port ${PORT}
            kvCache: {enabled: false, minTokens: -3}
    """)
    assert faults == [
        (3, "kvCache.path: names the folder for saved KV caches; leave it out for the default"),
        (4, "kvCache.budgetGiB: must be more than 0 GiB"),
        (8, "models.a.kvCache: expected true or false, got 'maybe'"),
        (11, "models.b.kvCache: expected true, false or a mapping, got a list"),
        (15, "models.c.kvCache.enabled: expected true or false, got 'sometimes'"),
        (16, "models.c.kvCache.minTokens: must be at least 1, got 0"),
        (17, "models.c.kvCache.saveTimeout: must be more than 0 seconds"),
        (20, "models.d.kvCache.minTokens: expected a whole number, got '1.5'"),
        (20, "models.d.kvCache.saveTimeout: must not be negative, got -1"),
        (23, "models.e.kvCache.minTokens: expected a whole number, got 'lots'"),
        (23, "models.e.kvCache.saveTimeout: expected a number of seconds, got '30s'"
             " (write a plain number of seconds, without a unit, as llama-swap requires)"),
        (26, "models.f.kvCache.minTokens: must be at least 1, got -3"),
    ]


def test_a_wrong_type_for_the_store_is_a_fault_at_its_line():
    faults = faults_of("""
        models: {}
        kvCache: /srv/kv
    """)
    assert faults == [(3, "kvCache: expected a mapping, got '/srv/kv'")]


def test_unknown_keys_are_warnings_with_their_lines():
    config = load("""
        kvCache:
          path: /srv/kv
          budget: 10
        models:
          a:
            cmd: x --port ${PORT}
            kvCache:
              minToken: 10
    """)
    assert config.warnings == (
        "test.yaml:4: unknown key 'budget' ignored (did you mean 'budgetGiB'?)",
        "test.yaml:9: unknown key 'minToken' ignored (did you mean 'minTokens'?)",
    )
