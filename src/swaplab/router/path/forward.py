"""The model request path: which server a request goes to, its admission, and the relay.

A request names a model (JSON `model`, a form field, `?model=`, or `/upstream/<model>/`);
while a profile is active, or a selector is named, the name is first rewritten
(`_forward_routed`: llama-swap's profile, then selector). A local model is admitted
through the fleet (at once when it is ready and nothing is queued), its body rewritten by
the entry's `filters`, and relayed to the backend; a backend that crashed under it is
restarted and the request sent once more. A peer's model is relayed to the peer.
`/upstream/` also answers `upstream.ignorePaths` and relays websockets, as do the GET
model routes (`?model=`). Each request is observed from start to end (with the selector
that routed it) and handed to `record`. Another API's route (Ollama's, `router.ollama`)
comes in translated, through `forward_reshaped`, and goes the same way; its `Reshape` gives
the reply back in its shape. Every request passes here: nothing is added to this path
without measuring it (docs/performance.md). It is one concept, the request path, in one
module (about 590 lines): admission, recovery, heartbeats and the relay interleave in it. A
route the server lacks (Anthropic's, the Responses API) is translated on its way (`translate`):
decided before it is sent, or after the server's 404 on it, which sends it again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from swaplab.config.model import Config, Filters, ModelConfig
from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet, State
from swaplab.fleet.lease import Lease
from swaplab.metrics import Metrics
from swaplab.router.path import filters
from swaplab.router.door.auth import CREDENTIAL_HEADERS
from swaplab.router.watch.captures import CaptureStore
from swaplab.router.watch.inflight import InFlight
from swaplab.router.relay.keepalive import (
    KeepAlive,
    KeepAliveClock,
    stream_dialect,
)
from swaplab.router.path.loading import INTERVAL_SECONDS as LOADING_INTERVAL
from swaplab.router.path.loading import loading_event, progress_text, wants_loading_state
from swaplab.router.watch.observe import RequestObservation
from swaplab.config.engines import call_headers
from swaplab.router.path.contextlimit import explain as too_long
from swaplab.router.path.refusal import failed, refusal
from swaplab.router.path.peers import PeerWatch, peer_credentials
from swaplab.router.path.profiles import ProfileSwitch, upstream_pin
from swaplab.router.relay.proxy import (
    UpstreamError,
    UpstreamPools,
    forward_headers,
    relay,
    error_text,
    relay_reshaped,
)
from swaplab.router.relay.recovery import Failure, explain_break, recover
from swaplab.router.relay.reshape import RESHAPE, Reshape
from swaplab.router.door.responses import error_response, llama_swap_error
from swaplab.router.path.selectors import Choice, NoTarget, Selectors
from swaplab.router import translate
from swaplab.router.translate.book import RouteBook
from swaplab.router.path.targets import (
    unknown_model,
    LocalTarget,
    PeerTarget,
    UnreadableBody,
    OFF_LOOP_BYTES,
    model_from_body,
    reads_off_loop,
    renamed_form,
    resolve,
    Tracking,
    split_upstream_path,
    upstream_path,
    upstream_tracking,
)
from swaplab.router.door.guard import is_upgrade
from swaplab.router.relay.websocket import relay_websocket

log = logging.getLogger("swaplab.router")

# The selector a request was routed by, kept with the request for its activity record
# (llama-swap's `metadata.selector`).
SELECTOR = web.RequestKey("selector", str)
# What is kept of a request (`targets.Tracking`); every model route's is kept whole, `/upstream/` has its rule.
TRACKING = web.RequestKey("tracking", Tracking)
KEEP_ALL = Tracking()



class Forwarder:
    """Sends each model request to its server: the fleet's backends, or a peer."""

    def __init__(
        self,
        fleet: Fleet,
        peers: PeerWatch,
        pools: UpstreamPools,
        metrics: Metrics,
        record: Callable[[RequestObservation], None],
        profiles: ProfileSwitch | None = None,
        captures: CaptureStore | None = None,
        inflight: InFlight | None = None,
    ):
        self.fleet = fleet
        self.profiles = profiles or ProfileSwitch()
        """The active profile (the router's; `PUT /api/profiles/active` changes it)."""
        self._selectors = Selectors(fleet.config)
        self.peers = peers
        self.metrics = metrics
        self._record = record
        """Where every observed request ends up (`RequestObservation.on_end`)."""
        self._inflight = inflight
        self._captures = captures  # the router's: where requests are captured (None or no budget: none is)
        self._pools = pools
        self._upstream_session = pools.session
        self._keepalive_clock = KeepAliveClock()
        self.routes = RouteBook()
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
        path = upstream_path(request.path, request.rel_url.raw_query_string)
        if self.profiles.active is not None or self.config.selectors:
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
            return await self._forward_to_peer(request, target, name, path, body, document)
        return await self._forward_to_model(request, target.model_id, name, path, body, document)

    def _lacks(self, target: LocalTarget | PeerTarget, api: str) -> bool:
        """Whether the target's server lacks `api`'s route (declared, known from its engine, or learned)."""
        if isinstance(target, PeerTarget):
            peer = target.peer
            return self.routes.lacks(("peer", peer.id, peer.proxy), api, peer.translate)
        model = self.config.models[target.model_id]
        return self.routes.lacks(("model", model.id, model.cmd), api, model.translate, model.cmd)

    def _observe(self, request: web.Request, model: str, path: str, name: str, peer: str | None = None,
                 capture: bool = True) -> RequestObservation:
        selector = request.get(SELECTOR)
        tracking = request.get(TRACKING, KEEP_ALL)
        observation = RequestObservation.of(
            request, model, path, name, peer, self._record if tracking.activity else self._forget,
            self.fleet.config.session_id_headers, self._captures if capture and tracking.activity else None,
            {"selector": selector} if selector is not None else None,
        )
        if self._inflight is not None:
            # Removed where it is recorded (or forgotten), when it ends. Unlisted ones too are watched
            # for `security.limits.writeTimeout`: any request to a model holds it.
            self._inflight.add(observation, request, listed=tracking.in_flight)
        return observation

    def _forget(self, observation: RequestObservation) -> None:
        """The end of a request that leaves no activity row: only its in-flight entry goes."""
        if self._inflight is not None:
            self._inflight.remove(observation)

    async def _forward_to_model(
        self, request: web.Request, model_id: str, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        reshape = request.get(RESHAPE)
        observation = self._observe(request, model_id, path if reshape is None else reshape.path, name)
        model = self.fleet.config.models[model_id]
        keepalive = self._keepalive(request, path, document, model.heartbeat_interval, reshape)
        lease: Lease | None = None
        try:
            try:
                # Every request passes here: a ready model with nothing queued admits at
                # once, without a coroutine of its own.
                lease = self.fleet.admit_now(model_id)
                if lease is None:
                    loading = keepalive is not None and wants_loading_state(model, path, document)
                    began = time.perf_counter()
                    lease = await self._acquire(model_id, keepalive, loading, reshape)
                    if reshape is not None:
                        reshape.load_seconds = time.perf_counter() - began
            except SwaplabError as error:
                return await failed(observation, *refusal(error), keepalive)
            except asyncio.CancelledError:
                observation.end(completed=False, disconnected=True)  # left while queued
                raise
            observation.admitted(lease.waited_for, lease.fallback, lease.run.claim_restored if lease.run.restored else None)
            attempt = 0
            while True:
                attempt += 1
                # The entry of the server that admitted it: a reload while it was queued
                # must not mix the old entry's filters with the new entry's server.
                model = lease.model
                sent_path = path
                if document is not None:
                    try:
                        sent = self._filtered(body, document, model.use_model_name or None, model.filters, name)
                    except UnreadableBody as error:
                        return await failed(
                            observation, error.status, str(error), "invalid_request_error", None, keepalive
                        )
                elif model.use_model_name:  # a form or ?model=: renamed there, as llama-swap does
                    sent = await renamed_form(request.headers.get("Content-Type", ""), body, model.use_model_name)
                    if request.method == "GET" and request.query.get("model") == name:
                        sent_path = str(URL(path).update_query(model=model.use_model_name))
                else:
                    sent = body
                observation.sending(sent)
                try:
                    upstream = await self._pools.open(
                        request.method, model.proxy.rstrip("/") + sent_path, model.timeouts,
                        self._upstream_headers(request, backend_credentials(model, sent_path)), sent,
                    )
                except UpstreamError as error:
                    if not error.unreachable:
                        return await failed(observation, error.status, str(error), "upstream_error", None, keepalive)
                    recovered = await recover(self.fleet, self.metrics, lease, error, first=attempt == 1)
                    if isinstance(recovered, Failure):
                        return await failed(
                            observation, recovered.status, recovered.message, "upstream_error", recovered.retry_after,
                            keepalive,
                        )
                    lease = recovered
                    continue
                if upstream.status == 404 and reshape is None:
                    learned = await self.routes.after_404(request, upstream, ("model", model.id, model.cmd),
                                                          model.translate, sent_path, document, name, f"model {model.id!r}")
                    if isinstance(learned, web.Response):  # a request the translation refuses
                        observation.fail(learned.status, error_text(learned.body))  # type: ignore[arg-type]  # json_response's: bytes
                        observation.answered(learned, learned.body)  # type: ignore[arg-type]  # json_response's: bytes
                        return learned
                    if isinstance(learned, translate.Translation):  # sent again, translated: not a new attempt
                        reshape, path, document = learned.reshape, learned.path, learned.document
                        body = filters.encode(document)
                        attempt -= 1
                        continue
                    upstream = learned
                if reshape is None:
                    response, lease.completed = await relay(
                        request, upstream, observation, keepalive, explain_break=lambda: explain_break(lease),
                        explain_error=lambda status, body: too_long(self.config.path, lease.model, status, body),
                    )
                else:
                    response, lease.completed = await relay_reshaped(
                        request, upstream, reshape, observation, keepalive, explain_break=lambda: explain_break(lease),
                        explain_error=lambda status, body: too_long(self.config.path, lease.model, status, body),
                    )
                return response
        finally:
            if lease is not None:
                keep_alive = reshape.keep_alive if reshape is not None else None
                self.fleet.release(lease, succeeded=lease.completed, keep_alive=keep_alive)
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()

    def _keepalive(
        self, request: web.Request, path: str, document: dict | None, interval: float, reshape: Reshape | None
    ) -> KeepAlive | None:
        """The heartbeat of a streaming request, armed; None for any other."""
        if reshape is not None:
            if not reshape.streaming:
                return None
            keepalive = KeepAlive(
                request, reshape.dialect, interval, self._keepalive_clock, reshape.heartbeat,
                {"Content-Type": reshape.content_type, "X-Accel-Buffering": "no"},
            )
        else:
            dialect = stream_dialect(path, document)
            if dialect is None:
                return None
            keepalive = KeepAlive(request, dialect, interval, self._keepalive_clock)
        keepalive.arm()
        return keepalive

    async def _acquire(
        self, model_id: str, keepalive: KeepAlive | None, loading: bool, reshape: Reshape | None = None
    ) -> Lease:
        """Admission through the fleet; with `sendLoadingState`, loading progress streams meanwhile."""
        if not loading or self.fleet.state_of(model_id) is State.READY:
            return await self.fleet.acquire(model_id)
        assert keepalive is not None
        began = time.monotonic()

        def progress() -> bytes:
            entry = next((e for e in self.fleet.status() if e["model"] == model_id), {})
            text = progress_text(model_id, entry.get("state", "starting"), time.monotonic() - began, entry.get("waiting"),
                                 entry.get("phase", ""), entry.get("progress"))
            return loading_event(model_id, text) if reshape is None else reshape.loading(text)

        keepalive.show_progress(progress, LOADING_INTERVAL)
        try:
            return await self.fleet.acquire(model_id)
        finally:
            keepalive.show_heartbeats()

    async def _forward_to_peer(
        self, request: web.Request, target: PeerTarget, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        peer = target.peer
        reshape = request.get(RESHAPE)
        observation = self._observe(request, target.model, path if reshape is None else reshape.path, name, peer.id)
        health = self.peers.health(peer.id, target.model)
        if not health.available:
            return await failed(
                observation, 503, f"peer model {peer.id}/{target.model} is unavailable: {health.reason}",
                "model_unavailable",
            )
        if document is not None:
            try:
                body = self._filtered(body, document, target.model, peer.filters, name)
            except UnreadableBody as error:
                return await failed(observation, error.status, str(error), "invalid_request_error")
        observation.sending(body)
        keepalive = self._keepalive(request, path, document, self.config.heartbeat_interval, reshape)

        async def explain() -> str:
            return f"peer {peer.id!r} broke off mid-response"

        try:
            while True:  # twice at most: a 404 on a route the peer lacks is sent again, translated
                try:
                    upstream = await self._pools.open(
                        request.method, peer.proxy.rstrip("/") + path, peer.timeouts,
                        self._upstream_headers(request, peer_credentials(peer)), body,
                    )
                except UpstreamError as error:
                    return await failed(
                        observation, error.status, f"peer {peer.id!r}: {error}", "upstream_error", None, keepalive
                    )
                if upstream.status != 404 or reshape is not None:
                    break
                learned = await self.routes.after_404(request, upstream, ("peer", peer.id, peer.proxy), peer.translate,
                                                      path, document, name, f"peer {peer.id!r}")
                if isinstance(learned, web.Response):
                    observation.fail(learned.status, error_text(learned.body))  # type: ignore[arg-type]  # json_response's: bytes
                    observation.answered(learned, learned.body)  # type: ignore[arg-type]
                    return learned
                if not isinstance(learned, translate.Translation):
                    upstream = learned
                    break
                reshape, path, document = learned.reshape, learned.path, learned.document
                body = self._filtered(filters.encode(document), document, target.model, peer.filters, name)
                observation.sending(body)
            if reshape is None:
                response, _ = await relay(request, upstream, observation, keepalive, explain_break=explain)
            else:
                response, _ = await relay_reshaped(request, upstream, reshape, observation, keepalive, explain)
            return response
        finally:
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()

    @staticmethod
    def _filtered(body: bytes, document: dict, upstream_model: str | None, rules: Filters, requested: str) -> bytes:
        """The model's upstream name and `filters` (`setParamsByID` by the `requested` name) applied;
        the original bytes when nothing changes."""
        rewritten = filters.rewrite(document, upstream_model, rules, requested)
        return body if rewritten is None else filters.encode(rewritten)

    async def _websocket_to_model(
        self, request: web.Request, model_id: str, name: str, path: str
    ) -> web.StreamResponse:
        """A websocket to a local model: admitted like any request and held for the socket's life,
        unless the model has `compat.ignoreWebsockets` (then only while it is ready, and unadmitted)."""
        observation = self._observe(request, model_id, path, name, capture=False)  # no capture of frames
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
                self._upstream_headers(request, backend_credentials(model, path)), observation,
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
        observation = self._observe(request, target.model, path, name, peer.id, capture=False)
        response, _ = await relay_websocket(
            request, self._upstream_session(peer.proxy, peer.timeouts), peer.proxy.rstrip("/") + path,
            self._upstream_headers(request, peer_credentials(peer)), observation,
            self.config.security.limits.max_websocket_message_bytes,
        )
        return response

    def _upstream_headers(self, request: web.Request, credentials: dict[str, str] | None) -> CIMultiDict[str]:
        """The headers sent upstream: the client's, less hop-by-hop ones, plus a peer's or a backend's
        own `credentials` (which replace the client's)."""
        headers = forward_headers(request.headers)
        if self.config.api_keys or credentials:
            for name in CREDENTIAL_HEADERS:  # the router's key is the router's, not the upstream's
                headers.pop(name, None)
        if credentials:
            headers.update(credentials)
        return headers


def backend_credentials(model: ModelConfig, path: str) -> dict[str, str] | None:
    """A local server started with its own key (the entry's `apiKey`, or its `--api-key`) is sent that
    key, as a peer is sent its `apiKey`: a client of the router needs none of the backend's."""
    return call_headers(model, path) or None


def _with_query(path: str, request: web.Request) -> str:
    return f"{path}?{request.query_string}" if request.query_string else path


@functools.lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(pattern) for pattern in patterns)


def _ignored_path(patterns: tuple[str, ...], path: str) -> bool:
    """`upstream.ignorePaths`: whether a pattern matches anywhere in `path` (Go's `MatchString`: unanchored)."""
    return any(pattern.search(path) for pattern in _compiled(patterns))
