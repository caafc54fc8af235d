"""The router: the fleet, the peers' health and the request path composed into one HTTP app.

The routes are listed in `Router.app`. Model requests go to `forward.Forwarder`; the
router's own endpoints (model lists, `/running`, `/load`, `/unload`, logs, metrics,
activity) are here, and read what the fleet and the peers own. Ended requests are
recorded here too, in batches off the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from swaplab.config.identity import entry_hash, same_entry
from swaplab.config.model import Config
from swaplab.config.redact import config_secrets, entry_text
from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet, LogHub
from swaplab.fleet.lease import OverCapacity
from swaplab.fleet.performance import PerformanceSampler
from swaplab.metrics import Metrics
from swaplab.results.activity import capture_of_row, recent_activity
from swaplab.results.activityapi import QueryParameterError, whole_number
from swaplab.results.loads import LoadRecord, recent_loads
from swaplab.results.store import connect
from swaplab.results.writer import ActivityWriter
from swaplab.router.api.llamaswap import LlamaSwapApi
from swaplab.router.watch.batch import Batch
from swaplab.router.watch.captures import CaptureStore
from swaplab.router.watch.events import EventHub
from swaplab.router.path.exchange import Exchange
from swaplab.router.path.forward import Forwarder
from swaplab.router.door.guard import BodySlots, HeldBodies, admission_middleware, guard_middleware, replace_cors_headers
from swaplab.router.watch.inflight import InFlight
from swaplab.router.relay.keepalive import EVENT_STREAM_HEADERS
from swaplab.router.api.listing import model_records, peer_record, render_capabilities, status_of
from swaplab.router.watch.observe import RequestObservation
from swaplab.router.ollama.handlers import OllamaApi
from swaplab.router.path.peers import PeerWatch
from swaplab.router.door.policy import is_loopback_listen
from swaplab.router.api.performance import BAD_AFTER, DISABLED, parse_after, report
from swaplab.router.path.profiles import ProfileSwitch
from swaplab.router.path.profiles import listing as profile_listing
from swaplab.router.relay.proxy import UpstreamPools
from swaplab.router.door.responses import error_response, llama_swap_error, unmatched_route_middleware
from swaplab.router.path.targets import unknown_model
from swaplab.router.door.routes import MODEL_GET_ROUTES, MODEL_ROUTES
from swaplab.router.api.ui import add_ui_routes

log = logging.getLogger("swaplab.router")

# The body limit is `security.limits.maxBodyMB`, applied by the guard as it reads (a reload
# changes it); aiohttp's own bound only has to stay out of its way.
AIOHTTP_MAX_BODY_BYTES = 2**62

ROUTER_KEY = web.AppKey("router", "Router")

# The most rows or log lines one `?limit=` may ask for.
MAX_LIMIT = 100_000

# Ended requests are turned into records and metrics this long after the first of a batch,
# once no request has arrived or ended for QUIET_SECONDS (a burst's bookkeeping must not
# land in the middle of the next burst), BOOKKEEPING_SLICE of them per turn of the loop,
# none waiting for quiet more than MAX_BOOKKEEPING_DELAY (router/watch/batch.py).
BOOKKEEPING_SECONDS = 0.05
QUIET_SECONDS = 0.01
MAX_BOOKKEEPING_DELAY = 0.5
BOOKKEEPING_SLICE = 32


class Router:
    """The HTTP side: the fleet (which owns the config in force), the peers' health, the upstream pools."""

    def __init__(
        self, config: Config, *, state_dir: Path, logs: LogHub | None = None, db: str | Path | None = None,
        listen_host: str = "127.0.0.1",
    ):
        self.listen_loopback = is_loopback_listen(listen_host)
        """Whether the router listens on loopback only: the Host check applies (`router.policy`)."""
        self.logs = logs or LogHub()
        self.metrics = Metrics()
        self.events = EventHub()
        self.activity = ActivityWriter(db, on_drop=self.metrics.records_dropped, on_written=self._written)
        self.fleet = Fleet(config, state_dir=state_dir, logs=self.logs, metrics=self.metrics)
        self.api = LlamaSwapApi(self)
        self.ollama = OllamaApi(self)
        self.fleet.listeners.append(self.api.publish_model_status)
        self.pools = UpstreamPools()
        self.peers = PeerWatch(
            config,
            lambda peer: self.pools.session(peer.proxy, peer.timeouts),
            on_change=self.metrics.peer_availability,
        )
        self.profiles = ProfileSwitch()
        self.performance = PerformanceSampler(config.performance_every, config.performance_disabled)
        self.metrics.watch_performance(self.performance.latest)
        self.captures = CaptureStore(config.capture_buffer_mb)
        self.held_bodies = HeldBodies()
        """Request bodies held at once, on both front doors (`security.limits.maxHeldBodiesMB`)."""
        self.metrics.watch_held_bodies(lambda: self.held_bodies.held)
        self.inflight = InFlight(
            self.events, self._secrets, lambda: self.config.security.trusted_proxies,
            lambda: self.config.security.limits.write_timeout,
        )
        exchange = Exchange(self.fleet, self.peers, self.pools, self.metrics, self._record, self.captures, self.inflight)
        self.forwarder = Forwarder(exchange, self.profiles)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = time.time()
        self._background: set[asyncio.Task[Any]] = set()
        self._ended: Batch[RequestObservation] = Batch(
            self._bookkeep, lambda: self.inflight.arrived, delay=BOOKKEEPING_SECONDS, quiet=QUIET_SECONDS,
            patience=MAX_BOOKKEEPING_DELAY, size=BOOKKEEPING_SLICE,
        )

    @property
    def config(self) -> Config:
        """The config in force; the fleet owns it (a reload changes it there)."""
        return self.fleet.config

    def app(self) -> web.Application:
        guard = guard_middleware(lambda: self.config.security, lambda: self.listen_loopback)
        admit = admission_middleware(lambda: self.fleet.config, BodySlots(), self.held_bodies)
        app = web.Application(
            client_max_size=AIOHTTP_MAX_BODY_BYTES, middlewares=[guard, admit, unmatched_route_middleware]
        )
        app.on_response_prepare.append(replace_cors_headers)
        app[ROUTER_KEY] = self
        for path in MODEL_ROUTES:
            app.router.add_post(path, self.forwarder.handle_model_request)
        for path in MODEL_GET_ROUTES:
            app.router.add_get(path, self.forwarder.handle_model_request, allow_head=False)
        app.router.add_route("*", "/upstream/{tail:.+}", self.forwarder.handle_upstream)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/v1/models/{id:.+}", self.handle_model)
        app.router.add_get("/api/models", self.handle_api_models)
        app.router.add_get("/api/profiles", self.handle_profiles)
        app.router.add_put("/api/profiles/active", self.handle_activate_profile)
        app.router.add_get("/running", self.handle_running)
        app.router.add_post("/load", self.handle_load)
        app.router.add_post("/unload", self.handle_unload)
        app.router.add_get("/unload", self.handle_unload)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/logs", self.handle_logs)
        app.router.add_get("/logs/stream", self.handle_logs_stream)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/api/activity", self.handle_activity)
        app.router.add_get("/api/captures/{id}", self.handle_capture)
        app.router.add_get("/api/performance", self.handle_performance)
        self.api.add_routes(app)
        self.ollama.add_routes(app)
        add_ui_routes(app)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.activity.start)
        # This machine's earlier starts and wakes: the ETA of the next ones (fleet/loadclock.py).
        history = await asyncio.to_thread(self._load_history)
        for record in history:
            self.fleet.load_clock.history.add(record)
        self.fleet.load_clock.on_record = self.activity.submit_load
        await self.fleet.open()
        self.peers.start(self.config)
        self.performance.start()
        self._preload()

    def _load_history(self) -> list[LoadRecord]:
        try:
            with contextlib.closing(connect(self.activity.path)) as connection:
                return recent_loads(connection)
        except sqlite3.Error as error:
            log.warning("no load history from %s: %s", self.activity.path, error)
            return []

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop probing and every backend, then drop the upstream connection pools."""
        self.peers.stop()
        await self.performance.close()
        for task in self._background:
            task.cancel()
        await self.fleet.close()
        await self.pools.close()
        self.bookkeep()
        await asyncio.to_thread(self.activity.close)

    def _secrets(self) -> tuple[str, ...]:
        """The values redacted wherever they appear in a header shown or captured: the config's keys."""
        return config_secrets(self.config)

    def _written(self, ids: range) -> None:
        """The activity writer stored rows `ids` (called from its thread): handed to the loop once per batch."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._announce_rows, ids)

    def _announce_rows(self, ids: range) -> None:
        """The live feed's `activity`, one message per row written (on the loop, where the hub lives)."""
        if self.events.listening:
            for row_id in ids:
                self.events.publish("activity", {"id": row_id})

    def _record(self, observation: RequestObservation) -> None:
        """Where every proxied request ends up: noted now, recorded in a batch a moment later."""
        self.inflight.remove(observation)
        self._ended.add(observation)

    def bookkeep(self) -> None:
        """Turn every ended request into its records now. Whatever reads the figures calls this first."""
        self._ended.drain()

    def _bookkeep(self, ended: list[RequestObservation]) -> None:
        """Turn ended requests into records: the activity table (written by its thread), /metrics, captures.

        Reading a response's usage and updating the metrics cost more than relaying it
        did; done in a batch a moment later, that work never sits between a burst of
        requests and their first bytes.
        """
        secrets: tuple[str, ...] | None = None
        for observation in ended:
            try:
                record = observation.record()
                if observation.pending is not None:
                    if secrets is None:
                        secrets = self._secrets()
                    capture = observation.capture(secrets)
                    if capture is not None:
                        self.captures.add(capture)
            except Exception:  # recording must never break the router
                log.exception("recording the activity of %s %s failed", observation.model, observation.path)
                if observation.pending is not None:
                    observation.pending.release()  # what it held for its capture counts no more
                continue
            self.activity.submit(record)
            self.metrics.observe_request(record)

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _preload(self) -> None:
        """`hooks.on_startup.preload`: start those models as if a request had come, one after
        another in the order listed (each once the one before is ready or failed), as llama-swap does."""
        model_ids = [self.config.resolve_alias(name) for name in self.config.preload]
        self._spawn(self._load_in_turn([model_id for model_id in model_ids if model_id is not None]))

    async def _load_in_turn(self, model_ids: list[str]) -> None:
        for model_id in model_ids:
            try:
                await self.fleet.load(model_id)
            except SwaplabError as error:
                log.error("preload of %s failed: %s", model_id, error)

    async def reload(self, new: Config) -> dict[str, list[str]]:
        """Put `new` in force: unchanged models keep running, changed or removed ones stop gracefully."""
        old = self.config
        changed = sorted(m for m in old.models if m not in new.models or not same_entry(old.models[m], new.models[m]))
        added = sorted(m for m in new.models if m not in old.models)
        self.peers.start(new)
        self.performance.configure(new.performance_every, new.performance_disabled)
        await self.fleet.reconfigure(new, changed)
        self.profiles.reset()  # as llama-swap: every config starts with no profile active
        self.captures.resize(new.capture_buffer_mb)
        self.api.publish_model_status()
        self.events.publish("profileChanged", {"active": None})
        log.info("config reloaded: %d changed or removed (%s), %d added (%s)",
                 len(changed), ", ".join(changed) or "-", len(added), ", ".join(added) or "-")
        return {"changed": changed, "added": added}

    # -- router endpoints ------------------------------------------------------

    async def handle_models(self, request: web.Request) -> web.Response:
        """OpenAI's model list (`listing`): local models, aliases, selectors, the active profile's pins, peers' models."""
        return web.json_response({"object": "list", "data": self.model_list()})

    async def handle_model(self, request: web.Request) -> web.Response:
        """OpenAI's `GET /v1/models/{id}`: the record the list has under that id, an alias's as the
        list has it with `includeAliasesInList` (its own `id`, `alias_of` its model), else a 404."""
        model_id = request.match_info["id"]
        for entry in self.model_list(aliases=True):
            if entry["id"] == model_id:
                return web.json_response(entry)
        return error_response(404, f"model {model_id!r} not found; GET /v1/models lists the models", "model_not_found")

    def model_list(self, aliases: bool | None = None) -> list[dict[str, Any]]:
        """`GET /v1/models`'s records (Ollama's `/api/tags` lists the same models); `aliases`: each
        alias its own record, or not (None: as `includeAliasesInList` says)."""
        config = self.config
        created = int(self.started)
        data = model_records(config, self.fleet.state_of, created, self.profiles.pins(config), aliases)
        for peer in config.peers.values():
            for name in peer.models:
                health = self.peers.health(peer.id, name)
                entry = peer_record(peer.id, name, created)
                entry["peer"] = peer.id
                entry["status"] = status_of("available" if health.available else "unavailable", loaded=False)
                if not health.available:
                    entry["unavailable_reason"] = health.reason
                data.append(entry)
        data.sort(key=lambda entry: entry["id"])  # llama-swap's order
        return data

    async def handle_profiles(self, request: web.Request) -> web.Response:
        """`GET /api/profiles`: `{"active": NAME | null, "profiles": [{"id", "description", "pins"}]}`."""
        return web.json_response(profile_listing(self.config, self.profiles.active))

    async def handle_activate_profile(self, request: web.Request) -> web.Response:
        """`PUT /api/profiles/active` with `{"name": NAME | null}`: `{"active": NAME | null}`, or llama-swap's error."""
        before = self.profiles.active
        status, answer = self.profiles.activate(self.config, await request.read())
        if isinstance(answer, str):
            return llama_swap_error(request.headers.get("Accept", ""), status, answer)
        if self.profiles.active != before:  # as llama-swap: only a change is told, then the names it moves
            self.events.publish("profileChanged", {"active": self.profiles.active})
            self.api.publish_model_status()
        return web.json_response(answer)

    async def handle_api_models(self, request: web.Request) -> web.Response:
        """Everything the web page shows about each model, unlisted ones included (its entry's secrets masked)."""
        secrets = self._secrets()
        models = [
            {
                "id": model.id,
                "name": model.name or model.id,
                "description": model.description,
                "aliases": list(model.aliases),
                "state": str(self.fleet.state_of(model.id)),
                "devices": list(model.devices),
                "peer": None,
                "available": True,
                "unlisted": model.unlisted,
                "config_hash": entry_hash(model),
                "entry": entry_text(model, secrets),
                "sleep": model.sleep is not None,
                "capabilities": render_capabilities(model.capabilities),
            }
            for model in self.config.models.values()
        ]
        for peer in self.config.peers.values():
            for name in peer.models:
                health = self.peers.health(peer.id, name)
                models.append({
                    "id": f"{peer.id}/{name}", "name": name, "description": "", "aliases": [], "state": "peer",
                    "devices": [], "peer": peer.id, "available": health.available, "reason": health.reason,
                    "unlisted": False,
                })
        return web.json_response({"models": models})

    async def handle_running(self, request: web.Request) -> web.Response:
        peers = [
            {"peer": peer.id, "model": name, "available": health.available, "reason": health.reason,
             "checked_at": health.checked_at or None}
            for peer in self.config.peers.values() if peer.probe > 0
            for name in peer.models
            for health in [self.peers.health(peer.id, name)]
        ]
        document: dict[str, Any] = {"running": self.fleet.status(), "devices": self._devices(), "peers": peers}
        contexts = self.fleet.contexts_status()
        if contexts["models"]:  # some model keeps its context (kvCache): what is saved, stopped models' too
            document["kv_cache"] = contexts
        return web.json_response(document)

    def _devices(self) -> list[dict[str, Any]]:
        devices_status = getattr(self.fleet, "devices_status", None)
        return devices_status() if devices_status is not None else []

    def _local_model(self, request: web.Request) -> str | web.Response | None:
        name = request.query.get("model")
        if not name:
            return None
        model_id = self.config.resolve_alias(name)
        return model_id if model_id is not None else unknown_model(self.config, name)

    async def handle_load(self, request: web.Request) -> web.Response:
        model_id = self._local_model(request)
        if model_id is None:
            return error_response(400, "say which model to load with ?model=ID")
        if isinstance(model_id, web.Response):
            return model_id
        try:
            await self.fleet.load(model_id)
        except OverCapacity as error:
            response = error_response(429, str(error), "rate_limit_exceeded")
            response.headers["Retry-After"] = str(round(error.retry_after))
            return response
        except SwaplabError as error:
            return error_response(503, str(error), "model_unavailable")
        return web.json_response({"loaded": model_id})

    async def handle_unload(self, request: web.Request) -> web.Response:
        model_id = self._local_model(request)
        if isinstance(model_id, web.Response):
            return model_id
        stopped = await self.fleet.unload(model_id)
        return web.json_response({"unloaded": stopped})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        self.bookkeep()
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_activity(self, request: web.Request) -> web.Response:
        self.bookkeep()
        limit = _limit(request, 50)
        if isinstance(limit, web.Response):
            return limit
        rows = await asyncio.to_thread(recent_activity, self.activity.path, request.query.get("model"), limit)
        for row in rows:  # llama-swap's overlay: whether the capture is still held
            row["has_capture"] = row["capture_id"] is not None and row["capture_id"] in self.captures
        return web.json_response({"activity": rows})

    async def handle_capture(self, request: web.Request) -> web.Response:
        """`GET /api/captures/{id}`: the request's capture in llama-swap's JSON; its 404 once dropped (or never kept)."""
        self.bookkeep()
        accept = request.headers.get("Accept", "")
        try:  # any of Go's ints, as llama-swap reads it; SQLite's integers are the same 64 bits
            capture_id = whole_number(request.match_info["id"], "capture ID", -(2**63), 2**63 - 1)
        except QueryParameterError:
            return llama_swap_error(accept, 400, "invalid capture ID")
        capture = self.captures.get(capture_id)
        by_row = None
        if capture is None:  # llama-swap's page asks by the activity row's id
            by_row = await asyncio.to_thread(capture_of_row, self.activity.path, capture_id)
            capture = self.captures.get(by_row) if by_row is not None else None
        if capture is None:
            return llama_swap_error(accept, 404, "capture not found")
        document = capture.to_json()
        if by_row is not None:
            document = {**document, "id": capture_id, "capture_id": by_row}
        return web.json_response(document)

    async def handle_performance(self, request: web.Request) -> web.Response:
        """`GET /api/performance[?after=RFC3339]`: the sampler's ring in llama-swap's JSON; 503 while disabled."""
        if not self.performance.enabled:
            return web.json_response(DISABLED, status=503)
        after = None
        if request.query.get("after"):
            after = parse_after(request.query["after"])
            if after is None:
                return llama_swap_error(request.headers.get("Accept", ""), 400, BAD_AFTER)
        return web.json_response(report(self.performance, after))

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def handle_logs(self, request: web.Request) -> web.Response:
        source = request.query.get("source")
        limit = _limit(request, 1000)
        if isinstance(limit, web.Response):
            return limit
        lines = self.logs.recent(source, limit=limit)
        text = "".join(f"[{line.source}] {line.text}\n" for line in lines)
        return web.Response(text=text)

    async def handle_logs_stream(self, request: web.Request) -> web.StreamResponse:
        """SSE: the recent lines, then each new one, as `data: {"time", "source", "text"}`."""
        source = request.query.get("source")
        limit = _limit(request, 200)
        if isinstance(limit, web.Response):
            return limit
        response = web.StreamResponse(headers=EVENT_STREAM_HEADERS)
        await response.prepare(request)
        queue = self.logs.subscribe()
        try:
            for line in self.logs.recent(source, limit=limit):
                await response.write(_log_event(line))
            while True:
                line = await queue.get()
                if source is None or line.source == source:
                    await response.write(_log_event(line))
        finally:
            self.logs.unsubscribe(queue)


def _limit(request: web.Request, default: int) -> int | web.Response:
    """`?limit=`, how many rows or lines to answer with: `default` when absent or empty, else a 400 saying
    what it must be."""
    try:
        return whole_number(request.query.get("limit") or str(default), "limit", 1, MAX_LIMIT)
    except QueryParameterError as error:
        return error_response(400, str(error))


def _log_event(line) -> bytes:
    return b"data: " + json.dumps({"time": line.time, "source": line.source, "text": line.text}).encode() + b"\n\n"
