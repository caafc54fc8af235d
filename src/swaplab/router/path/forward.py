"""Which server a model request goes to: the fleet's backend, a peer, or a websocket to either.

A request names a model (JSON `model`, a form field, `?model=`, or `/upstream/<model>/`);
while a profile is active, or a selector is named, the name is first rewritten
(`_forward_routed`: llama-swap's profile, then selector). The name resolves to a local model
or a peer's (`targets.resolve`); a route the server lacks (Anthropic's, the Responses API)
is translated before it is sent (`translate`). Then `exchange` takes the request there and
its answer back, stage by stage (admission, the upstream request, heartbeats, the relay,
the observation). `/upstream/` also answers `upstream.ignorePaths` and relays websockets,
as do the GET model routes (`?model=`). Another API's route (Ollama's, `router.ollama`)
comes in translated, through `forward_reshaped`, and goes the same way; its `Reshape` gives
the reply back in its shape. Every request passes here: nothing is added to this path
without measuring it (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re

from aiohttp import web

from swaplab.config.model import Config
from swaplab.errors import SwaplabError
from swaplab.fleet import State
from swaplab.fleet.lease import Lease
from swaplab.router import translate
from swaplab.router.door.guard import is_upgrade
from swaplab.router.door.responses import error_response, llama_swap_error
from swaplab.router.path import filters
from swaplab.router.path.exchange import SELECTOR, TRACKING, Exchange, backend_credentials
from swaplab.router.path.peers import peer_credentials
from swaplab.router.path.profiles import ProfileSwitch, upstream_pin
from swaplab.router.path.refusal import failed, refusal
from swaplab.router.path.selectors import Choice, NoTarget, Selectors
from swaplab.router.path.targets import (
    OFF_LOOP_BYTES,
    LocalTarget,
    PeerTarget,
    UnreadableBody,
    model_from_body,
    reads_off_loop,
    renamed_form,
    resolve,
    split_upstream_path,
    unknown_model,
    upstream_path,
    upstream_tracking,
)
from swaplab.router.relay.reshape import RESHAPE, Reshape
from swaplab.router.relay.websocket import relay_websocket

log = logging.getLogger("swaplab.router")


class Forwarder:
    """Sends each model request to its server: the fleet's backends, or a peer."""

    def __init__(self, exchange: Exchange, profiles: ProfileSwitch | None = None):
        self._exchange = exchange
        """Takes each request to its server and back (`exchange`)."""
        self.fleet = exchange.fleet
        self.profiles = profiles or ProfileSwitch()
        """The active profile (the router's; `PUT /api/profiles/active` changes it)."""
        self._selectors = Selectors(self.fleet.config)
        self._upstream_session = exchange.pools.session
        self.routes = exchange.routes
        """Which servers lack Anthropic's or the Responses API (`router.translate`)."""

    @property
    def config(self) -> Config:
        """The config in force; the fleet owns it (a reload changes it there)."""
        return self.fleet.config

    async def handle_model_request(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        content_type = request.headers.get("Content-Type")
        try:
            # A large form: its parts are Python's work (the length first: every request passes here).
            if len(body) > OFF_LOOP_BYTES and reads_off_loop(content_type, body):
                name, document = await asyncio.to_thread(model_from_body, content_type, body)
            else:
                name, document = model_from_body(content_type, body)
        except UnreadableBody as error:
            return error_response(error.status, str(error))
        in_query = not name
        name = name or request.query.get("model")
        if not name:
            return error_response(400, "the request names no model (JSON `model`, form field `model` or ?model=)")
        # The query, where the target has one: the lane builds its URL only when asked, and most have none.
        path = upstream_path(request.path, request.rel_url.raw_query_string if "?" in request.raw_path else "")
        if self.profiles.active is not None or self.fleet.config.selectors:
            return await self._forward_routed(request, name, in_query, body, document, path)
        return await self._forward(request, name, path, body, document)

    async def forward_reshaped(
        self, request: web.Request, reshape: Reshape, name: str, path: str, document: dict, body: bytes | None = None
    ) -> web.StreamResponse:
        """A request another API's route translated (`router.ollama`): `document` goes to the model's
        `path` (an OpenAI route), and `reshape` gives the client the reply in its route's shape. `body` is
        `document` already encoded, where the route did that itself (a large one, in a thread)."""
        request[RESHAPE] = reshape
        if body is None:
            body = filters.encode(document)
        if self.profiles.active is not None or self.config.selectors:
            return await self._forward_routed(request, name, False, body, document, path)
        return await self._forward(request, name, path, body, document)

    async def _forward_routed(
        self, request: web.Request, name: str, in_query: bool, body: bytes, document: dict | None, path: str
    ) -> web.StreamResponse:
        """llama-swap's order: the active profile's pin replaces the name, then a selector picks its target.

        The request then goes on under the new name, which the upstream sees too (the
        JSON `model`, the form field, or `?model=`), and which `setParamsByID` is keyed by.
        """
        config = self.config
        requested = name
        pins = self.profiles.pins(config)
        if pins is not None and name in pins:
            name = pins[name]
            if not name:  # a disabled pin
                return llama_swap_error(request.headers.get("Accept", ""), 404, "no model id could be identified")
        choice: Choice | None = None
        selector = config.selectors.get(name)
        if selector is not None:
            if self._selectors.config is not config:
                self._selectors = Selectors(config)  # a reload: reservations start afresh
            try:
                websocket = request.method == "GET" and is_upgrade(request.headers)
                choice = self._selectors.choose(selector, self.fleet.state_of, websocket=websocket)
            except NoTarget as error:
                return llama_swap_error(request.headers.get("Accept", ""), 503, str(error))
            log.debug("selector: id=%s target=%s", name, choice.target)
            request[SELECTOR] = selector.id
            name = choice.target
        if name != requested:
            if in_query:
                path = upstream_path(request.path, request.rel_url.update_query(model=name).raw_query_string)
            elif document is not None:
                document = {**document, "model": name}
                body = filters.encode(document)
            else:
                body = await renamed_form(request.headers.get("Content-Type", ""), body, name)
        try:
            return await self._forward(request, name, path, body, document)
        finally:
            if choice is not None and choice.release is not None:
                choice.release()

    async def handle_upstream(self, request: web.Request) -> web.StreamResponse:
        """`/upstream/<model>/<path>`: any request to the model's own server, websockets included."""
        config = self.config
        tail = request.match_info["tail"]
        accept = request.headers.get("Accept", "")
        pins = self.profiles.pins(config)
        if pins:
            pinned = upstream_pin(pins, tail)
            if pinned is not None:
                pin, target = pinned
                if not target:
                    return llama_swap_error(accept, 404, "model not found")
                tail = target + tail[len(pin):]
        split = split_upstream_path(config, tail)
        if split is None:
            return unknown_model(config, tail.split("/")[0])
        name, path = split
        if path == "/" and not request.path.endswith("/"):
            # Relative URLs in the upstream's pages resolve against the model's folder.
            location = f"/upstream/{name}/" + (f"?{request.query_string}" if request.query_string else "")
            redirect = web.HTTPMovedPermanently if request.method in ("GET", "HEAD") else web.HTTPPermanentRedirect
            return redirect(location)
        request[TRACKING] = upstream_tracking(request.method, path)
        target = resolve(config, name)
        websocket = is_upgrade(request.headers)
        if isinstance(target, LocalTarget):
            model_id = target.model_id
            if _ignored_path(config.ignore_paths, path) and self.fleet.state_of(model_id) is not State.READY:
                return llama_swap_error(
                    accept, 409, f"model {model_id} is not loaded; path matches upstream.ignorePaths"
                )
            if websocket:
                return await self._websocket_to_model(request, model_id, name, _with_query(path, request))
        elif websocket and isinstance(target, PeerTarget):
            return await self._websocket_to_peer(request, target, name, _with_query(path, request))
        body = await request.read()
        return await self._forward(request, name, _with_query(path, request), body, None)

    async def _forward(
        self, request: web.Request, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        config = self.fleet.config  # the property's, read once: every request passes here
        target = resolve(config, name)
        if target is None and name.endswith(":latest") and document is not None:
            # Ollama's default tag: `codex --oss` sends the name as Ollama's /api/tags lists it (`smollm2:latest`).
            target = resolve(config, name.removesuffix(":latest"))
            if target is not None:
                name = name.removesuffix(":latest")
                document = {**document, "model": name}
                body = filters.encode(document)
        if target is None:
            return unknown_model(config, name)  # not recorded: its label would be whatever was typed
        if request.method == "GET" and is_upgrade(request.headers):  # on a MODEL_GET_ROUTES route
            if isinstance(target, PeerTarget):
                return await self._websocket_to_peer(request, target, name, path)
            return await self._websocket_to_model(request, target.model_id, name, path)
        api = translate.ROUTES.get(path.partition("?")[0]) if document is not None else None  # Claude Code's ?beta=true
        if api is not None and RESHAPE not in request and self._lacks(target, api):
            translation = translate.begin(request, path, document, name)  # type: ignore[arg-type]
            if isinstance(translation, web.Response):
                return translation
            path, document = translation.path, translation.document
            body = filters.encode(document)
        if isinstance(target, PeerTarget):
            return await self._exchange.to_peer(request, target, name, path, body, document)
        return await self._exchange.to_model(request, target.model_id, name, path, body, document)

    def _lacks(self, target: LocalTarget | PeerTarget, api: str) -> bool:
        """Whether the target's server lacks `api`'s route (declared, known from its engine, or learned)."""
        if isinstance(target, PeerTarget):
            peer = target.peer
            return self.routes.lacks(("peer", peer.id, peer.proxy), api, peer.translate)
        model = self.config.models[target.model_id]
        return self.routes.lacks(("model", model.id, model.cmd), api, model.translate, model.cmd)

    async def _websocket_to_model(
        self, request: web.Request, model_id: str, name: str, path: str
    ) -> web.StreamResponse:
        """A websocket to a local model: admitted like any request and held for the socket's life,
        unless the model has `compat.ignoreWebsockets` (then only while it is ready, and unadmitted)."""
        observation = self._exchange.observe(request, model_id, path, name, capture=False)  # no capture of frames
        model = self.config.models[model_id]
        lease: Lease | None = None
        if model.ignore_websockets:
            # Outside admission: it neither starts the model, nor counts, nor keeps it
            # from being swapped out (and is cut when it is).
            if self.fleet.state_of(model_id) is not State.READY:
                message = f"model {model_id} is not loaded; ignored websocket requests cannot start it"
                observation.fail(409, message)
                return llama_swap_error(request.headers.get("Accept", ""), 409, message)
        else:
            try:
                lease = self.fleet.admit_now(model_id) or await self.fleet.acquire(model_id)
            except SwaplabError as error:
                return await failed(observation, *refusal(error))
            except asyncio.CancelledError:
                observation.end(completed=False, disconnected=True)
                raise
            model = lease.model
        try:
            response, completed = await relay_websocket(
                request, self._upstream_session(model.proxy, model.timeouts), model.proxy.rstrip("/") + path,
                self._exchange.upstream_headers(request, backend_credentials(model, path)), observation,
                self.config.security.limits.max_websocket_message_bytes,
            )
            if lease is not None:
                lease.completed = completed
            return response
        finally:
            if lease is not None:
                self.fleet.release(lease, succeeded=lease.completed)

    async def _websocket_to_peer(
        self, request: web.Request, target: PeerTarget, name: str, path: str
    ) -> web.StreamResponse:
        peer = target.peer
        observation = self._exchange.observe(request, target.model, path, name, peer.id, capture=False)
        response, _ = await relay_websocket(
            request, self._upstream_session(peer.proxy, peer.timeouts), peer.proxy.rstrip("/") + path,
            self._exchange.upstream_headers(request, peer_credentials(peer)), observation,
            self.config.security.limits.max_websocket_message_bytes,
        )
        return response


def _with_query(path: str, request: web.Request) -> str:
    return f"{path}?{request.query_string}" if request.query_string else path


@functools.lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(pattern) for pattern in patterns)


def _ignored_path(patterns: tuple[str, ...], path: str) -> bool:
    """`upstream.ignorePaths`: whether a pattern matches anywhere in `path` (Go's `MatchString`: unanchored)."""
    return any(pattern.search(path) for pattern in _compiled(patterns))
