"""How a llama.cpp server's context is kept across a swap (`kvCache`): its slots saved to disk
before a stop ends the server, and restored after a start proves it ready, before any request
is admitted. One concept, the two halves of one round trip, and what they count for `/running`.

The backend's lifecycle task decides when (`Backend._live`); this says how, each half within the
model's `saveTimeout`: a failure costs the cache (a cold prefill), never the stop or the start.
A restore that takes the server down or hangs it stops the run, and the fleet starts it cold, as
after a failed wake.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from swaplab.config.model import ModelConfig
from swaplab.fleet.engineapi import (
    SlotCallFailed,
    first_of,
    poll_ready,
    slot_action,
    slot_holdings,
)
from swaplab.fleet.kvcache import SavedCache, cache_file_name, with_slot_save_path
from swaplab.fleet.kvstore import KvStore, make_directory
from swaplab.fleet.output import settle
from swaplab.fleet.run import Run
from swaplab.metrics import Metrics
from swaplab.ownfolder import FolderNotOwnedError

log = logging.getLogger("swaplab.fleet")

# A restore that went unanswered: how long the server has to answer its health check before it
# is taken for hung (an exit ends the wait at once).
GONE_PROBE_SECONDS = 5.0


class ContextKeeper:
    """One model's saves and restores, and how they went."""

    def __init__(
        self, model: ModelConfig, store: KvStore, metrics: Metrics | None, http: aiohttp.ClientSession,
        changed: Callable[[Run], None], fell_back: Callable[[str], None],
    ) -> None:
        self.model = model
        self._store = store
        self._metrics = metrics
        self._http = http
        self._changed = changed
        """Says the backend changed (its phase), as its state changes are said."""
        self._fell_back = fell_back
        """Says why the model fell back (a cold prefill, a cold start): the requests that waited hear it."""
        self.phase = ""
        """What the run is doing within its state: `restoring context` (starting), `saving context` (stopping)."""
        self.saves = 0
        self.restores = 0
        self.save_failures = 0
        self.restore_failures = 0
        self.last_failure = ""
        self.failed_at: float | None = None
        self.last_save_seconds: float | None = None
        self.last_restore_seconds: float | None = None
        self.restored_tokens = 0
        """Tokens the current run restored (all slots)."""

    async def command(self, run: Run, argv: list[str]) -> list[str]:
        """The server's argv with the store's `--slot-save-path` (llama-server saves and restores
        slots only in the folder it was started with); the run remembers that folder."""
        directory = self._store.directory(self.model)
        try:
            await asyncio.to_thread(make_directory, directory)
        except (OSError, FolderNotOwnedError) as error:
            log.warning("%s: the kvCache folder %s cannot be used (%s): its context will not be kept",
                        self.model.id, directory, error)
            return argv
        run.context_dir = directory
        return with_slot_save_path(argv, str(directory))

    def _phase(self, run: Run, phase: str) -> None:
        self.phase = phase
        self._changed(run)

    def _context_failed(self, what: str, why: str, started: float, restore: bool) -> None:
        """A save or restore failed: counted, said, shown; the model goes on without that cache."""
        seconds = time.monotonic() - started
        if restore:
            self.restore_failures += 1
        else:
            self.save_failures += 1
        self.last_failure = f"{what} failed ({why})"
        self.failed_at = time.time()
        if self._metrics is not None:
            self._metrics.context_restored(self.model.id, False, seconds, 0) if restore else \
                self._metrics.context_saved(self.model.id, False, seconds, 0)
        consequence = "the next request re-reads its prompt (a cold prefill)" if restore else \
            "it stops without that context"
        log.warning("%s: %s failed (%s): %s", self.model.id, what, why, consequence)

    async def _slots_call(self, run: Run, call) -> object:
        """One /slots call, abandoned when the process exits (SlotCallFailed says so)."""
        request = asyncio.ensure_future(call)
        await first_of(request, run.exited.wait())
        if not request.done():
            raise SlotCallFailed("the server exited")
        return request.result()

    async def save(self, run: Run) -> None:
        """Saves each slot holding at least `minTokens` within `saveTimeout`; whatever fails or is cut
        short is deleted (a file the manifest does not list is never restored), and the stop goes on."""
        store, settings = self._store, self.model.kv_cache
        directory = run.context_dir
        assert settings is not None and directory is not None
        found = await asyncio.to_thread(store.identity, self.model)
        if found is None:
            log.warning("%s: its model file cannot be read: its context is not saved", self.model.id)
            return
        self._phase(run, "saving context")
        deadline = time.monotonic() + settings.save_timeout
        began = time.monotonic()
        try:
            try:
                holdings = await self._slots_call(
                    run, slot_holdings(self._http, self.model, settings.save_timeout))
            except SlotCallFailed as error:
                self._context_failed("listing its slots", str(error), began, restore=False)
                return
            for slot_id, tokens, processing in holdings:  # type: ignore[union-attr]
                if processing or (tokens is not None and tokens < settings.min_tokens):
                    continue
                remaining = deadline - time.monotonic()
                what = f"saving slot {slot_id}"
                started = time.monotonic()
                if remaining <= 0:
                    self._context_failed(what, f"saveTimeout of {settings.save_timeout:g} s spent", started,
                                         restore=False)
                    break
                name = cache_file_name(found, slot_id, f"{time.time_ns():x}")
                try:
                    answer = await self._slots_call(
                        run, slot_action(self._http, self.model, slot_id, "save", name, remaining))
                except SlotCallFailed as error:
                    await store.discard(directory, name)
                    why = f"no answer within its saveTimeout of {settings.save_timeout:g} s" if error.timed_out \
                        else str(error)
                    self._context_failed(what, why, started, restore=False)
                    if not error.answered:
                        break  # a server that went silent or away saves nothing more
                    continue
                n_saved = answer.get("n_saved") if isinstance(answer, dict) else None
                if not isinstance(n_saved, int) or n_saved < settings.min_tokens:
                    await store.discard(directory, name)  # an answer that says less than /slots did
                    continue
                try:
                    recorded = await store.record(directory, SavedCache(
                        identity=found, slot_id=slot_id, tokens=n_saved, bytes=0, saved_at=time.time(),
                        file_name=name, model=self.model.id))
                except (OSError, FolderNotOwnedError) as error:
                    await store.discard(directory, name)
                    self._context_failed(what, f"the file cannot be listed: {error}", started, restore=False)
                    continue
                seconds = time.monotonic() - started
                self.saves += 1
                self.last_save_seconds = seconds
                if self._metrics is not None:
                    self._metrics.context_saved(self.model.id, True, seconds, recorded.bytes)
                log.info("%s: saved slot %d's context (%d tokens, %.1f MB) in %.2f s", self.model.id, slot_id, n_saved,
                         recorded.bytes / 1e6, seconds)
        finally:
            self._phase(run, "")

    async def restore(self, run: Run) -> None:
        """Restores each slot saved for this identity, within `saveTimeout`, before the run is ready.

        A restore the server refuses deletes that cache (it would fail again): the next request
        re-reads its prompt. A server that dies, goes silent or runs out of time restoring is
        stopped and started cold, as after a failed wake, and the caches it was given are deleted.
        """
        store, settings = self._store, self.model.kv_cache
        directory = run.context_dir
        assert settings is not None and directory is not None
        self.restored_tokens = 0
        found = await asyncio.to_thread(store.identity, self.model)
        if found is None:
            return
        try:
            caches = await store.restorable(found, directory)
        except (OSError, FolderNotOwnedError) as error:
            log.warning("%s: its saved contexts cannot be read (%s)", self.model.id, error)
            return
        if not caches:
            return
        self._phase(run, "restoring context")
        deadline = time.monotonic() + settings.save_timeout
        try:
            for cache in caches:
                what = f"restoring slot {cache.slot_id} ({cache.tokens} tokens)"
                started = time.monotonic()
                # Its size alone would take a same-size file put in its place (llama.cpp would restore it).
                changed = await store.changed_since_saved(directory, cache)
                if run.stop_wanted.is_set():
                    return
                if changed is not None:
                    await self._refused(directory, cache, what, changed, started)
                    continue
                restore = slot_action(self._http, self.model, cache.slot_id, "restore", cache.file_name,
                                      max(0.0, deadline - started))
                request = asyncio.ensure_future(restore)
                await first_of(request, run.exited.wait(), run.stop_wanted.wait())
                if run.stop_wanted.is_set():
                    return
                if not request.done():  # the process exited under it
                    await self._restart_cold(run, directory, caches, what, await self._exit_text(run), started)
                    return
                try:
                    answer = request.result()
                except SlotCallFailed as error:
                    if error.answered:  # the server lives and refused this file: only the file goes
                        await self._refused(directory, cache, what, str(error), started)
                        continue
                    why = (f"no answer within its saveTimeout of {settings.save_timeout:g} s" if error.timed_out
                           else await self._exit_text(run) if await self._gone(run) else str(error))
                    await self._restart_cold(run, directory, caches, what, why, started)
                    return
                restored = answer.get("n_restored") if isinstance(answer, dict) else None
                tokens = restored if isinstance(restored, int) else cache.tokens
                seconds = time.monotonic() - started
                run.restored_into(cache.slot_id, tokens)
                self.restores += 1
                self.restored_tokens += tokens
                self.last_restore_seconds = seconds
                if self._metrics is not None:
                    self._metrics.context_restored(self.model.id, True, seconds, cache.bytes)
                await store.mark_used(directory, cache)
                log.info("%s: restored slot %d's context (%d tokens) in %.2f s", self.model.id, cache.slot_id, tokens,
                         seconds)
        finally:
            self._phase(run, "")

    async def _refused(self, directory: Path, cache: SavedCache, what: str, why: str, started: float) -> None:
        """A cache that may not be restored (the server refused it, or it is not the file saved): it
        is forgotten (it would fail again), and the request re-reads its prompt."""
        await self._store.forget(directory, [cache])
        self._context_failed(what, why, started, restore=True)
        self._fell_back(f"{what} failed ({why}): a cold prefill")

    async def _gone(self, run: Run) -> bool:
        """After a restore went unanswered: has the server died (True), or does it still answer its
        health check (False)? Decided by whichever comes first, the exit or the answer."""
        if run.exited.is_set():
            return True
        probe = asyncio.ensure_future(poll_ready(self._http, self.model, self.model.check_endpoint)) \
            if self.model.check_endpoint not in ("none", "generate") else asyncio.ensure_future(asyncio.Event().wait())
        exited = asyncio.ensure_future(run.exited.wait())
        try:
            await asyncio.wait({probe, exited}, timeout=GONE_PROBE_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        finally:
            probe.cancel()
            exited.cancel()
        return not probe.done() or run.exited.is_set()

    async def _exit_text(self, run: Run) -> str:
        if not run.exited.is_set():
            return "the server stopped answering"
        await settle(run)
        return f"the server exited with code {run.exit_code}"

    async def _restart_cold(self, run: Run, directory: Path, caches: list[SavedCache], what: str, why: str,
                            started: float) -> None:
        """The fallback of a restore that took the server down or hung it: its caches deleted (they
        must not do it again), the run stopped; the fleet starts the model anew, cold."""
        await self._store.forget(directory, caches)
        self._context_failed(what, why, started, restore=True)
        run.fallback = f"{what} failed ({why}); started cold instead"
        self._fell_back(run.fallback)
        run.stop_reason = run.fallback
        run.stop_wanted.set()
