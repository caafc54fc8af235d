"""llama-swap's HTTP API for its web page and the tools that read it, on swaplab's state.

Paths, methods and JSON shapes are llama-swap's (`tests/fixtures/llama-swap-api/`, from
its Go structs and UI types); where swaplab knows more, fields are added beside, never
renamed. The live feed is `events.EventHub`, in-flight requests `inflight.InFlight`, the
activity queries `results.activityapi`, the hardware snapshot `fleet.hardware`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from swaplab.fleet.hardware import detect_hardware
from swaplab.fleet.logs import LogLine
from swaplab.fleet.placement import estimate_detail
from swaplab.results.activityapi import (
    ActivityQueryError,
    activity_page,
    activity_stats,
)
from swaplab.router.watch import events
from swaplab.router.api.listing import render_capabilities
from swaplab.router.door.responses import llama_swap_error

if TYPE_CHECKING:
    from swaplab.config.model import Config
    from swaplab.fleet import Fleet, LogHub
    from swaplab.results.writer import ActivityWriter
    from swaplab.router.watch.captures import CaptureStore
    from swaplab.router.watch.inflight import InFlight
    from swaplab.router.path.peers import PeerWatch
    from swaplab.router.path.profiles import ProfileSwitch


class Router(Protocol):
    """What the API reads of the router (`app.Router`), which registers it."""

    config: Config
    fleet: Fleet
    peers: PeerWatch
    logs: LogHub
    events: events.EventHub
    profiles: ProfileSwitch
    inflight: InFlight
    activity: ActivityWriter
    captures: CaptureStore

    def bookkeep(self) -> None: ...

    async def handle_models(self, request: web.Request) -> web.Response: ...
    async def handle_health(self, request: web.Request) -> web.Response: ...
    async def handle_logs_stream(self, request: web.Request) -> web.StreamResponse: ...

log = logging.getLogger("swaplab.router")

ROUTER_SOURCE = "router"
"""The LogHub source of the router's own lines (llama-swap's `proxy` log); every other source is a model's."""


def log_text(line: LogLine) -> str:
    """A log line as llama-swap's text logs carry it: a model's output prefixed with `[model] `."""
    return f"{line.text}\n" if line.source == ROUTER_SOURCE else f"[{line.source}] {line.text}\n"


def log_kind(line: LogLine) -> str:
    """llama-swap's two logs: `proxy` (the router's own lines) and `upstream` (the models' output)."""
    return "proxy" if line.source == ROUTER_SOURCE else "upstream"


OLLAMA_API_VERSION = "0.33.0"
"""The Ollama release whose API (its docs/api.md) the Ollama routes follow (`router.ollama`): `version` in
`/api/version`, where Ollama's clients gate features on it (Codex's `--oss` wants 0.13.4 or newer)."""


@functools.cache
def version() -> dict[str, str]:
    """`GET /api/version`, the one path llama-swap's API and Ollama's share (docs/api.md has the table).

    `version` is Ollama's answer (`OLLAMA_API_VERSION`): Ollama's clients compare it against their minimum,
    and swaplab's own 0.x would read as a years-old Ollama. llama-swap's page only shows it. `commit` and
    `build_date` are swaplab's, as llama-swap's; swaplab's own version is `swaplab_version`."""
    try:
        number = metadata.version("swaplab")
    except metadata.PackageNotFoundError:
        number = "0"
    commit, date = "unknown", "unknown"
    try:
        done = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "log", "-1", "--format=%h %cI"],
            capture_output=True, text=True, timeout=5, check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            commit, date = done.stdout.split()
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return {
        "version": OLLAMA_API_VERSION, "commit": commit, "build_date": date, "swaplab_version": number,
        "server": "swaplab", "apis": "openai anthropic ollama llama-swap",
    }


