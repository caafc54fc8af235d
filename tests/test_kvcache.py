"""Saved KV caches: a command line's cache layout, the identity a cache is good for, the disk budget, the manifest."""

from __future__ import annotations

import json
import os

import pytest

from swaplab.fleet.kvcache import (
    MANIFEST,
    Layout,
    SavedCache,
    cache_file_name,
    cache_identity,
    cache_layout,
    changed_since_saved,
    forget_saved,
    over_budget,
    read_manifest,
    record_saved,
    restorable,
    sweep,
    with_slot_save_path,
)

WRAPPER = ["/venv/bin/python3", "-m", "swaplab.builtin.llamacpp"]


@pytest.mark.parametrize(
    ("argv", "layout"),
    [
        (["llama-server", "-m", "a.gguf", "-c", "4096", "-ctk", "q8_0", "-ctv", "q4_0", "-np", "2"],
         Layout(model="a.gguf", ctx_size="4096", cache_type_k="q8_0", cache_type_v="q4_0", parallel="2")),
        (["llama-server", "--model=a.gguf", "--ctx-size=8192", "--cache-type-k=f16", "--cache-type-v", "f16",
          "--parallel=4", "--slot-save-path=/saves/"],
         Layout(model="a.gguf", ctx_size="8192", cache_type_k="f16", cache_type_v="f16", parallel="4",
                slot_save_path="/saves/")),
        # flags that do not touch the cache are skipped, values and all; the last spelling wins
        ([*WRAPPER, "--port", "8081", "--model", "b.gguf", "-ngl", "99", "-c", "1024", "-c", "2048"],
         Layout(model="b.gguf", ctx_size="2048")),
        (["llama-server", "--port", "8080"], Layout()),
        # a flag at the very end without its value says nothing
        (["llama-server", "-m", "a.gguf", "-c"], Layout(model="a.gguf")),
        ([], Layout()),
    ],
)
def test_cache_layout_reads_the_flags_that_change_what_a_saved_cache_means(argv, layout):
    assert cache_layout(argv) == layout


BASE = Layout(model="a.gguf", ctx_size="4096", parallel="1")


def test_a_changed_entry_model_file_or_layout_gives_another_identity():
    identity = cache_identity("entry1", 1000, 5, BASE)
    assert len(identity) == 16 and int(identity, 16) >= 0
    assert cache_identity("entry1", 1000, 5, BASE) == identity  # stable
    others = [
        cache_identity("entry2", 1000, 5, BASE),  # the config entry changed
        cache_identity("entry1", 1001, 5, BASE),  # the model file was replaced by another size
        cache_identity("entry1", 1000, 6, BASE),  # ... or rewritten in place
        cache_identity("entry1", 1000, 5, Layout(model="b.gguf", ctx_size="4096", parallel="1")),
        cache_identity("entry1", 1000, 5, Layout(model="a.gguf", ctx_size="8192", parallel="1")),
        cache_identity("entry1", 1000, 5, Layout(model="a.gguf", ctx_size="4096", parallel="2")),
        cache_identity("entry1", 1000, 5, Layout(model="a.gguf", ctx_size="4096", parallel="1", cache_type_k="q8_0")),
        cache_identity("entry1", 1000, 5, Layout(model="a.gguf", ctx_size="4096", parallel="1", cache_type_v="q8_0")),
    ]
    assert len({identity, *others}) == len(others) + 1


def test_where_the_caches_are_saved_is_not_part_of_the_identity():
    moved = Layout(model="a.gguf", ctx_size="4096", parallel="1", slot_save_path="/elsewhere/")
    assert cache_identity("entry1", 1000, 5, moved) == cache_identity("entry1", 1000, 5, BASE)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["llama-server", "-m", "a.gguf"], ["llama-server", "-m", "a.gguf", "--slot-save-path", "/saves/"]),
        (["/opt/llama/bin/llama-server", "-m", "a.gguf"],
         ["/opt/llama/bin/llama-server", "-m", "a.gguf", "--slot-save-path", "/saves/"]),
        ([*WRAPPER, "--model", "a.gguf"], [*WRAPPER, "--model", "a.gguf", "--slot-save-path", "/saves/"]),
        # the user's own flag, either spelling, is left alone
        (["llama-server", "--slot-save-path", "/mine"], ["llama-server", "--slot-save-path", "/mine"]),
        (["llama-server", "--slot-save-path=/mine"], ["llama-server", "--slot-save-path=/mine"]),
        # not llama-server: another engine, or a wrapper that only mentions it
        (["vllm", "serve", "m"], ["vllm", "serve", "m"]),
        (["llama-server-wrapper", "-m", "a.gguf"], ["llama-server-wrapper", "-m", "a.gguf"]),
        (["python3", "-m", "swaplab.sim"], ["python3", "-m", "swaplab.sim"]),
        ([], []),
    ],
)
def test_with_slot_save_path_adds_the_directory_with_a_trailing_slash_to_llama_server_only(argv, expected):
    assert with_slot_save_path(argv, "/saves") == expected
    assert with_slot_save_path(argv, "/saves/") == expected


