"""vLLM's sleep mode as vLLM 0.34 serves it (`VLLM_SERVER_DEV_MODE=1`): `/sleep?level=&mode=`,
`/wake_up?tags=`, `/is_sleeping`, `/collective_rpc` (reload_weights) and `/reset_prefix_cache`.

A sleep pauses the scheduler: `mode=abort` (the default) ends the requests in flight, `wait`
lets them finish first, `keep` freezes them; requests arriving while asleep wait for the wake.
Without `--enable-sleep-mode` it answers the same and frees nothing, and says so in its log
(vllm/v1/worker/gpu_worker.py:353). Level 2 discards the weights: a wake without
`reload_weights` serves garbage.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from swaplab.sim.request import BadRequest, json_body
from swaplab.sim.sleep import KV_CACHE, SCHEDULING, WEIGHTS, Sleeper, error, log

VLLM_TAGS = (WEIGHTS, KV_CACHE, SCHEDULING)
VLLM_MODES = ("abort", "wait", "keep")


def vllm_sleep_query(level: str | None, mode: str | None) -> tuple[int, str]:
    """vLLM's `?level=` (0, 1 or 2; 1 by default) and `?mode=` (abort by default)."""
    level = "1" if level is None else level
    if level not in ("0", "1", "2"):
        raise BadRequest(f"level must be 0, 1 or 2, not {level!r}")
    mode = mode or "abort"
    if mode not in VLLM_MODES:
        raise BadRequest(f"mode must be one of {', '.join(VLLM_MODES)}, not {mode!r}")
    return int(level), mode


def vllm_wake_tags(values: list[str]) -> frozenset[str]:
    """vLLM's repeated `?tags=`: none means everything asleep."""
    unknown = [value for value in values if value not in VLLM_TAGS]
    if unknown:
        raise BadRequest(f"unknown tags {unknown}: vLLM's are {', '.join(VLLM_TAGS)}")
    return frozenset(values or VLLM_TAGS)



class VllmSleeper(Sleeper):
    """vLLM's sleep calls."""

    def engine_routes(self) -> list[web.RouteDef]:
        return [
            web.post("/sleep", self._vllm_sleep),
            web.post("/wake_up", self._vllm_wake_up),
            web.get("/is_sleeping", self._vllm_is_sleeping),
            web.post("/collective_rpc", self._vllm_collective_rpc),
            web.post("/reset_prefix_cache", self._vllm_reset_prefix_cache),
        ]

    async def _vllm_sleep(self, request: web.Request) -> web.Response:
        try:
            level, mode = vllm_sleep_query(request.query.get("level"), request.query.get("mode"))
        except BadRequest as bad:
            return error(400, str(bad))

        async def perform() -> dict[str, Any]:
            async with self.turn:
                if self.asleep:
                    log("WARNING Executor is already sleeping.")
                    return {"status": "sleeping", "level": self.level}
                began = time.monotonic()
                self.running.clear()  # no new generation from here on
                if self.workload.busy():
                    self.counts.sleeps_while_busy += 1
                    if mode == "abort":
                        self.workload.abort_all()
                        await self.workload.until_idle()
                    elif mode == "wait":
                        log("Waiting for in-flight requests to complete before sleeping...")
                        await self.workload.until_idle()
                    else:  # keep: frozen where they are until the wake
                        self.flowing.clear()
                self.asleep = {SCHEDULING} | ({WEIGHTS, KV_CACHE} if level >= 1 else set())
                self.level = level
                await asyncio.sleep(self.settings.sleep_seconds)
                if level >= 1:
                    freed = self.gpu_gib if self.frees() else 0.0
                    self.gpu_gib -= freed
                    self.weights_garbage = self.weights_garbage or (level == 2 and self.frees())
                    self.report("Sleep mode freed", round(freed, 2), round(self.gpu_gib, 2))
                self.report("to fall asleep", time.monotonic() - began)
                self.counts.sleeps += 1
                return {"status": "sleeping", "level": level}

        return await self.call("sleep", perform)

    async def _vllm_wake_up(self, request: web.Request) -> web.Response:
        try:
            tags = vllm_wake_tags(request.query.getall("tags", []))
        except BadRequest as bad:
            return error(400, str(bad))
        named = request.query.getall("tags", [])
        self.report("wake up the engine", named or None)

        async def perform() -> dict[str, Any]:
            async with self.turn:
                if not self.asleep:
                    log("WARNING Executor is not sleeping.")
                    return {"status": "awake", "tags": None}
                waking = tags & self.asleep
                for tag in sorted(tags - self.asleep):
                    log(f"WARNING Tag {tag} is not in sleeping tags {sorted(self.asleep)}")
                began = time.monotonic()
                if WEIGHTS in waking:
                    await asyncio.sleep(self.settings.wake_seconds)  # only the weights take time to come back
                if waking & {WEIGHTS, KV_CACHE}:
                    self.gpu_gib = self.settings.memory_gib
                self.asleep -= waking
                self.report("to wake up tags", time.monotonic() - began, set(waking))
                if not self.asleep:
                    self.level = None
                    self.running.set()
                    self.flowing.set()
                self.counts.wakes += 1
                return {"status": "sleeping" if self.asleep else "awake", "tags": named or None}

        return await self.call("wake", perform)

    async def _vllm_is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(self.asleep)})

    async def _vllm_collective_rpc(self, request: web.Request) -> web.Response:
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return error(400, str(bad))
        method = body.get("method") if isinstance(body, dict) else None
        if method != "reload_weights":
            return error(400, f"the sim's collective_rpc knows only method 'reload_weights', not {method!r}")
        async with self.turn:
            if WEIGHTS in self.asleep:
                return error(400, "the weights are asleep: wake them (/wake_up?tags=weights) before reload_weights")
            self.weights_garbage = False
        return web.json_response({"results": [None]})  # one result per worker; the sim has one

    async def _vllm_reset_prefix_cache(self, request: web.Request) -> web.Response:
        return web.Response()

