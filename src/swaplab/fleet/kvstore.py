"""Where the fleet keeps llama.cpp's saved KV caches: one store per router, shared by every model
with `kvCache:`, within one disk budget.

The backend's lifecycle task asks it what a model may restore and tells it what was saved
or restored; the store keeps the manifests (`kvcache`), removes the least recently used caches
past the budget, and holds what `/running` shows. Its file I/O runs in a thread, under a
lock per process and a lock file per directory (two routers may share one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from swaplab.config.identity import context_hash
from swaplab.config.model import Config, KvCacheStore, ModelConfig
from swaplab.fleet import kvcache
from swaplab.fleet.kvcache import (
    SavedCache,
    cache_identity,
    cache_layout,
    runs_llama_server,
)
from swaplab.metrics import Metrics
from swaplab.ownfolder import FolderNotOwnedError, own_folder

log = logging.getLogger("swaplab.fleet")

GIB = 1024**3
ORPHAN_AGE_SECONDS = 600.0
"""An unlisted cache file younger than this may be another router's save under way: it stays."""

T = TypeVar("T")


def make_directory(directory: Path) -> None:
    """A save folder, made `0700` if missing (its files hold conversations); FolderNotOwnedError, with
    the fix, when it is not this user's own or others may read or write it (`ownfolder`)."""
    own_folder(directory, "the kvCache folder", private=True)


def saves_context(model: ModelConfig) -> bool:
    """Whether the model's slots are saved on eviction: `kvCache` on, and a llama-server command
    (the router adds `--slot-save-path`) or any command that names its own `--slot-save-path`."""
    return model.kv_cache is not None and (
        runs_llama_server(model.cmd) or cache_layout(model.cmd).slot_save_path is not None
    )


def restores(old: ModelConfig, new: ModelConfig | None) -> bool:
    """Whether what `old`'s server saves, `new`'s may restore: a reload's edit that left the context
    as it was (`kvCache` alone, say). Otherwise saving it before the old server stops is wasted."""
    return new is not None and context_hash(new) == context_hash(old)


def fleet_store(config: Config, metrics: Metrics) -> KvStore:
    """The store of a fleet running `config`: its evictions and its disk use counted in `metrics`."""
    store = KvStore(config.kv_cache_store)
    store.configure(config)
    store.on_evict = lambda cache: metrics.context_evicted(cache.model or "?")
    metrics.watch_context_disk(store.used_bytes)
    return store


