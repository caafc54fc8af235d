"""TabbyAPI's stand-in for sleep: `/v1/model/unload` (ends the requests in flight) and
`/v1/model/load`, an event stream of the load's progress, both behind its admin key; with no
model loaded a generation gets 503 (500 when it names a model: endpoints/OAI/router.py:76).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from swaplab.sim.request import BadRequest, json_body
from swaplab.sim.sleep import Sleeper, error, log

NOT_LOADED = {"detail": "No models are currently loaded."}  # common/model.py:307


class TabbySleeper(Sleeper):
    """TabbyAPI's unload and load."""

    def engine_routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/model/unload", self._tabby_unload),
            web.post("/v1/model/load", self._tabby_load),
        ]

    async def admit(self, body: Any) -> web.Response | None:
        if not self.loaded:
            if isinstance(body, dict) and body.get("model"):
                return web.Response(status=500, text="Internal Server Error")
            return web.json_response(NOT_LOADED, status=503)
        return await super().admit(body)

    def is_asleep(self) -> bool:
        return not self.loaded

    async def _tabby_unload(self, request: web.Request) -> web.Response:
        async def perform() -> None | web.Response:
            async with self.turn:
                if not self.loaded:
                    return web.json_response(NOT_LOADED, status=503)
                if self.workload.busy():
                    self.counts.sleeps_while_busy += 1
                    log("WARNING:  Immediately terminating all jobs. Clients will have their requests cancelled.")
                    self.workload.abort_all()
                    await self.workload.until_idle()
                self.loaded = False
                await asyncio.sleep(self.settings.sleep_seconds)
                self.gpu_gib = 0.0
                self.report("Model unloaded")
                self.counts.sleeps += 1
                return None

        return await self.call("sleep", perform)

    async def _tabby_load(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return error(400, str(bad))
        name = body.get("model_name") if isinstance(body, dict) else None
        if not name:
            return web.json_response({"detail": "A model name was not provided for load."}, status=400)
        if name != self.settings.model:
            return web.json_response(
                {"detail": "Could not find the model path for load. Check model name or config.yml?"}, status=400)
        fault = await self.fault("wake")
        if fault is not None:
            return fault
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        modules = 1 if self.loaded else 4

        async def perform() -> None:
            async with self.turn:
                for module in range(1, modules + 1):
                    if not self.loaded:
                        await asyncio.sleep(self.settings.wake_seconds / modules)
                    status = "finished" if module == modules else "processing"
                    event = {"model_type": "model", "module": module, "modules": modules, "status": status}
                    await response.write(f"data: {json.dumps(event)}\n\n".encode())
                if not self.loaded:
                    self.loaded = True
                    self.gpu_gib = self.settings.memory_gib
                    self.report("successfully loaded")
                    self.counts.wakes += 1

        await self.shielded("wake", perform())
        await response.write_eof()
        return response