class LlamaSwapApi:
    """The handlers; `add_routes` registers them on the router's app."""

    def __init__(self, router: Router):
        self.router = router
        self._hardware: dict[str, Any] | None = None

    def add_routes(self, app: web.Application) -> None:
        router = self.router
        app.router.add_get("/models", router.handle_models)
        app.router.add_get("/wol-health", router.handle_health)
        app.router.add_get("/", self.handle_root)
        app.router.add_get("/upstream", self.handle_root)
        app.router.add_get("/api/events", self.handle_events)
        app.router.add_post("/api/inflight/{id}/cancel", self.handle_cancel)
        app.router.add_get("/api/version", self.handle_version)
        app.router.add_get("/api/metrics/activity", self.handle_activity_page)
        app.router.add_get("/api/metrics/stats", self.handle_stats)
        app.router.add_get("/api/hardware", self.handle_hardware)
        app.router.add_post("/api/models/unload", self.handle_unload_all)
        app.router.add_post("/api/models/unload/{model:.+}", self.handle_unload_one)
        app.router.add_post("/api/models/sleep/{model:.+}", self.handle_sleep_one)
        app.router.add_get("/logs/stream/{source:.*}", self.handle_log_stream)

    # -- the live feed --------------------------------------------------------------

    def model_status(self) -> list[dict[str, Any]]:
        """`modelStatus`: every model sorted by id (unlisted ones too), then the peers' models;
        swaplab adds `pid`, `in_flight`, `queued`, `devices`, `sleep`, `phase`, `kv_cache` and `claim_estimate`
        (as `/running` has them; `kv_cache` and `claim_estimate` for stopped models too)."""
        router = self.router
        config = router.config
        running = {entry["model"]: entry for entry in router.fleet.status()}
        models = []
        for model_id in sorted(config.models):
            model = config.models[model_id]
            entry: dict[str, Any] = {
                "id": model.id, "name": model.name, "description": model.description,
                "state": str(router.fleet.state_of(model.id)), "unlisted": model.unlisted, "peerID": "",
            }
            if model.aliases:
                entry["aliases"] = list(model.aliases)
            rendered = render_capabilities(model.capabilities)
            if "capabilities" in rendered:
                entry["capabilities"] = rendered["capabilities"]
            if "context_length" in rendered:
                entry["context_length"] = rendered["context_length"]
            live = running.get(model.id, {})
            entry.update(
                pid=live.get("pid"), in_flight=live.get("in_flight", 0), queued=live.get("queued", 0),
                devices=list(model.devices),
            )
            if "sleep" in live:
                entry["sleep"] = live["sleep"]
            if "phase" in live:
                entry["phase"] = live["phase"]
            if "progress" in live:  # a field llama-swap's page does not read, so it shows what it always did
                entry["progress"] = live["progress"]
            estimate = estimate_detail(router.fleet.config, model.id)
            if estimate is not None:
                entry["claim_estimate"] = estimate
            context = live.get("kv_cache") or router.fleet.context_status(model.id)
            if context is not None:
                entry["kv_cache"] = context
            models.append(entry)
        for peer in config.peers.values():
            for name in peer.models:
                health = router.peers.health(peer.id, name)
                models.append({
                    "id": f"{peer.id}/{name}", "name": "", "description": "", "state": "", "unlisted": False,
                    "peerID": peer.id, "available": health.available,
                })
        return models

    def publish_model_status(self) -> None:
        """A backend changed state (or the config did): every listener hears it in this turn of the loop."""
        self.router.events.publish_soon("modelStatus", self.model_status)

    async def handle_events(self, request: web.Request) -> web.StreamResponse:
        """`GET /api/events`: on connect the logs' history, `modelStatus`, `uiConfig`, `profileChanged` and an
        `inflight` snapshot, in llama-swap's order; then every change as it happens."""
        router = self.router
        response = web.StreamResponse(headers=events.HEADERS)
        await response.prepare(request)
        hub = router.events
        queue = hub.subscribe()
        lines = router.logs.subscribe()
        try:
            history = router.logs.recent()
            for kind in ("proxy", "upstream"):
                text = "".join(log_text(line) for line in history if log_kind(line) == kind)
                await response.write(events.frame("logData", {"source": kind, "data": text}))
            await response.write(events.frame("modelStatus", self.model_status()))
            ui_config = {"activity": {"session_id": list(router.config.session_id_headers)}}
            await response.write(events.frame("uiConfig", ui_config))
            await response.write(events.frame("profileChanged", {"active": router.profiles.active}))
            await response.write(events.frame("inflight", router.inflight.snapshot()))
            router.inflight.watch()
            await _relay(response, queue, lines)
        finally:
            hub.unsubscribe(queue)
            router.logs.unsubscribe(lines)
        return response

    async def handle_cancel(self, request: web.Request) -> web.Response:
        """`POST /api/inflight/{id}/cancel`: the request ends as if its client had gone away."""
        if not self.router.inflight.cancel(request.match_info["id"]):
            return llama_swap_error(request.headers.get("Accept", ""), 404, "inflight request not found")
        return web.json_response({"msg": "ok"})

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(version))

    async def handle_activity_page(self, request: web.Request) -> web.Response:
        """`GET /api/metrics/activity`: a page of the activity table, filtered and sorted as llama-swap's."""
        router = self.router
        router.bookkeep()
        query = {key: request.query.getall(key) for key in request.query}
        try:
            page = await asyncio.to_thread(
                activity_page, router.activity.path, query, lambda capture_id: capture_id in router.captures
            )
        except ActivityQueryError as error:
            return llama_swap_error(request.headers.get("Accept", ""), 400, str(error))
        except (sqlite3.Error, ValueError):
            log.exception("reading the activity for /api/metrics/activity failed")
            return llama_swap_error(request.headers.get("Accept", ""), 500, "failed to get activity")
        return web.json_response(page)

    async def handle_stats(self, request: web.Request) -> web.Response:
        """`GET /api/metrics/stats[?model=]`: totals and the prefill and decode rate distributions
        (swaplab adds TTFT and duration)."""
        router = self.router
        router.bookkeep()
        model = request.query.get("model") or None
        return web.json_response(await asyncio.to_thread(activity_stats, router.activity.path, model))

    async def handle_hardware(self, request: web.Request) -> web.Response:
        """`GET /api/hardware`: the host as detected once (llama-swap's schema 1)."""
        if self._hardware is None:
            self._hardware = await asyncio.to_thread(detect_hardware, self.router.fleet.device_probe)
        return web.json_response(self._hardware)

    async def handle_unload_all(self, request: web.Request) -> web.Response:
        """`POST /api/models/unload`: every local model stopped; `{"msg": "ok"}` once they are."""
        await self.router.fleet.unload(None)
        return web.json_response({"msg": "ok"})

    async def handle_unload_one(self, request: web.Request) -> web.Response:
        """`POST /api/models/unload/{model}` (an id or alias): text `OK` once it is stopped."""
        name = request.match_info["model"]
        model_id = self.router.config.resolve_alias(name)
        if model_id is None:
            return llama_swap_error(request.headers.get("Accept", ""), 404, "model not found")
        await self.router.fleet.unload(model_id)
        return web.Response(text="OK")

    async def handle_sleep_one(self, request: web.Request) -> web.Response:
        """swaplab: `POST /api/models/sleep/{model}`: put an idle model with `sleep:` to sleep now;
        `{"msg": "ok"}`, or 409 saying why not (404 for no such model)."""
        accept = request.headers.get("Accept", "")
        model_id = self.router.config.resolve_alias(request.match_info["model"])
        if model_id is None:
            return llama_swap_error(accept, 404, "model not found")
        refused = self.router.fleet.put_to_sleep(model_id)
        if refused is not None:
            return llama_swap_error(accept, 409, refused)
        return web.json_response({"msg": "ok"})

    async def handle_root(self, request: web.Request) -> web.Response:
        """`/` (and llama-swap's `GET /upstream`): the web page."""
        raise web.HTTPFound("/ui/")

    async def handle_log_stream(self, request: web.Request) -> web.StreamResponse:
        """`GET /logs/stream[/{proxy|upstream|MODEL}]`: llama-swap's plain-text log stream, its history
        first (unless `?no-history`). With `Accept: text/event-stream`, swaplab's JSON events instead."""
        router = self.router
        source = request.match_info.get("source", "")
        if "text/event-stream" in request.headers.get("Accept", "") and not source:
            return await router.handle_logs_stream(request)
        model_id = router.config.resolve_alias(source) if source not in ("", "proxy", "upstream") else None
        if source not in ("", "proxy", "upstream") and model_id is None:
            return llama_swap_error(
                request.headers.get("Accept", ""), 400, "invalid logger. Use 'proxy', 'upstream' or a model's ID"
            )

        # A model's own stream is its raw output, as llama-swap's; the mixed ones say whose each line is.
        text = log_text if model_id is None else _raw_text

        def wanted(line: LogLine) -> bool:
            if model_id is not None:
                return line.source == model_id
            if source:
                return log_kind(line) == source
            return _in_combined_log(line, router.config.log_to_stdout)

        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8", "X-Accel-Buffering": "no"})
        await response.prepare(request)
        lines = router.logs.subscribe()
        try:
            if "no-history" not in request.query:
                history = "".join(text(line) for line in router.logs.recent() if wanted(line))
                if history:
                    await response.write(history.encode())
            while True:
                line = await lines.get()
                if wanted(line):
                    await response.write(text(line).encode())
        finally:
            router.logs.unsubscribe(lines)


def _raw_text(line: LogLine) -> str:
    return f"{line.text}\n"


def _in_combined_log(line: LogLine, log_to_stdout: str) -> bool:
    """llama-swap's combined log carries what `logToStdout` sends to stdout (`proxy` by default)."""
    kind = log_kind(line)
    return log_to_stdout == "both" or log_to_stdout == kind


async def _relay(response: web.StreamResponse, queue: asyncio.Queue[bytes], lines: asyncio.Queue[LogLine]) -> None:
    """Forward published messages and log lines until the client leaves; a comment after each silent 15 s."""
    while True:
        waiters = {asyncio.ensure_future(queue.get()), asyncio.ensure_future(lines.get())}
        try:
            done, _ = await asyncio.wait(waiters, timeout=events.KEEPALIVE_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if not done:
            await response.write(events.KEEPALIVE)
            continue
        for finished in done:
            item = finished.result()
            if isinstance(item, LogLine):
                item = events.frame("logData", {"source": log_kind(item), "data": log_text(item)})
            await response.write(item)