def saved(name: str, saved_at: float, size: int, identity: str = "id1", slot_id: int = 0) -> SavedCache:
    return SavedCache(identity=identity, slot_id=slot_id, tokens=10, bytes=size, saved_at=saved_at, file_name=name)


def names(caches: list[SavedCache]) -> list[str]:
    return [cache.file_name for cache in caches]


def test_over_budget_removes_the_least_recently_saved_first_until_the_rest_fit():
    caches = [saved("new", 30, 100), saved("old", 10, 100), saved("mid", 20, 100)]  # any order
    assert names(over_budget(caches, 300)) == []
    assert names(over_budget(caches, 299)) == ["old"]
    assert names(over_budget(caches, 200)) == ["old"]
    assert names(over_budget(caches, 150)) == ["old", "mid"]
    assert names(over_budget(caches, 0)) == ["old", "mid", "new"]
    assert over_budget([], 0) == []


def test_over_budget_breaks_a_tie_of_saved_at_by_file_name_whatever_the_order():
    tied = [saved("b", 10, 100), saved("a", 10, 100), saved("c", 5, 100)]
    assert names(over_budget(tied, 100)) == ["c", "a"]
    assert names(over_budget(list(reversed(tied)), 100)) == ["c", "a"]


def test_restorable_are_only_this_identitys_caches_by_slot():
    caches = [saved("x1", 1, 1, "id1", 1), saved("y0", 2, 1, "id2", 0), saved("x0", 3, 1, "id1", 0)]
    assert names(restorable(caches, "id1")) == ["x0", "x1"]
    assert names(restorable(caches, "id3")) == []


def write_cache(directory, identity: str, slot_id: int, size: int, saved_at: float = 1.0) -> SavedCache:
    name = cache_file_name(identity, slot_id)
    (directory / name).write_bytes(b"k" * size)
    # n_written as the server reports it may differ from the file: the manifest records the file
    return SavedCache(identity=identity, slot_id=slot_id, tokens=7, bytes=0, saved_at=saved_at, file_name=name)


def test_the_manifest_lists_what_was_recorded_with_each_files_size(tmp_path):
    assert read_manifest(tmp_path).caches == [] and read_manifest(tmp_path).notes == []  # nothing saved yet
    first = record_saved(tmp_path, write_cache(tmp_path, "id1", 0, 100))
    second = record_saved(tmp_path, write_cache(tmp_path, "id1", 1, 50, saved_at=2.0))
    assert (first.bytes, second.bytes) == (100, 50)
    manifest = read_manifest(tmp_path)
    assert manifest.caches == [first, second] and manifest.notes == []
    # a new save of the same slot replaces its entry
    again = record_saved(tmp_path, write_cache(tmp_path, "id1", 0, 120, saved_at=3.0))
    assert read_manifest(tmp_path).caches == [second, again]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temp file left


def test_a_truncated_or_missing_file_is_never_taken_for_a_good_one(tmp_path):
    whole = record_saved(tmp_path, write_cache(tmp_path, "id1", 0, 100))
    cut = record_saved(tmp_path, write_cache(tmp_path, "id1", 1, 100))
    gone = record_saved(tmp_path, write_cache(tmp_path, "id1", 2, 100))
    (tmp_path / cut.file_name).write_bytes(b"k" * 60)  # a save rewritten and cut short
    (tmp_path / gone.file_name).unlink()
    manifest = read_manifest(tmp_path)
    assert manifest.caches == [whole]
    assert manifest.notes == [f"{cut.file_name}: 60 bytes on disk, 100 recorded; dropped",
                              f"{gone.file_name}: missing; dropped"]


