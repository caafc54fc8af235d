"""A swap that keeps the context, on the real llama.cpp server (xllamacpp) with the built-in models.

A long conversation on one model, a swap to the other, the first again: llama.cpp's own
`timings.cache_n` in the follow-up's answer says its prompt was read from the restored slot.
Then what must not restore (a changed entry, a corrupt or missing file), the disk budget, and
the router stopped by SIGTERM (its servers' slots saved, restored by the next router) or killed
by SIGKILL (no process left, nothing restorable written). The sim's side, faults included, is
in tests/test_kvcache_swap.py.
"""

from __future__ import annotations

import json
import shlex
import signal
import sqlite3
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest
from procs import Router, alive, eventually
from routerclient import running

from swaplab.builtin.models import GEMMA3, SMOLLM2, model_path
from swaplab.fleet.kvcache import read_manifest

pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")

PYTHON = shlex.quote(sys.executable)


def conversation(items: int) -> str:
    """A user message of about 12 tokens per item: something to remember, in many words."""
    return "Remember this list. " + " ".join(f"Item {i} is the number {i * 7}." for i in range(items))


def first_turn(items: int) -> list[dict]:
    return [{"role": "user", "content": conversation(items)}]


def follow_up(items: int, answer: str) -> list[dict]:
    return [*first_turn(items), {"role": "assistant", "content": answer},
            {"role": "user", "content": "What is item 3?"}]


async def chat(session: aiohttp.ClientSession, url: str, model: str, messages: list[dict]) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        answer = await response.json(content_type=None)
        assert response.status == 200, answer
        return answer


async def complete(session: aiohttp.ClientSession, url: str, model: str) -> None:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 2}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()


