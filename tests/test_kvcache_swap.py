"""A swap that keeps the context (`kvCache:`), end to end over HTTP with `swaplab sim` imitating
llama.cpp's slots: saved before a swap stops the server, restored before its return is admitted,
and every failure a fall back to a cold prefill that still serves. The real llama.cpp server's
side of it is in tests/test_kvcache_llamacpp.py.

The sim's `-m` names a real file (the cache identity reads its size and mtime) and its
`--slot-save-path` is the store's folder, as the router would add it for llama-server.
Order comes from events (`/running`, the sims' `/sim/stats`, the metrics), never from sleeps.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest
from procs import SIM, alive, eventually, run_swaplab
from routerclient import running, sim_stats

from swaplab.fleet.kvcache import MANIFEST, read_manifest

LONG = " ".join(f"word{i}" for i in range(60))  # the sim counts words: 60+ tokens
FOLLOW_UP = LONG + " and one more question"


def model_file(tmp_path: Path, name: str = "a.gguf") -> Path:
    path = tmp_path / name
    if not path.exists():
        path.write_bytes(b"GGUF not really")
    return path


def config(tmp_path: Path, *, flags: str = "", kv: str = "{minTokens: 20, saveTimeout: 5}", budget: float = 1,
           model: Path | None = None, b_flags: str = "") -> str:
    store = tmp_path / "kvcache"
    model = model or model_file(tmp_path)
    return f"""
kvCache:
  path: {store}
  budgetGiB: {budget}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model {model} --slot-save-path {store} --timings {flags}
    kvCache: {kv}
  b:
    cmd: {SIM} --port ${{PORT}} --model b --timings {b_flags}
