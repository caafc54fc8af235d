"""The router's HTTP surface. Only HTTP lives here: decisions are the fleet's."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from swaplab.config.model import Config, Timeouts
from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet, LogHub
from swaplab.fleet.fleet import BackendUnavailable
from swaplab.router.proxy import UpstreamError, forward_headers, new_upstream_session, open_upstream, relay
from swaplab.router.targets import (
    LocalTarget,
    PeerTarget,
    Target,
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


def error_response(status: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> web.Response:
    """An OpenAI-style JSON error."""
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status)


class Router:
    """Owns the config in force, the fleet and the upstream HTTP client."""

    def __init__(self, config: Config, *, state_dir: Path, logs: LogHub | None = None):
        self.config = config
        self.logs = logs or LogHub()
        self.fleet = Fleet(config, state_dir=state_dir, logs=self.logs)
        self.started = time.time()
        self._upstreams: dict[str, aiohttp.ClientSession] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app[ROUTER_KEY] = self
        for path in MODEL_ROUTES:
            app.router.add_post(path, self.handle_model_request)
        app.router.add_route("*", "/upstream/{tail:.+}", self.handle_upstream)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/api/models", self.handle_models)
        app.router.add_get("/running", self.handle_running)
        app.router.add_post("/unload", self.handle_unload)
        app.router.add_get("/unload", self.handle_unload)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/logs", self.handle_logs)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        await self.fleet.open()

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every backend, then drop the upstream connection pools."""
        await self.fleet.close()
        sessions, self._upstreams = list(self._upstreams.values()), {}
        for session in sessions:
            await session.close()

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
        return await self._forward(request, name, path, body, None, rewrite_model=False)

    def _unknown_model(self, name: str) -> web.Response:
        available = known_names(self.config)
        return error_response(
            404,
            f"model {name!r} not found; available models: {', '.join(available) or '(none configured)'}",
            "model_not_found",
            available=available,
        )

    async def _forward(
        self,
        request: web.Request,
        name: str,
        path: str,
        body: bytes,
        document: dict | None,
        *,
        rewrite_model: bool = True,
    ) -> web.StreamResponse:
        target = resolve(self.config, name)
        if target is None:
            return self._unknown_model(name)
        if rewrite_model:
            body = self._rewrite_body(target, body, document)
        if isinstance(target, PeerTarget):
            return await self._forward_to_peer(request, target, path, body)
        try:
            async with self.fleet.lease(target.model_id) as lease:
                model = lease.backend.model
                response, lease.completed = await self._send(
                    request, f"model {model.id}", model.proxy, path, body, model.timeouts
                )
                return response
        except BackendUnavailable as error:
            response = error_response(503, str(error), "model_unavailable")
            response.headers["Retry-After"] = str(max(1, round(error.retry_after)))
            return response
        except SwaplabError as error:
            return error_response(503, str(error), "model_unavailable")

    async def _forward_to_peer(
        self, request: web.Request, target: PeerTarget, path: str, body: bytes
    ) -> web.StreamResponse:
        peer = target.peer
        credentials = {"Authorization": f"Bearer {peer.api_key}", "x-api-key": peer.api_key} if peer.api_key else None
        response, _ = await self._send(
            request, f"peer {peer.id}", peer.proxy, path, body, peer.timeouts, extra_headers=credentials
        )
        return response

    def _rewrite_body(self, target: Target, body: bytes, document: dict | None) -> bytes:
        """Name the model as the upstream knows it; untouched bytes when nothing changes."""
        if document is None:
            return body
        if isinstance(target, PeerTarget):
            upstream_name = target.model
        else:
            upstream_name = self.config.models[target.model_id].use_model_name or document.get("model")
        if upstream_name == document.get("model"):
            return body
        return json.dumps({**document, "model": upstream_name}).encode()

    async def _send(
        self,
        request: web.Request,
        pool: str,
        base_url: str,
        path: str,
        body: bytes,
        timeouts: Timeouts,
        *,
        extra_headers: dict[str, str] | None = None,
    ) -> tuple[web.StreamResponse, bool]:
        """Relay to `base_url + path`; also says whether the upstream answered in full."""
        try:
            upstream = await open_upstream(
                self._upstream_session(pool, timeouts),
                request.method,
                base_url.rstrip("/") + path,
                forward_headers(request.headers, extra_headers),
                body,
                connect_timeout=timeouts.connect,
                response_header_timeout=timeouts.response_header,
            )
        except UpstreamError as error:
            return error_response(error.status, str(error), "upstream_error"), False
        return await relay(request, upstream)

    def _upstream_session(self, pool: str, timeouts: Timeouts) -> aiohttp.ClientSession:
        """One connection pool per upstream, so each keeps idle connections as long as its `idleConn`."""
        session = self._upstreams.get(pool)
        if session is None:
            session = self._upstreams[pool] = new_upstream_session(idle_seconds=timeouts.idle_conn)
        return session

    # -- router endpoints ------------------------------------------------------

    async def handle_models(self, request: web.Request) -> web.Response:
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
            data.extend(
                {"id": f"{peer.id}/{name}", "object": "model", "created": created, "owned_by": peer.id, "peer": peer.id}
                for name in peer.models
            )
        return web.json_response({"object": "list", "data": data})

    async def handle_running(self, request: web.Request) -> web.Response:
        return web.json_response({"running": self.fleet.status()})

    async def handle_unload(self, request: web.Request) -> web.Response:
        name = request.query.get("model")
        model_id = None
        if name:
            model_id = self.config.resolve_alias(name)
            if model_id is None:
                return self._unknown_model(name)
        stopped = await self.fleet.unload(model_id)
        return web.json_response({"unloaded": stopped})

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def handle_logs(self, request: web.Request) -> web.Response:
        source = request.query.get("source")
        lines = self.logs.recent(source, limit=int(request.query.get("limit", "1000")))
        text = "".join(f"[{line.source}] {line.text}\n" for line in lines)
        return web.Response(text=text)