class KvStore:
    """The saved caches of one config's models: listed, recorded, forgotten, kept within the budget."""

    def __init__(self, settings: KvCacheStore):
        self.settings = settings
        self._directories: set[Path] = {Path(settings.path)}
        self._lock = asyncio.Lock()
        self._listing: dict[Path, list[SavedCache]] = {}
        self._hashes: dict[int, tuple[ModelConfig, str]] = {}
        self.on_evict: Callable[[SavedCache], None] = lambda cache: None

    @property
    def budget_bytes(self) -> int:
        return int(self.settings.budget_gib * GIB)

    def configure(self, config: Config) -> None:
        """The config in force: its store settings and the directories its models save to."""
        self.settings = config.kv_cache_store
        self._hashes.clear()
        self._directories = {Path(self.settings.path)} | {
            self.directory(model) for model in config.models.values() if saves_context(model)
        }

    def directory(self, model: ModelConfig) -> Path:
        """Where the model's server saves: its own `--slot-save-path`, else the store's folder."""
        own = cache_layout(model.cmd).slot_save_path
        return Path(os.path.expanduser(own)) if own else Path(self.settings.path)

    def identity(self, model: ModelConfig) -> str | None:
        """The model's cache identity now (its model file is read with `stat`); None when the file
        its `-m` names cannot be read: then nothing is saved or restored."""
        layout = cache_layout(model.cmd)
        if not layout.model:
            return None
        try:
            stat = os.stat(os.path.expanduser(layout.model))
        except OSError:
            return None
        known = self._hashes.get(id(model))
        if known is None or known[0] is not model:  # the status reads it often: the entry is hashed once
            known = self._hashes[id(model)] = (model, context_hash(model))
        return cache_identity(known[1], stat.st_size, stat.st_mtime_ns, layout)

    # -- reading -------------------------------------------------------------------------

    async def open_for(self, config: Config) -> None:
        """`open`, once before serving, where a model of `config` saves its context; a store that cannot
        be read costs the saved contexts, not the start."""
        if any(saves_context(model) for model in config.models.values()):
            try:
                await self.open()  # a folder another user could change refuses the start (its fix said)
            except OSError as error:
                log.warning("kvCache: the saved contexts cannot be read (%s)", error)

    async def open(self) -> None:
        """Tidy every directory (cut-short saves, dropped entries) and list what is saved."""
        async with self._lock:
            for directory in sorted(self._directories):
                await self._in_thread(directory, self._list, directory)

    async def restorable(self, identity: str, directory: Path) -> list[SavedCache]:
        """The caches in `directory` a server of this identity may restore, by slot (files checked whole)."""
        async with self._lock:
            self._directories.add(directory)
            caches = await self._in_thread(directory, self._list, directory)
        return kvcache.restorable(caches, identity)

    async def changed_since_saved(self, directory: Path, cache: SavedCache) -> str | None:
        """Why the cache's file may not be restored (its bytes are not the ones saved); None when it may."""
        async with self._lock:
            try:
                return await self._in_thread(directory, kvcache.changed_since_saved, directory, cache)
            except (OSError, FolderNotOwnedError) as error:
                return f"its folder cannot be used ({error})"

    def saved(self, model_id: str) -> list[SavedCache]:
        """What is saved for this model, by slot, as last listed (no I/O: `/running` reads it)."""
        caches = [c for listed in self._listing.values() for c in listed if c.model == model_id]
        return sorted(caches, key=lambda cache: (cache.slot_id, -cache.saved_at))

    def used_bytes(self) -> int:
        return sum(cache.bytes for listed in self._listing.values() for cache in listed)

    # -- writing -------------------------------------------------------------------------

    async def record(self, directory: Path, cache: SavedCache) -> SavedCache:
        """A save the server finished: listed (replacing that slot's older save), then the budget kept."""
        async with self._lock:
            recorded = await self._change(directory, kvcache.record_saved, directory, cache)
            await self._keep_budget()
        return recorded

    async def mark_used(self, directory: Path, cache: SavedCache) -> None:
        async with self._lock:
            await self._change(directory, kvcache.mark_used, directory, cache.file_name, time.time())

    async def forget(self, directory: Path, caches: Iterable[SavedCache]) -> None:
        """Caches that failed to restore: out of the manifest, their files deleted."""
        caches = list(caches)
        async with self._lock:
            await self._change(directory, kvcache.forget_saved, directory, caches)

    async def discard(self, directory: Path, file_name: str) -> None:
        """A file the server wrote that is not kept (too few tokens, or a save that failed)."""
        await asyncio.to_thread((directory / file_name).unlink, missing_ok=True)

    # -- inside ----------------------------------------------------------------------------

    async def _keep_budget(self) -> None:
        """Removes the least recently used caches, across every directory, until the rest fit."""
        owners = {cache: directory for directory, listed in self._listing.items() for cache in listed}
        remove = kvcache.over_budget(list(owners), self.budget_bytes)
        by_directory: dict[Path, list[SavedCache]] = {}
        for cache in remove:
            by_directory.setdefault(owners[cache], []).append(cache)
        for directory, caches in by_directory.items():
            await self._change(directory, kvcache.forget_saved, directory, caches)
            for cache in caches:
                log.info("removed the saved context of %s slot %d (%d tokens, %.0f MB): the kvCache budget of"
                         " %g GiB needs the room", cache.model or cache.identity, cache.slot_id, cache.tokens,
                         cache.bytes / 1e6, self.settings.budget_gib)
                self.on_evict(cache)

    def _list(self, directory: Path) -> list[SavedCache]:
        """The directory's whole caches; an entry whose file is missing or cut short is dropped (and said
        once), a file no manifest lists is deleted once it is old enough (a save cut short by a kill)."""
        manifest, deleted = kvcache.sweep(directory, time.time(), ORPHAN_AGE_SECONDS)
        for note in manifest.notes:
            log.warning("kvCache: %s", note)
        if deleted:
            log.info("kvCache: deleted %d cache file(s) in %s that no manifest lists (saves cut short)",
                     len(deleted), directory)
        self._listing[directory] = manifest.caches
        return manifest.caches

    async def _change(self, directory: Path, function: Callable[..., T], *args) -> T:
        """`function(*args)` on the directory, then its listing read again: one thread hop, one lock."""

        def change_and_list() -> T:
            result = function(*args)
            self._list(directory)
            return result

        return await self._in_thread(directory, change_and_list)

    async def _in_thread(self, directory: Path, function: Callable[..., T], *args) -> T:
        def call() -> T:
            make_directory(directory)
            with kvcache.locked(directory):
                return function(*args)

        return await asyncio.to_thread(call)
