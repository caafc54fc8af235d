"""SGLang 0.5.23's memory release: `/release_memory_occupation` and `/resume_memory_occupation`
with tags (`kv_cache`, `weights`, `cuda_graph`), and `/pause_generation` / `/continue_generation`.

A release while anything runs (not paused by abort or retract) kills the server
(weight_updater.py:339-341), and so does resuming a tag that was not released (:389-390);
without `--enable-memory-saver` nothing is freed, and without `--enable-weights-cpu-backup` the
weights come back as garbage that still generates. Nothing refuses a request meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from swaplab.sim.request import BadRequest, json_body
from swaplab.sim.sleep import KV_CACHE, WEIGHTS, Operation, Sleeper, die, error

CUDA_GRAPH = "cuda_graph"
SGLANG_TAGS = (KV_CACHE, WEIGHTS, CUDA_GRAPH)
SGLANG_PAUSE_MODES = ("abort", "retract", "in_place")


def sglang_tags(body: Any) -> frozenset[str]:
    """SGLang's `{"tags": [...]}`: null, [] or no key means all three."""
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object, {} or {"tags": [...]}')
    tags = body.get("tags")
    if tags is None or tags == []:
        return frozenset(SGLANG_TAGS)
    if not isinstance(tags, list) or any(tag not in SGLANG_TAGS for tag in tags):
        raise BadRequest(f"'tags' must be a list of {', '.join(SGLANG_TAGS)}")
    return frozenset(tags)



class SglangSleeper(Sleeper):
    """SGLang's release and resume calls, and its pause."""

    def engine_routes(self) -> list[web.RouteDef]:
        return [
            web.route("*", "/release_memory_occupation", self._sglang_release),
            web.route("*", "/resume_memory_occupation", self._sglang_resume),
            web.post("/pause_generation", self._sglang_pause),
            web.post("/continue_generation", self._sglang_continue),
        ]

    def garbage(self) -> bool:
        return self.weights_garbage or (WEIGHTS in self.asleep and self.frees())

    async def _sglang_pause(self, request: web.Request) -> web.Response:
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return error(400, str(bad))
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in SGLANG_PAUSE_MODES:
            return error(400, f"mode must be one of {', '.join(SGLANG_PAUSE_MODES)}, not {mode!r}")
        self.running.clear()
        self.pause_mode = mode
        if mode != "abort":
            self.flowing.clear()  # retract: back to the queue until continued; in_place: held where they are
        if mode == "abort" and self.workload.busy():
            self.workload.abort_all()
            await self.workload.until_idle()
        return web.json_response(None)

    async def _sglang_continue(self, request: web.Request) -> web.Response:
        self.pause_mode = None
        self.running.set()
        self.flowing.set()
        return web.json_response(None)

    async def _sglang_release(self, request: web.Request) -> web.Response:
        return await self._tagged(request, "sleep", self._release)

    async def _sglang_resume(self, request: web.Request) -> web.Response:
        return await self._tagged(request, "wake", self._resume)

    async def _tagged(
        self, request: web.Request, operation: Operation, perform: Callable[[frozenset[str]], Awaitable[None]]
    ) -> web.Response:
        """A release or resume: its tags read from the body (400 when they cannot be), then `perform`."""
        try:
            tags = sglang_tags(await json_body(request))
        except BadRequest as bad:
            return error(400, str(bad))
        return await self.call(operation, lambda: perform(tags))

    async def _release(self, tags: frozenset[str]) -> None:
        async with self.turn:
            # An idle scheduler, or one paused with its requests aborted or retracted
            # (weight_updater.py:339-341): anything else is an assertion that kills the server.
            if self.workload.busy() and self.pause_mode not in ("abort", "retract"):
                self.counts.sleeps_while_busy += 1
                die("Scheduler hit an exception: AssertionError: "
                    "release_memory_occupation should be called only when server is idle.")
            if KV_CACHE in tags:
                self.report("Cache flushed")
            self.asleep |= tags
            self.level = 1
            await asyncio.sleep(self.settings.sleep_seconds)
            if self.frees():  # the weights and the KV cache hold half each
                self.gpu_gib = self.settings.memory_gib * (1 - len({WEIGHTS, KV_CACHE} & self.asleep) / 2)
            self.counts.sleeps += 1

    async def _resume(self, tags: frozenset[str]) -> None:
        async with self.turn:
            for tag in sorted(tags):
                if tag not in self.asleep:  # offload_tags.remove(tag): a KeyError that kills the server
                    die(f"Scheduler hit an exception: KeyError: {tag!r}")
            await asyncio.sleep(self.settings.wake_seconds)
            back = self.facts.sleep.weights_back_requires if self.facts.sleep is not None else None
            backup = back is not None and all(flag in self.settings.switches for flag in back.flags)
            if WEIGHTS in tags and self.frees() and not backup:
                self.weights_garbage = True  # nothing kept them: the memory comes back, not the weights
            self.asleep -= tags
            if not self.asleep:
                self.gpu_gib = self.settings.memory_gib
                self.level = None
            self.counts.wakes += 1