async def listing(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(f"{url}/running") as response:
        return await response.json()


def answer_text(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def wrapper(model: Path, alias: str, ctx: int, parallel: int = 1) -> str:
    return (f"{PYTHON} -m swaplab.builtin.llamacpp --model {shlex.quote(str(model))} --host 127.0.0.1"
            f" --port ${{PORT}} --alias {alias} --ctx-size {ctx} --parallel {parallel} --threads 2")


def small_config(store: Path, ctx: int = 2048, budget: float = 20, min_tokens: int = 100) -> str:
    """SmolLM2 with kvCache (a low minTokens: short prompts keep the test fast) and Gemma to swap to."""
    return f"""
healthCheckTimeout: 300
kvCache:
  path: {store}
  budgetGiB: {budget!r}
models:
  smollm2:
    cmd: {wrapper(model_path(SMOLLM2), "smollm2", ctx)}
    kvCache: {{minTokens: {min_tokens}}}
  gemma3-270m:
    cmd: {wrapper(model_path(GEMMA3), "gemma3-270m", 2048)}
"""


async def swap_away(session, url, items: int = 40) -> dict:
    """The long first turn on smollm2, then a swap to Gemma (smollm2's slots saved on the way out)."""
    first = await chat(session, url, "smollm2", first_turn(items))
    assert first["timings"]["cache_n"] == 0
    await complete(session, url, "gemma3-270m")
    return first


def activity_rows(router: Router) -> list[dict]:
    with sqlite3.connect(router.db) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT model, cached_tokens, metadata FROM activity ORDER BY id")
        return [{**dict(r), "metadata": json.loads(r["metadata"]) if r["metadata"] else {}} for r in rows]


async def wait_rows(router: Router, count: int) -> list[dict]:
    await eventually(lambda: router.db.exists() and len(activity_rows(router)) >= count, 15, f"{count} activity rows")
    return activity_rows(router)


async def test_the_built_in_default_keeps_smollm2s_context_across_a_swap(tmp_path):
    """The built-in default (kvCache on, minTokens 1024): the router adds --slot-save-path itself."""
    router = Router(None, tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            first = await swap_away(session, router.url, items=95)  # about 1,150 tokens
            prompt = first["usage"]["prompt_tokens"]
            assert prompt >= 1024
            saved = (await listing(session, router.url))["kv_cache"]["models"]["smollm2"]["saved"]
            assert len(saved) == 1 and saved[0]["tokens"] >= prompt and saved[0]["bytes"] > 1_000_000

            again = await chat(session, router.url, "smollm2", follow_up(95, answer_text(first)))
            # llama.cpp's own count: the first turn's prompt came from the restored slot.
            assert again["timings"]["cache_n"] >= prompt - 8
            assert again["timings"]["prompt_n"] < 64
            entry = (await running(session, router.url))["smollm2"]
            assert entry["kv_cache"]["restores"] == 1 and entry["kv_cache"]["restored_tokens"] >= prompt
            # The built-in cmd names no --slot-save-path: the router added its store's folder.
            argv = psutil.Process(entry["pid"]).cmdline()
            assert argv[argv.index("--slot-save-path") + 1] == f"{router.kv_cache_dir}/"
        rows = await wait_rows(router, 3)
        assert rows[2]["metadata"].get("context") == "restored"
        assert rows[2]["cached_tokens"] >= prompt - 8
        assert len(read_manifest(router.kv_cache_dir).caches) == 1
    finally:
        router.close()


async def test_a_changed_context_size_does_not_restore_and_a_corrupt_or_missing_file_serves_cold(tmp_path):
    store = tmp_path / "kvcache"
    first_dir, second_dir = tmp_path / "one", tmp_path / "two"
    first_dir.mkdir()
    second_dir.mkdir()
    (first_dir / "config.yaml").write_text(small_config(store, ctx=2048))
    router = Router(first_dir / "config.yaml", first_dir)
    try:
        async with aiohttp.ClientSession() as session:
            first = await swap_away(session, router.url)
            [cache] = read_manifest(store).caches
            # Same size, other bytes: its SHA-256 is not the saved one; the router forgets it and serves cold.
            size = (store / cache.file_name).stat().st_size
            (store / cache.file_name).write_bytes(b"\x5a" * size)
            again = await chat(session, router.url, "smollm2", follow_up(40, answer_text(first)))
            assert again["timings"]["cache_n"] == 0
            context = (await running(session, router.url))["smollm2"]["kv_cache"]
            assert context["restore_failures"] == 1 and "SHA-256" in context["last_failure"]
            assert read_manifest(store).caches == [] and not (store / cache.file_name).exists()

            # Saved again on the next swap; then its file goes missing: no restore asked, cold, served.
            await complete(session, router.url, "gemma3-270m")
            [cache] = read_manifest(store).caches
            (store / cache.file_name).unlink()
            again = await chat(session, router.url, "smollm2", follow_up(40, answer_text(first)))
            assert again["timings"]["cache_n"] == 0
            assert (await running(session, router.url))["smollm2"]["kv_cache"]["restores"] == 0

            await complete(session, router.url, "gemma3-270m")  # a good save to leave behind
            assert len(read_manifest(store).caches) == 1
    finally:
        router.close()

    # Another context size is another layout: the saved file is stale, never restored.
    (second_dir / "config.yaml").write_text(small_config(store, ctx=4096))
    router = Router(second_dir / "config.yaml", second_dir)
    try:
        async with aiohttp.ClientSession() as session:
            again = await chat(session, router.url, "smollm2", follow_up(40, answer_text(first)))
            assert again["timings"]["cache_n"] == 0
            context = (await running(session, router.url))["smollm2"]["kv_cache"]
            assert context["restores"] == 0 and context["restore_failures"] == 0
            saved = (await listing(session, router.url))["kv_cache"]["models"]["smollm2"]["saved"]
            assert [slot.get("stale") for slot in saved] == [True]
    finally:
        router.close()


async def test_the_disk_budget_removes_the_oldest_cache(tmp_path):
    store = tmp_path / "kvcache"
    text = f"""
healthCheckTimeout: 300
kvCache:
  path: {store}
  budgetGiB: 20
models:
  short:
    cmd: {wrapper(model_path(SMOLLM2), "short", 2048)}
    kvCache: {{minTokens: 100}}
  long:
    cmd: {wrapper(model_path(SMOLLM2), "long", 3072)}
    kvCache: {{minTokens: 100}}
"""
    (tmp_path / "config.yaml").write_text(text)
    router = Router(tmp_path / "config.yaml", tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            await chat(session, router.url, "short", first_turn(40))
            await chat(session, router.url, "long", first_turn(40))  # short saved
            [older] = read_manifest(store).caches
            # Room for one and a half caches of this size: the next save leaves room for one.
            (tmp_path / "config.yaml").write_text(text.replace("budgetGiB: 20", f"budgetGiB: {older.bytes * 1.5 / 1024**3!r}"))
            router.signal(signal.SIGHUP)
            await eventually(lambda: "config reloaded" in router.output(), 30, "the reload")
            await chat(session, router.url, "short", first_turn(40))  # long saved: short's old cache goes
            assert [c.model for c in read_manifest(store).caches] == ["long"]
            assert not (store / older.file_name).exists()
            document = await listing(session, router.url)
            assert document["kv_cache"]["used_bytes"] == read_manifest(store).caches[0].bytes
    finally:
        router.close()


async def test_sigterm_saves_the_context_for_the_next_router_and_sigkill_leaves_nothing(tmp_path):
    store = tmp_path / "kvcache"
    (tmp_path / "config.yaml").write_text(small_config(store))
    router = Router(tmp_path / "config.yaml", tmp_path)
    async with aiohttp.ClientSession() as session:
        first = await chat(session, router.url, "smollm2", first_turn(40))
        pid = (await running(session, router.url))["smollm2"]["pid"]
    router.signal(signal.SIGTERM)
    assert router.wait(60) == 0
    assert not alive(pid)
    [cache] = read_manifest(store).caches  # whole: its size on disk is the one recorded
    assert cache.tokens >= first["usage"]["prompt_tokens"]

    # A new router restores it: the context outlived the router.
    router = Router(tmp_path / "config.yaml", tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            again = await chat(session, router.url, "smollm2", follow_up(40, answer_text(first)))
            assert again["timings"]["cache_n"] >= first["usage"]["prompt_tokens"] - 8
            await chat(session, router.url, "smollm2", follow_up(40, answer_text(first)) + [
                {"role": "assistant", "content": answer_text(again)}, {"role": "user", "content": "And item 4?"}])
            pid = (await running(session, router.url))["smollm2"]["pid"]
        before = read_manifest(store).caches
        router.signal(signal.SIGKILL)
        router.wait(30)
        await eventually(lambda: not alive(pid), 30, "the server to die with its router")
    finally:
        router.close()
    # Killed, the router saved nothing: the manifest lists what it did before, each file whole.
    assert read_manifest(store).caches == before
    assert read_manifest(store).notes == []
