"""The router's HTTP surface. Only HTTP lives here: decisions are the fleet's."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from swaplab.config.identity import entry_hash, same_entry
from swaplab.config.model import Config, Filters, Timeouts
from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet, LogHub, State
from swaplab.fleet.lease import BackendUnavailable, Lease, OverCapacity
from swaplab.metrics import Metrics
from swaplab.results.activity import recent_activity
from swaplab.results.writer import ActivityWriter
from swaplab.router import filters
from swaplab.router.auth import CREDENTIAL_HEADERS, api_key_middleware
from swaplab.router.keepalive import EVENT_STREAM_HEADERS, KeepAlive, KeepAliveClock, error_event, stream_dialect
from swaplab.router.loading import INTERVAL_SECONDS as LOADING_INTERVAL
from swaplab.router.loading import loading_event, progress_text, wants_loading_state
from swaplab.router.observe import RequestObservation
from swaplab.router.peers import PeerWatch, peer_credentials
from swaplab.router.proxy import UpstreamError, forward_headers, new_upstream_session, open_upstream, relay
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

# Ended requests are turned into records and metrics this long after the first of a batch.
BOOKKEEPING_SECONDS = 0.05

# A backend refused or reset a connection: this long for its process to be seen exiting
# before the router concludes it still runs (a server's exit and its socket's closing are
# moments apart; a wrapper's child may go first).
EXIT_GRACE_SECONDS = 2.0


def error_response(status: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> web.Response:
    """An OpenAI-style JSON error."""
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status)


class Router:
    """The HTTP side: the fleet (which owns the config in force), the peers' health, the upstream pools."""

    def __init__(
        self, config: Config, *, state_dir: Path, logs: LogHub | None = None, db: str | Path | None = None
    ):
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
        self._background: set[asyncio.Task[Any]] = set()
        self._ended: list[RequestObservation] = []
        self._keepalive_clock = KeepAliveClock()
        self._bookkeeping: asyncio.TimerHandle | None = None

    @property
    def config(self) -> Config:
        """The config in force; the fleet owns it (a reload changes it there)."""
        return self.fleet.config

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
        self._bookkeep()
        await asyncio.to_thread(self.activity.close)

    def _record(self, observation: RequestObservation) -> None:
        """Where every proxied request ends up: noted now, recorded in the next batch."""
        self._ended.append(observation)
        if self._bookkeeping is None:
            self._bookkeeping = asyncio.get_running_loop().call_later(BOOKKEEPING_SECONDS, self._bookkeep)

    def _bookkeep(self) -> None:
        """Turn the ended requests into records: the activity table (written by its thread) and /metrics.

        Reading a response's usage and updating the metrics cost more than relaying it
        did; done in a batch a moment later, that work never sits between a burst of
        requests and their first bytes. Whatever reads the figures calls this first.
        """
        if self._bookkeeping is not None:
            self._bookkeeping.cancel()
            self._bookkeeping = None
        ended, self._ended = self._ended, []
        for observation in ended:
            try:
                record = observation.record()
            except Exception:  # recording must never break the router
                log.exception("recording the activity of %s %s failed", observation.model, observation.path)
                continue
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
            await self.fleet.load(model_id)
        except SwaplabError as error:
            log.error("preload of %s failed: %s", model_id, error)

    async def reload(self, new: Config) -> dict[str, list[str]]:
        """Put `new` in force: unchanged models keep running, changed or removed ones stop gracefully."""
        old = self.config
        changed = sorted(m for m in old.models if m not in new.models or not same_entry(old.models[m], new.models[m]))
        added = sorted(m for m in new.models if m not in old.models)
        self.peers.start(new)
        await self.fleet.reconfigure(new, changed)
        log.info("config reloaded: %d changed or removed (%s), %d added (%s)",
                 len(changed), ", ".join(changed) or "-", len(added), ", ".join(added) or "-")
        return {"changed": changed, "added": added}

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
        return await self._forward_to_model(request, target.model_id, name, path, body, document)

    async def _forward_to_model(
        self, request: web.Request, model_id: str, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        observation = RequestObservation(model_id, path, requested_model=name, on_end=self._record)
        model = self.config.models[model_id]
        dialect = stream_dialect(path, document)
        keepalive = None
        if dialect is not None:
            keepalive = KeepAlive(request, dialect, model.heartbeat_interval, self._keepalive_clock)
            keepalive.arm()
        lease: Lease | None = None
        try:
            try:
                # Every request passes here: a ready model with nothing queued admits at
                # once, without a coroutine of its own.
                lease = self.fleet.admit_now(model_id)
                if lease is None:
                    loading = keepalive is not None and wants_loading_state(model, path, document)
                    lease = await self._acquire(model_id, keepalive, loading)
            except OverCapacity as error:
                return await _failed(observation, 429, str(error), "rate_limit_exceeded", error.retry_after, keepalive)
            except BackendUnavailable as error:
                return await _failed(observation, 503, str(error), "model_unavailable", error.retry_after, keepalive)
            except SwaplabError as error:
                return await _failed(observation, 503, str(error), "model_unavailable", None, keepalive)
            except asyncio.CancelledError:
                observation.end(completed=False, disconnected=True)  # left while queued
                raise
            for attempt in (1, 2):
                # The entry of the server that admitted it: a reload while it was queued
                # must not mix the old entry's filters with the new entry's server.
                model = lease.model
                sent = body if document is None else self._filtered(body, document, model.use_model_name or None, model.filters)
                try:
                    upstream = await open_upstream(
                        self._upstream_session(model.proxy, model.timeouts),
                        request.method,
                        model.proxy.rstrip("/") + path,
                        self._upstream_headers(request, None),
                        sent,
                        connect_timeout=model.timeouts.connect,
                        response_header_timeout=model.timeouts.response_header,
                    )
                except UpstreamError as error:
                    if not error.unreachable:
                        return await _failed(observation, error.status, str(error), "upstream_error", None, keepalive)
                    recovered = await self._recover(lease, error, first=attempt == 1)
                    if isinstance(recovered, _Failure):
                        return await _failed(
                            observation, recovered.status, recovered.message, "upstream_error", recovered.retry_after,
                            keepalive,
                        )
                    lease = recovered
                    continue
                response, lease.completed = await relay(
                    request, upstream, observation, keepalive, explain_break=lambda: self._explain_break(lease)
                )
                return response
            raise AssertionError("unreachable")
        finally:
            if lease is not None:
                self.fleet.release(lease, succeeded=lease.completed)
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()

    async def _acquire(self, model_id: str, keepalive: KeepAlive | None, loading: bool) -> Lease:
        """Admission through the fleet; with `sendLoadingState`, loading progress streams meanwhile."""
        if not loading or self.fleet.state_of(model_id) is State.READY:
            return await self.fleet.acquire(model_id)
        assert keepalive is not None
        began = time.monotonic()

        def progress() -> bytes:
            entry = next((e for e in self.fleet.status() if e["model"] == model_id), {})
            text = progress_text(model_id, entry.get("state", "starting"), time.monotonic() - began, entry.get("waiting"))
            return loading_event(model_id, text)

        keepalive.show_progress(progress, LOADING_INTERVAL)
        try:
            return await self.fleet.acquire(model_id)
        finally:
            keepalive.show_heartbeats()

    async def _recover(self, lease: Lease, error: UpstreamError, *, first: bool) -> Lease | _Failure:
        """Our own backend refused or reset the connection before answering: why, and what now.

        A server that crashed is restarted (within its crash-loop back-off) and the request
        goes once more to the new one; anything else is answered in the router's own words.
        """
        run, model_id = lease.run, lease.backend.id
        try:
            await asyncio.wait_for(asyncio.shield(run.exited.wait()), EXIT_GRACE_SECONDS)
        except asyncio.TimeoutError:
            return _Failure(502, f"model {model_id!r} (pid {run.pid}) is running but {error}")
        if not run.crashed:
            return _Failure(503, f"model {model_id!r} was stopped ({run.stop_reason}) while this request was on its way")
        if not first:
            return _Failure(
                502, f"model {model_id!r} crashed (exit {run.exit_code}) again, right after its restart, "
                "before answering this request",
            )
        log.warning("%s crashed (exit %s) under a request: restarting it and sending the request again",
                    model_id, run.exit_code)
        self.metrics.request_retried(model_id)
        try:
            return await self.fleet.reacquire(lease)
        except BackendUnavailable as failure:
            return _Failure(
                503, f"model {model_id!r} crashed (exit {run.exit_code}) and did not come back: {failure}",
                failure.retry_after,
            )
        except SwaplabError as failure:
            return _Failure(503, f"model {model_id!r} crashed (exit {run.exit_code}) and did not come back: {failure}")

    async def _explain_break(self, lease: Lease) -> str:
        """Why a backend broke off mid-response, as the client should read it."""
        run, model_id = lease.run, lease.backend.id
        try:
            await asyncio.wait_for(asyncio.shield(run.exited.wait()), EXIT_GRACE_SECONDS)
        except asyncio.TimeoutError:
            return f"model {model_id!r} closed the connection mid-stream (its process is still running)"
        if run.crashed:
            return f"model {model_id!r} exited mid-stream (code {run.exit_code})"
        return f"model {model_id!r} was stopped mid-stream ({run.stop_reason})"

    async def _forward_to_peer(
        self, request: web.Request, target: PeerTarget, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        peer = target.peer
        observation = RequestObservation(
            target.model, path, peer=peer.id, requested_model=name, on_end=self._record
        )
        health = self.peers.health(peer.id, target.model)
        if not health.available:
            return await _failed(
                observation, 503, f"peer model {peer.id}/{target.model} is unavailable: {health.reason}",
                "model_unavailable",
            )
        if document is not None:
            body = self._filtered(body, document, target.model, peer.filters)
        dialect = stream_dialect(path, document)
        keepalive = None
        if dialect is not None:
            keepalive = KeepAlive(request, dialect, self.config.heartbeat_interval, self._keepalive_clock)
            keepalive.arm()

        async def explain() -> str:
            return f"peer {peer.id!r} broke off mid-response"

        try:
            try:
                upstream = await open_upstream(
                    self._upstream_session(peer.proxy, peer.timeouts),
                    request.method,
                    peer.proxy.rstrip("/") + path,
                    self._upstream_headers(request, peer_credentials(peer)),
                    body,
                    connect_timeout=peer.timeouts.connect,
                    response_header_timeout=peer.timeouts.response_header,
                )
            except UpstreamError as error:
                return await _failed(
                    observation, error.status, f"peer {peer.id!r}: {error}", "upstream_error", None, keepalive
                )
            response, _ = await relay(request, upstream, observation, keepalive, explain_break=explain)
            return response
        finally:
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()

    @staticmethod
    def _filtered(body: bytes, document: dict, upstream_model: str | None, rules: Filters) -> bytes:
        """The model's upstream name and `filters` applied; the original bytes when nothing changes."""
        rewritten = filters.rewrite(document, upstream_model, rules)
        return body if rewritten is None else filters.encode(rewritten)

    def _upstream_headers(self, request: web.Request, credentials: dict[str, str] | None) -> CIMultiDict[str]:
        """The headers sent upstream: the client's, less hop-by-hop ones, plus a peer's `credentials`."""
        headers = forward_headers(request.headers, credentials)
        if self.config.api_keys and not credentials:
            for name in CREDENTIAL_HEADERS:  # the router's key is the router's, not the upstream's
                headers.pop(name, None)
        return headers

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
        self._bookkeep()
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_activity(self, request: web.Request) -> web.Response:
        self._bookkeep()
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


@dataclass(frozen=True)
class _Failure:
    """An error the router answers itself, with its HTTP status."""

    status: int
    message: str
    retry_after: float | None = None


async def _failed(
    observation: RequestObservation | None,
    status: int,
    message: str,
    kind: str,
    retry_after: float | None = None,
    keepalive: KeepAlive | None = None,
) -> web.StreamResponse:
    """An error the router answers itself, recorded like any other request.

    Inside an event stream already under way (heartbeats, loading progress), the error
    is its final event, in the route's own framing.
    """
    if observation is not None:
        observation.fail(status, message)
    committed = await keepalive.stop() if keepalive is not None else None
    if committed is not None and keepalive is not None:
        await committed.write(error_event(message, keepalive.dialect, status))
        await committed.write_eof()
        return committed
    response = error_response(status, message, kind)
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(retry_after)))
    return response


def _log_event(line) -> bytes:
    return b"data: " + json.dumps({"time": line.time, "source": line.source, "text": line.text}).encode() + b"\n\n"
