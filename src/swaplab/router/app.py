"""The router's HTTP surface. Only HTTP lives here: decisions are the fleet's."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from swaplab.config.model import Config, Filters, ModelConfig, Timeouts
from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet, LogHub, State
from swaplab.fleet.fleet import BackendUnavailable
from swaplab.router import filters
from swaplab.results import ActivityRecord, ActivityWriter, recent_activity
from swaplab.router.auth import CREDENTIAL_HEADERS, api_key_middleware
from swaplab.metrics import Metrics
from swaplab.router.observe import RequestObservation
from swaplab.router.peers import PeerWatch, peer_credentials
from swaplab.router.loading import INTERVAL_SECONDS as LOADING_INTERVAL
from swaplab.router.loading import loading_event, progress_text, wants_loading_state
from swaplab.router.proxy import (
    UpstreamError,
    forward_headers,
    new_upstream_session,
    open_upstream,
    relay,
    sse_error_event,
)
from swaplab.router.ui import add_ui_routes
from swaplab.router.targets import (
    PeerTarget,
    known_names,
    model_from_body,
    resolve,
    split_upstream_path,
)

log = logging.getLogger("swaplab.router")

# Long prompts: the spec asks for at least 64 MiB request bodies.
MAX_BODY_BYTES = 256 * 1024 * 1024

MODEL_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/audio/transcriptions",
    "/v1/audio/speech",
    "/v1/rerank",
    "/rerank",
    "/v1/reranking",
    "/infill",
    "/completion",
)

ROUTER_KEY = web.AppKey("router", "Router")

EVENT_STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# llama-swap's default when a model sets no concurrencyLimit.
DEFAULT_CONCURRENCY_LIMIT = 10


def error_response(status: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> web.Response:
    """An OpenAI-style JSON error."""
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status)


class Router:
    """Owns the config in force, the fleet, the peers' health and the upstream connection pools."""

    def __init__(
        self, config: Config, *, state_dir: Path, logs: LogHub | None = None, db: str | Path | None = None
    ):
        self.config = config
        self.logs = logs or LogHub()
        self.metrics = Metrics()
        self.activity = ActivityWriter(db, on_drop=self.metrics.records_dropped)
        self.fleet = Fleet(config, state_dir=state_dir, logs=self.logs, metrics=self.metrics)
        self.peers = PeerWatch(
            config,
            lambda peer: self._upstream_session(peer.proxy, peer.timeouts),
            on_change=self.metrics.peer_availability,
        )
        self.started = time.time()
        self._upstreams: dict[tuple[str, float | None], aiohttp.ClientSession] = {}
        self._held: Counter[str] = Counter()  # requests per model, queued or in flight
        self._background: set[asyncio.Task[Any]] = set()

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[api_key_middleware(lambda: self.config.api_keys)]
        )
        app[ROUTER_KEY] = self
        for path in MODEL_ROUTES:
            app.router.add_post(path, self.handle_model_request)
        app.router.add_route("*", "/upstream/{tail:.+}", self.handle_upstream)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/api/models", self.handle_api_models)
        app.router.add_get("/running", self.handle_running)
        app.router.add_post("/load", self.handle_load)
        app.router.add_post("/unload", self.handle_unload)
        app.router.add_get("/unload", self.handle_unload)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/logs", self.handle_logs)
        app.router.add_get("/logs/stream", self.handle_logs_stream)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/api/activity", self.handle_activity)
        add_ui_routes(app)
        from swaplab.catalog.live import add_catalog_routes  # the catalogue's templates load with the app, not the module

        add_catalog_routes(app, self)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        await asyncio.to_thread(self.activity.start)
        await self.fleet.open()
        self.peers.start(self.config)
        self._preload()

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop probing and every backend, then drop the upstream connection pools."""
        self.peers.stop()
        for task in self._background:
            task.cancel()
        await self.fleet.close()
        sessions, self._upstreams = list(self._upstreams.values()), {}
        for session in sessions:
            await session.close()
        await asyncio.to_thread(self.activity.close)

    def _record(self, record: ActivityRecord) -> None:
        """Where every proxied request ends up: the activity table (off the hot path) and /metrics."""
        self.activity.submit(record)
        self.metrics.observe_request(record)

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _preload(self) -> None:
        """`hooks.on_startup.preload`: start those models as if a request had come."""
        for name in self.config.preload:
            model_id = self.config.resolve_alias(name)
            if model_id is not None:
                self._spawn(self._load_quietly(model_id))

    async def _load_quietly(self, model_id: str) -> None:
        try:
            await self.load(model_id)
        except SwaplabError as error:
            log.error("preload of %s failed: %s", model_id, error)

    async def reload(self, new: Config) -> dict[str, list[str]]:
        """Put `new` in force: unchanged models keep running, changed or removed ones stop gracefully."""
        old = self.config
        changed = sorted(m for m in old.models if m not in new.models or not same_entry(old.models[m], new.models[m]))
        added = sorted(m for m in new.models if m not in old.models)
        self.config = new
        self.peers.start(new)
        await self.fleet.reconfigure(new, changed)
        log.info("config reloaded: %d changed or removed (%s), %d added (%s)",
                 len(changed), ", ".join(changed) or "-", len(added), ", ".join(added) or "-")
        return {"changed": changed, "added": added}

    async def load(self, model_id: str) -> None:
        """Start a model (by the same rules as a request would) and return once it is ready."""
        async with self.fleet.lease(model_id) as lease:
            lease.completed = True

    # -- proxied requests ------------------------------------------------------

    async def handle_model_request(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        name, document = model_from_body(request.headers.get("Content-Type", ""), body)
        name = name or request.query.get("model")
        if not name:
            return error_response(400, "the request names no model (JSON `model`, form field `model` or ?model=)")
        return await self._forward(request, name, request.path_qs, body, document)

    async def handle_upstream(self, request: web.Request) -> web.StreamResponse:
        split = split_upstream_path(self.config, request.match_info["tail"])
        if split is None:
            return self._unknown_model(request.match_info["tail"].split("/")[0])
        name, path = split
        if request.query_string:
            path = f"{path}?{request.query_string}"
        body = await request.read()
        return await self._forward(request, name, path, body, None)

    def _unknown_model(self, name: str) -> web.Response:
        available = known_names(self.config)
        return error_response(
            404,
            f"model {name!r} not found; available models: {', '.join(available) or '(none configured)'}",
            "model_not_found",
            available=available,
        )

    async def _forward(
        self, request: web.Request, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        target = resolve(self.config, name)
        if target is None:
            return self._unknown_model(name)  # not recorded: its label would be whatever was typed
        if isinstance(target, PeerTarget):
            return await self._forward_to_peer(request, target, name, path, body, document)
        model = self.config.models[target.model_id]
        observation = RequestObservation(model.id, path, requested_model=name, on_finish=self._record)
        if document is not None:
            body = self._filtered(body, document, model.use_model_name or None, model.filters)
        limit = model.concurrency_limit or DEFAULT_CONCURRENCY_LIMIT
        if self._held[model.id] >= limit:
            return await _failed(
                observation, 429, f"model {model.id!r} already has {limit} requests (concurrencyLimit)",
                "rate_limit_exceeded", retry_after=1,
            )
        self._held[model.id] += 1
        prepared = None
        try:
            if wants_loading_state(model, path, document) and self.fleet.state_of(model.id) is not State.READY:
                prepared = web.StreamResponse(headers=EVENT_STREAM_HEADERS)
                await prepared.prepare(request)
                await self._acquire_showing_progress(prepared, model.id)
            else:
                await self.fleet.acquire(model.id)
        except BackendUnavailable as error:
            self._release_hold(model.id)
            return await _failed(observation, 503, str(error), "model_unavailable", error.retry_after, prepared)
        except SwaplabError as error:
            self._release_hold(model.id)
            return await _failed(observation, 503, str(error), "model_unavailable", None, prepared)
        except asyncio.CancelledError:
            self._release_hold(model.id)
            observation.finish(completed=False, disconnected=True)  # left while queued
            raise
        completed = False
        try:
            model = self.fleet.backend(model.id).model
            response, completed = await self._send(
                request, model.proxy, path, body, model.timeouts, observation=observation, prepared=prepared
            )
            return response
        finally:
            self.fleet.release(model.id, succeeded=completed)
            self._release_hold(model.id)

    def _release_hold(self, model_id: str) -> None:
        self._held[model_id] -= 1
        if self._held[model_id] <= 0:
            del self._held[model_id]

    async def _acquire_showing_progress(self, stream: web.StreamResponse, model_id: str) -> None:
        """Acquire `model_id`, writing its loading progress to `stream` until it is ready."""
        acquiring = asyncio.ensure_future(self.fleet.acquire(model_id))
        began = time.monotonic()
        try:
            while not acquiring.done():
                entry = next((e for e in self.fleet.status() if e["model"] == model_id), {})
                text = progress_text(
                    model_id, entry.get("state", "starting"), time.monotonic() - began, entry.get("waiting")
                )
                await stream.write(loading_event(model_id, text))
                await asyncio.wait({acquiring}, timeout=LOADING_INTERVAL)
            acquiring.result()
        except BaseException:
            if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
                self.fleet.release(model_id, succeeded=False)  # admitted just as the client left
            else:
                acquiring.cancel()
            raise

    async def _forward_to_peer(
        self, request: web.Request, target: PeerTarget, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        peer = target.peer
        observation = RequestObservation(
            target.model, path, peer=peer.id, requested_model=name, on_finish=self._record
        )
        health = self.peers.health(peer.id, target.model)
        if not health.available:
            return await _failed(
                observation, 503, f"peer model {peer.id}/{target.model} is unavailable: {health.reason}",
                "model_unavailable",
            )
        if document is not None:
            body = self._filtered(body, document, target.model, peer.filters)
        response, _ = await self._send(
            request, peer.proxy, path, body, peer.timeouts, extra_headers=peer_credentials(peer),
            observation=observation,
        )
        return response

    @staticmethod
    def _filtered(body: bytes, document: dict, upstream_model: str | None, rules: Filters) -> bytes:
        """The model's upstream name and `filters` applied; the original bytes when nothing changes."""
        rewritten = filters.rewrite(document, upstream_model, rules)
        return body if rewritten is None else filters.encode(rewritten)

    async def _send(
        self,
        request: web.Request,
        base_url: str,
        path: str,
        body: bytes,
        timeouts: Timeouts,
        *,
        extra_headers: dict[str, str] | None = None,
        observation: RequestObservation | None = None,
        prepared: web.StreamResponse | None = None,
    ) -> tuple[web.StreamResponse, bool]:
        """Relay to `base_url + path`; also says whether the upstream answered in full."""
        headers = forward_headers(request.headers, extra_headers)
        if self.config.api_keys and not extra_headers:
            for name in CREDENTIAL_HEADERS:  # the router's key is the router's, not the upstream's
                headers.pop(name, None)
        try:
            upstream = await open_upstream(
                self._upstream_session(base_url, timeouts),
                request.method,
                base_url.rstrip("/") + path,
                headers,
                body,
                connect_timeout=timeouts.connect,
                response_header_timeout=timeouts.response_header,
            )
        except UpstreamError as error:
            return await _failed(observation, error.status, str(error), "upstream_error", None, prepared), False
        return await relay(request, upstream, observation, prepared)

    def _upstream_session(self, base_url: str, timeouts: Timeouts) -> aiohttp.ClientSession:
        """One connection pool per upstream address and idle limit (`idleConn`).

        Keyed by what defines the connections, so a reload that changes a model's proxy
        gets a new pool while requests in flight finish on the old one.
        """
        key = (base_url, timeouts.idle_conn)
        session = self._upstreams.get(key)
        if session is None:
            session = self._upstreams[key] = new_upstream_session(idle_seconds=timeouts.idle_conn)
        return session

    # -- router endpoints ------------------------------------------------------

    async def handle_models(self, request: web.Request) -> web.Response:
        """OpenAI's model list: local models with their status, peer models as `peer/model`."""
        created = int(self.started)
        data = []
        for model in self.config.models.values():
            if model.unlisted:
                continue
            entry = {
                "id": model.id,
                "object": "model",
                "created": created,
                "owned_by": "swaplab",
                "name": model.name or model.id,
                "description": model.description,
                "status": str(self.fleet.state_of(model.id)),
            }
            if model.metadata:
                entry["meta"] = model.metadata
            data.append(entry)
            if self.config.include_aliases_in_list:
                data.extend({**entry, "id": alias, "alias_of": model.id} for alias in model.aliases)
        for peer in self.config.peers.values():
            for name in peer.models:
                health = self.peers.health(peer.id, name)
                entry = {"id": f"{peer.id}/{name}", "object": "model", "created": created, "owned_by": peer.id,
                         "peer": peer.id, "status": "available" if health.available else "unavailable"}
                if not health.available:
                    entry["unavailable_reason"] = health.reason
                data.append(entry)
        return web.json_response({"object": "list", "data": data})

    async def handle_api_models(self, request: web.Request) -> web.Response:
        """Everything the web page shows about each model, unlisted ones included."""
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
        return web.json_response({"running": self.fleet.status(), "devices": self._devices(), "peers": peers})

    def _devices(self) -> list[dict[str, Any]]:
        devices_status = getattr(self.fleet, "devices_status", None)
        return devices_status() if devices_status is not None else []

    def _local_model(self, request: web.Request) -> str | web.Response | None:
        name = request.query.get("model")
        if not name:
            return None
        model_id = self.config.resolve_alias(name)
        return model_id if model_id is not None else self._unknown_model(name)

    async def handle_load(self, request: web.Request) -> web.Response:
        model_id = self._local_model(request)
        if model_id is None:
            return error_response(400, "say which model to load with ?model=ID")
        if isinstance(model_id, web.Response):
            return model_id
        try:
            await self.load(model_id)
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
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_activity(self, request: web.Request) -> web.Response:
        rows = await asyncio.to_thread(
            recent_activity, self.activity.path, request.query.get("model"), int(request.query.get("limit", "50"))
        )
        return web.json_response({"activity": rows})

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def handle_logs(self, request: web.Request) -> web.Response:
        source = request.query.get("source")
        lines = self.logs.recent(source, limit=int(request.query.get("limit", "1000")))
        text = "".join(f"[{line.source}] {line.text}\n" for line in lines)
        return web.Response(text=text)

    async def handle_logs_stream(self, request: web.Request) -> web.StreamResponse:
        """SSE: the recent lines, then each new one, as `data: {"time", "source", "text"}`."""
        source = request.query.get("source")
        response = web.StreamResponse(headers=EVENT_STREAM_HEADERS)
        await response.prepare(request)
        queue = self.logs.subscribe()
        try:
            for line in self.logs.recent(source, limit=int(request.query.get("limit", "200"))):
                await response.write(_log_event(line))
            while True:
                line = await queue.get()
                if source is None or line.source == source:
                    await response.write(_log_event(line))
        finally:
            self.logs.unsubscribe(queue)


async def _failed(
    observation: RequestObservation | None,
    status: int,
    message: str,
    kind: str,
    retry_after: float | None = None,
    prepared: web.StreamResponse | None = None,
) -> web.StreamResponse:
    """An error the router answers itself, recorded like any other request.

    Inside an event stream already under way, the error is its final event.
    """
    if observation is not None:
        observation.fail(status, message)
    if prepared is not None:
        await prepared.write(sse_error_event(message))
        await prepared.write_eof()
        return prepared
    response = error_response(status, message, kind)
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(retry_after)))
    return response


def _resolved(model: ModelConfig) -> ModelConfig:
    """A model's entry as it runs: its comments and its position in the file don't count."""
    return replace(model, raw_text="", line=0)


def same_entry(old: ModelConfig, new: ModelConfig) -> bool:
    """Does a reload leave this model's running server as it is?"""
    return _resolved(old) == _resolved(new)


def entry_hash(model: ModelConfig) -> str:
    """A short, stable fingerprint of the resolved entry, for results measured through the router."""
    document = json.dumps(asdict(_resolved(model)), sort_keys=True, default=str)
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def _log_event(line) -> bytes:
    return b"data: " + json.dumps({"time": line.time, "source": line.source, "text": line.text}).encode() + b"\n\n"
