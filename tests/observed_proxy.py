"""`answer()` (the relay with an observation), in the smallest aiohttp app: for tests until the router itself records."""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web

from procs import free_port
from swaplab.results.activity import ActivityRecord
from swaplab.router.watch.observe import RequestObservation
from swaplab.router.relay.answer import answer
from swaplab.router.relay.proxy import UpstreamError, forward_headers, new_upstream_session, open_upstream


class RelayProxy:
    """Each request is proxied to `upstream` and observed; records land in `records` and go to `sink`."""

    def __init__(self, upstream: str, model: str = "sim", sink: Callable[[ActivityRecord], None] | None = None):
        self.upstream = upstream
        self.model = model
        self.sink = sink
        self.records: list[ActivityRecord] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> RelayProxy:
        self.session = new_upstream_session(None)
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.runner.cleanup()
        await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        observation = RequestObservation(
            self.model, request.path, requested_model=json.loads(body).get("model"),
            on_end=lambda observation: self._finished(observation.record()),
        )
        try:
            upstream = await open_upstream(
                self.session, request.method, self.upstream + request.path_qs, forward_headers(request.headers), body
            )
        except UpstreamError as error:
            observation.fail(error.status, str(error))
            return web.Response(status=error.status, text=str(error))
        response, _ = await answer(request, upstream, observation)
        return response

    def _finished(self, record: ActivityRecord) -> None:
        self.records.append(record)
        if self.sink is not None:
            self.sink(record)