"""


async def ask(session: aiohttp.ClientSession, url: str, model: str, prompt: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        answer = await response.json(content_type=None)
        assert response.status == 200, answer
        return answer


async def listing(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(f"{url}/running") as response:
        return await response.json()


async def metric(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    pattern = rf"^{re.escape(name)}\{{{re.escape(wanted)}\}} (\S+)$" if labels else rf"^{re.escape(name)} (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def activity(router, count: int) -> list[dict]:
    """The activity table once it holds `count` rows (the router writes them in the background)."""

    def rows() -> list[dict]:
        if not router.db.exists():
            return []
        with sqlite3.connect(router.db) as db:
            db.row_factory = sqlite3.Row
            found = db.execute("SELECT model, status, cached_tokens, waited_for, metadata FROM activity ORDER BY id")
            return [{**dict(row), "metadata": json.loads(row["metadata"]) if row["metadata"] else {}} for row in found]

    await eventually(lambda: len(rows()) >= count, 10, f"{count} activity rows")
    return rows()


async def swap_away_and_back(session, url) -> tuple[dict, dict]:
    """A long conversation on a, a swap to b, a follow-up on a: the first and the last answer."""
    first = await ask(session, url, "a", LONG)
    await ask(session, url, "b", "hello")
    return first, await ask(session, url, "a", FOLLOW_UP)


async def test_a_b_a_restores_a_s_context_and_says_so_everywhere(router_factory, tmp_path):
    router = router_factory(config(tmp_path))
    url = router.url
    async with aiohttp.ClientSession() as session:
        first, follow_up = await swap_away_and_back(session, url)
        assert first["timings"]["cache_n"] == 0
        prompt = first["timings"]["prompt_n"]
        # Served from the restored slot: all of the first prompt read from the cache, only the new words prefilled.
        assert follow_up["timings"]["cache_n"] >= prompt
        assert follow_up["timings"]["prompt_n"] < prompt

        document = await listing(session, url)
        entry = {e["model"]: e for e in document["running"]}["a"]
        assert entry["kv_cache"]["restores"] == 1 and entry["kv_cache"]["restored_tokens"] >= prompt
        saved = document["kv_cache"]["models"]["a"]["saved"]
        assert len(saved) == 1 and saved[0]["tokens"] >= prompt and saved[0]["bytes"] > 0
        assert "stale" not in saved[0] and saved[0]["age_seconds"] >= 0
        assert document["kv_cache"]["used_bytes"] == saved[0]["bytes"]
        assert "b" not in document["kv_cache"]["models"]  # b has no kvCache
        assert (tmp_path / "kvcache").stat().st_mode & 0o077 == 0  # the conversation's tokens: its owner's only
        [cache] = read_manifest(tmp_path / "kvcache").caches
        assert (tmp_path / "kvcache" / cache.file_name).stat().st_mode & 0o777 == 0o600  # the server wrote it 0644

        assert await metric(session, url, "swaplab:kvcache_saves_total", model="a", outcome="ok") == 1
        assert await metric(session, url, "swaplab:kvcache_restores_total", model="a", outcome="ok") == 1
        assert await metric(session, url, "swaplab:kvcache_bytes_total", model="a", direction="saved") == saved[0]["bytes"]
        assert await metric(session, url, "swaplab:kvcache_bytes_total", model="a", direction="restored") == saved[0]["bytes"]
        assert await metric(session, url, "swaplab:kvcache_save_seconds_count", model="a") == 1
        assert await metric(session, url, "swaplab:kvcache_disk_bytes") == saved[0]["bytes"]

        # The live feed's modelStatus carries it for the page, stopped models too.
        async with session.get(f"{url}/api/models") as response:
            assert response.status == 200

    rows = await activity(router, 3)
    assert [r["model"] for r in rows] == ["a", "b", "a"]
    assert rows[2]["metadata"].get("context") == "restored" and rows[2]["cached_tokens"] >= prompt
    assert "context" not in rows[0]["metadata"]
    # `swaplab activity` says it beside the TTFT, of that request alone.
    printed = run_swaplab("activity", "--db", str(router.db), env={"COLUMNS": "200"})
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.count("(restored)") == 1


async def test_a_later_cache_hit_of_the_same_run_is_not_called_restored(router_factory, tmp_path):
    router = router_factory(config(tmp_path))
    async with aiohttp.ClientSession() as session:
        await swap_away_and_back(session, router.url)
        again = await ask(session, router.url, "a", FOLLOW_UP + " again")
        assert again["timings"]["cache_n"] > 0  # the run's own cache
    rows = await activity(router, 4)
    assert [r["metadata"].get("context") for r in rows] == [None, None, "restored", None]


async def test_a_slot_below_min_tokens_is_not_saved(router_factory, tmp_path):
    router = router_factory(config(tmp_path, kv="{minTokens: 500}"))
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        proxy_a = (await running(session, router.url))["a"]["proxy"]
        await ask(session, router.url, "b", "hello")
        document = await listing(session, router.url)
        assert document["kv_cache"]["models"]["a"]["saved"] == []
        assert await metric(session, router.url, "swaplab:kvcache_saves_total", model="a", outcome="ok") == 0
    assert read_manifest(tmp_path / "kvcache").caches == []
    del proxy_a


async def test_a_failed_save_costs_the_context_not_the_swap(router_factory, tmp_path):
    router = router_factory(config(tmp_path, flags="--slot-fault save-error"))
    async with aiohttp.ClientSession() as session:
        first, follow_up = await swap_away_and_back(session, router.url)
        assert follow_up["timings"]["cache_n"] == 0  # a cold prefill, and it served
        assert await metric(session, router.url, "swaplab:kvcache_saves_total", model="a", outcome="failed") == 1
        context = (await running(session, router.url))["a"]["kv_cache"]
        assert context["save_failures"] == 1 and "HTTP 500" in context["last_failure"]
    assert read_manifest(tmp_path / "kvcache").caches == []
    assert [p.name for p in (tmp_path / "kvcache").glob("*.bin")] == []  # nothing half-written left


async def test_a_save_that_hangs_is_cut_at_save_timeout_and_the_swap_goes_on(router_factory, tmp_path):
    router = router_factory(config(tmp_path, flags="--slot-fault save-hang", kv="{minTokens: 20, saveTimeout: 0.5}"))
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")  # answered: the hung save did not hold the swap
        document = await listing(session, router.url)
        assert document["kv_cache"]["models"]["a"]["saved"] == []
        assert await metric(session, router.url, "swaplab:kvcache_saves_total", model="a", outcome="failed") == 1
        follow_up = await ask(session, router.url, "a", FOLLOW_UP)
        assert follow_up["timings"]["cache_n"] == 0
        assert "no answer within its saveTimeout of 0.5 s" in (await running(session, router.url))["a"]["kv_cache"]["last_failure"]


async def test_a_restore_the_server_refuses_falls_back_to_a_cold_prefill_visibly_and_is_forgotten(
    router_factory, tmp_path
):
    router = router_factory(config(tmp_path, flags="--slot-fault restore-error"))
    store = tmp_path / "kvcache"
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")
        [cache] = read_manifest(store).caches
        follow_up = await ask(session, router.url, "a", FOLLOW_UP)
        assert follow_up["timings"]["cache_n"] == 0
        context = (await running(session, router.url))["a"]["kv_cache"]
        assert context["restore_failures"] == 1 and context["restores"] == 0
        assert "restoring slot 0" in context["last_failure"] and "HTTP 500" in context["last_failure"]
        assert await metric(session, router.url, "swaplab:kvcache_restores_total", model="a", outcome="failed") == 1
    assert read_manifest(store).caches == [] and not (store / cache.file_name).exists()
    rows = await activity(router, 3)
    assert "cold prefill" in rows[2]["metadata"].get("fallback", "") and "context" not in rows[2]["metadata"]


@pytest.mark.parametrize("poison", [
    lambda data: b"\0" * len(data),  # a corrupt file
    lambda data: data.replace(b"word", b"WORD"),  # another conversation, one the server would restore
], ids=["corrupt", "another-conversation"])
async def test_a_same_size_file_in_a_saved_caches_place_is_never_restored(router_factory, tmp_path, poison):
    router = router_factory(config(tmp_path))
    store = tmp_path / "kvcache"
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")
        [cache] = read_manifest(store).caches
        data = (store / cache.file_name).read_bytes()
        (store / cache.file_name).write_bytes(poison(data))
        assert len(poison(data)) == len(data) and read_manifest(store).caches == [cache]  # its size says nothing
        follow_up = await ask(session, router.url, "a", FOLLOW_UP)
        assert follow_up["timings"]["cache_n"] == 0
        stats = await sim_stats(session, (await running(session, router.url))["a"]["proxy"])
        assert stats["slot_restores"] == 0  # never handed to the server
        context = (await running(session, router.url))["a"]["kv_cache"]
        assert context["restore_failures"] == 1 and context["restores"] == 0
        assert "restoring slot 0" in context["last_failure"] and "SHA-256" in context["last_failure"]
        assert await metric(session, router.url, "swaplab:kvcache_restores_total", model="a", outcome="failed") == 1
    assert read_manifest(store).caches == [] and not (store / cache.file_name).exists()
    rows = await activity(router, 3)
    assert "cold prefill" in rows[2]["metadata"].get("fallback", "") and "context" not in rows[2]["metadata"]
    assert "is not the one saved" in router.output()  # logged


async def test_a_missing_file_is_no_restore_and_a_cold_prefill_that_serves(router_factory, tmp_path):
    router = router_factory(config(tmp_path))
    store = tmp_path / "kvcache"
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")
        [cache] = read_manifest(store).caches
        (store / cache.file_name).unlink()
        follow_up = await ask(session, router.url, "a", FOLLOW_UP)
        assert follow_up["timings"]["cache_n"] == 0
        stats = await sim_stats(session, (await running(session, router.url))["a"]["proxy"])
        assert stats["slot_restores"] == 0  # never asked: the manifest's entry was dropped first
    assert read_manifest(store).caches == []


async def test_a_restore_that_kills_the_server_starts_it_cold_and_the_request_is_served(router_factory, tmp_path):
    router = router_factory(config(tmp_path, flags="--slot-fault restore-crash"))
    store = tmp_path / "kvcache"
    async with aiohttp.ClientSession() as session:
        first, follow_up = await swap_away_and_back(session, router.url)
        assert follow_up["timings"]["cache_n"] == 0
        context = (await running(session, router.url))["a"]["kv_cache"]
        assert context["restore_failures"] == 1 and "exited with code 70" in context["last_failure"]
        # The cold start saved nothing yet, and the file that killed it is gone.
        assert read_manifest(store).caches == []
    rows = await activity(router, 3)
    assert [r["status"] for r in rows] == [200, 200, 200]
    assert "started cold" in rows[2]["metadata"].get("fallback", "")


async def test_a_hung_restore_is_cut_at_save_timeout_and_says_restoring_context_meanwhile(router_factory, tmp_path):
    text = config(tmp_path, flags="--slot-fault restore-hang", kv="{minTokens: 20, saveTimeout: 3}").replace(
        "    kvCache: {minTokens: 20, saveTimeout: 3}",
        "    kvCache: {minTokens: 20, saveTimeout: 3}\n    sendLoadingState: true")
    router = router_factory(text)
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")
        body = {"model": "a", "messages": [{"role": "user", "content": FOLLOW_UP}], "max_tokens": 2, "stream": True}
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            text = (await response.read()).decode()
        assert "a: restoring context" in text  # the loading state named the phase
        assert "[DONE]" in text
        context = (await running(session, router.url))["a"]["kv_cache"]
        assert context["restore_failures"] == 1 and "no answer within" in context["last_failure"]


async def test_a_changed_entry_never_restores_the_old_cache(router_factory, tmp_path):
    store = tmp_path / "kvcache"
    text = config(tmp_path)
    router = router_factory(text)
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")
    router.close()
    assert len(read_manifest(store).caches) == 1
    # Another layout (two slots) is another identity: the old file stays, stale, and is not restored.
    changed = router_factory(config(tmp_path, flags="--parallel 2"))
    async with aiohttp.ClientSession() as session:
        follow_up = await ask(session, changed.url, "a", FOLLOW_UP)
        assert follow_up["timings"]["cache_n"] == 0
        stats = await sim_stats(session, (await running(session, changed.url))["a"]["proxy"])
        assert stats["slot_restores"] == 0
        saved = (await listing(session, changed.url))["kv_cache"]["models"]["a"]["saved"]
        assert [s.get("stale") for s in saved] == [True]


async def test_a_touched_model_file_never_restores_the_old_cache(router_factory, tmp_path):
    store = tmp_path / "kvcache"
    router = router_factory(config(tmp_path))
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")
        model_file(tmp_path).write_bytes(b"GGUF another model now")  # re-downloaded, say
        follow_up = await ask(session, router.url, "a", FOLLOW_UP)
        assert follow_up["timings"]["cache_n"] == 0
        stats = await sim_stats(session, (await running(session, router.url))["a"]["proxy"])
        assert stats["slot_restores"] == 0
    assert len(read_manifest(store).caches) == 1  # kept until the budget wants its room


def two_kv_models(tmp_path: Path, budget: float) -> str:
    store = tmp_path / "kvcache"
    first_model, second_model = model_file(tmp_path, "first.gguf"), model_file(tmp_path, "second.gguf")
    return f"""