def test_a_file_changed_since_its_save_is_told_even_at_the_same_size(tmp_path):
    cache = record_saved(tmp_path, write_cache(tmp_path, "id1", 0, 100))
    assert len(cache.sha256) == 64 and changed_since_saved(tmp_path, cache) is None
    (tmp_path / cache.file_name).write_bytes(b"j" * 100)
    assert read_manifest(tmp_path).caches == [cache]  # its size alone would pass it
    assert "SHA-256 differs" in changed_since_saved(tmp_path, cache)
    (tmp_path / cache.file_name).unlink()
    assert "cannot be read" in changed_since_saved(tmp_path, cache)


def test_an_entry_saved_without_a_checksum_is_dropped(tmp_path):
    old = record_saved(tmp_path, write_cache(tmp_path, "id1", 0, 10))
    document = json.loads((tmp_path / MANIFEST).read_text())
    del document["caches"][0]["sha256"]  # as swaplab wrote it before checksums
    (tmp_path / MANIFEST).write_text(json.dumps(document))
    manifest = read_manifest(tmp_path)
    assert manifest.caches == []
    assert manifest.notes == [f"{old.file_name}: saved without a checksum (by an older swaplab); dropped"]


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ('{"version": 1, "caches": [', "unreadable"),
        ("\xff\xfe", "unreadable"),
        ("[]", "not a version 1 manifest"),
        ('{"version": 99, "caches": []}', "not a version 1 manifest"),
    ],
)
def test_a_corrupt_manifest_gives_no_caches_and_says_why(tmp_path, text, note):
    (tmp_path / "id1-slot0.bin").write_bytes(b"k" * 10)
    (tmp_path / MANIFEST).write_bytes(text.encode("latin-1"))
    manifest = read_manifest(tmp_path)
    assert manifest.caches == []
    assert len(manifest.notes) == 1 and note in manifest.notes[0]


def test_malformed_or_escaping_entries_are_left_out_and_the_rest_kept(tmp_path):
    good = record_saved(tmp_path, write_cache(tmp_path, "id1", 0, 10))
    document = json.loads((tmp_path / MANIFEST).read_text())
    document["caches"] += [
        {"identity": "id1"},  # fields missing
        "not an entry",
        {**document["caches"][0], "bytes": "10"},  # a size that is not a number
        {**document["caches"][0], "file_name": "../id1-slot0.bin"},  # outside the save directory
        {**document["caches"][0], "file_name": MANIFEST},
    ]
    (tmp_path / MANIFEST).write_text(json.dumps(document))
    manifest = read_manifest(tmp_path)
    assert manifest.caches == [good]
    assert len(manifest.notes) == 5


def test_forget_saved_takes_caches_out_of_the_manifest_and_deletes_their_files(tmp_path):
    old = record_saved(tmp_path, write_cache(tmp_path, "id1", 0, 100, saved_at=1.0))
    new = record_saved(tmp_path, write_cache(tmp_path, "id1", 1, 100, saved_at=2.0))
    forget_saved(tmp_path, over_budget(read_manifest(tmp_path).caches, 150))
    assert read_manifest(tmp_path).caches == [new] and read_manifest(tmp_path).notes == []
    assert not (tmp_path / old.file_name).exists()


def test_sweep_drops_cut_short_entries_and_deletes_only_old_unlisted_files_of_ours(tmp_path):
    kept = record_saved(tmp_path, write_cache(tmp_path, "a" * 16, 0, 100))
    cut = record_saved(tmp_path, write_cache(tmp_path, "b" * 16, 0, 100))
    (tmp_path / cut.file_name).write_bytes(b"k" * 10)  # a rewrite cut short
    old = tmp_path / cache_file_name("c" * 16, 1, "1a")  # a save cut short by a kill, long ago
    young = tmp_path / cache_file_name("d" * 16, 1, "2b")  # another router's save under way
    other = tmp_path / "notes.bin"  # not a name swaplab gives: never touched
    for path in (old, young, other):
        path.write_bytes(b"x")
    for path in (old, tmp_path / cut.file_name):
        os.utime(path, (1000.0, 1000.0))
    os.utime(young, (1990.0, 1990.0))
    manifest, deleted = sweep(tmp_path, now=2000.0, min_age=600.0)
    assert manifest.caches == [kept] and len(manifest.notes) == 1  # what was read, said once
    assert deleted == sorted([old.name, cut.file_name])
    assert young.exists() and other.exists() and (tmp_path / kept.file_name).exists()
    assert read_manifest(tmp_path).caches == [kept] and read_manifest(tmp_path).notes == []  # written back