kvCache:
  path: {store}
  budgetGiB: {budget!r}
models:
  first:
    cmd: {SIM} --port ${{PORT}} --model {first_model} --slot-save-path {store} --timings
    kvCache: {{minTokens: 20}}
  second:
    cmd: {SIM} --port ${{PORT}} --model {second_model} --slot-save-path {store} --timings
    kvCache: {{minTokens: 20}}
  b:
    cmd: {SIM} --port ${{PORT}} --model b
"""


async def test_the_disk_budget_removes_the_least_recently_used_cache(router_factory, tmp_path):
    store = tmp_path / "kvcache"
    router = router_factory(two_kv_models(tmp_path, 1))
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "first", LONG)
        await ask(session, router.url, "second", LONG)  # first saved
        [first] = read_manifest(store).caches
        assert first.model == "first"
        # A budget of one and a half such caches (a reload: the models keep running): the next save
        # puts the two over it, and the least recently used goes.
        (tmp_path / "config.yaml").write_text(
            (tmp_path / "config.yaml").read_text().replace("budgetGiB: 1\n", f"budgetGiB: {first.bytes * 1.5 / 1024**3!r}\n"))
        router.signal(signal.SIGHUP)
        await eventually(lambda: "config reloaded" in router.output(), 30, "the reload")
        await ask(session, router.url, "b", "hello")  # second saved: over the budget, first removed
        assert [c.model for c in read_manifest(store).caches] == ["second"]
        assert await metric(session, router.url, "swaplab:kvcache_evictions_total", model="first") == 1
        document = await listing(session, router.url)
        assert document["kv_cache"]["models"]["first"]["saved"] == []
        assert len(document["kv_cache"]["models"]["second"]["saved"]) == 1
    assert [p.name for p in store.glob("*.bin")] == [read_manifest(store).caches[0].file_name]


async def test_a_file_no_manifest_lists_is_never_restored(router_factory, tmp_path):
    """A save cut short by a kill leaves a file under a fresh name the manifest never listed."""
    store = tmp_path / "kvcache"
    router = router_factory(config(tmp_path))
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        await ask(session, router.url, "b", "hello")
        [cache] = read_manifest(store).caches
        # What a killed save leaves: its own name, not listed (the good one is unlisted by hand here).
        (store / MANIFEST).write_text(json.dumps({"version": 1, "caches": []}))
        follow_up = await ask(session, router.url, "a", FOLLOW_UP)
        assert follow_up["timings"]["cache_n"] == 0
        stats = await sim_stats(session, (await running(session, router.url))["a"]["proxy"])
        assert stats["slot_restores"] == 0
    assert (store / cache.file_name).exists()  # young: it may be another router's save under way


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
async def test_the_router_killed_during_a_save_leaves_no_process_and_nothing_restorable(
    router_factory, tmp_path, signum
):
    store = tmp_path / "kvcache"
    router = router_factory(config(tmp_path, flags="--slot-fault save-hang", kv="{minTokens: 20, saveTimeout: 30}"))
    async with aiohttp.ClientSession() as session:
        await ask(session, router.url, "a", LONG)
        pid = (await running(session, router.url))["a"]["pid"]

        async def saving() -> bool:
            return (await running(session, router.url)).get("a", {}).get("phase") == "saving context"

        unload = asyncio.ensure_future(session.post(f"{router.url}/api/models/unload/a"))
        await eventually(saving, 10, "a to be saving its context")
        router.signal(signum)
        router.wait(60)
        unload.cancel()
    await eventually_gone(pid)
    assert read_manifest(store).caches == []


async def eventually_gone(pid: int) -> None:
    async def gone() -> bool:
        return not alive(pid)

    await eventually(gone, 30, f"pid {pid} to exit")


@pytest.mark.parametrize(("edit", "kept"), [
    (("{minTokens: 20, saveTimeout: 5}", "{minTokens: 21, saveTimeout: 5}"), True),  # kvCache's own keys only
    (("--timings ", "--timings --ttft-ms 1 "), False),  # the command: the new entry could not restore it
])
async def test_a_reload_saves_the_context_only_when_the_new_entry_can_restore_it(router_factory, tmp_path, edit, kept):
    router = router_factory(config(tmp_path))
    async with aiohttp.ClientSession() as session:
        first = await ask(session, router.url, "a", LONG)
        pid = (await running(session, router.url))["a"]["pid"]
        path = tmp_path / "config.yaml"
        path.write_text(path.read_text().replace(*edit))
        router.signal(signal.SIGHUP)
        await eventually_gone(pid)  # an idle model of a changed entry stops at once
        follow_up = await ask(session, router.url, "a", FOLLOW_UP)
        saves = await metric(session, router.url, "swaplab:kvcache_saves_total", model="a", outcome="ok")
    if kept:
        assert saves == 1 and follow_up["timings"]["cache_n"] >= first["timings"]["prompt_n"]
    else:
        assert saves == 0 and follow_up["timings"]["cache_n"] == 0
