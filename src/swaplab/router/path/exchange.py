"""One request to its server, as stages called in order from here: a reader follows it top to bottom.

`Forwarder` (`forward`) decides which server a request goes to; `Exchange` takes it there:

1. the observation opens (`watch.observe`: what the request did, for its record and the in-flight list);
2. heartbeats arm (`relay.keepalive`), for a streaming client that may wait: they beat only if it does;
3. admission (`fleet`): at once when the model is ready and nothing is queued, else queued,
   with `sendLoadingState`'s progress in the stream meanwhile;
4. the upstream request (`_send`): the entry's `filters`, then the request itself (`relay.proxy`);
   a server that crashed under it is restarted and the request sent once more (`relay.recovery`),
   and a route the server lacks is sent again translated (`translate`);
5. the answer (`relay.answer`): the heartbeats hand over to the upstream's head, the relay
   copies the body (`relay.proxy.copy`), and the observation ends with how it went.

The stages do not call one another: the relay is given the observation's `on_chunk` and nothing
else of it, and never meets the heartbeats; the heartbeats write only their own events. Every
model request passes here: nothing is added to this path without measuring it (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from swaplab.config.engines import call_headers
from swaplab.config.model import Config, Filters, ModelConfig, PeerConfig
from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet, State
from swaplab.fleet.lease import Lease
from swaplab.metrics import Metrics
from swaplab.router import translate
from swaplab.router.door.auth import CREDENTIAL_HEADERS
from swaplab.router.path import filters
from swaplab.router.path.contextlimit import explain as too_long
from swaplab.router.path.loading import INTERVAL_SECONDS as LOADING_INTERVAL
from swaplab.router.path.loading import loading_event, progress_text, wants_loading_state
from swaplab.router.path.peers import PeerWatch, peer_credentials
from swaplab.router.path.refusal import failed, refusal
from swaplab.router.path.targets import PeerTarget, Tracking, UnreadableBody, renamed_form
from swaplab.router.relay.answer import Words, answer, answer_reshaped
from swaplab.router.relay.keepalive import KeepAlive, KeepAliveClock, heartbeats
from swaplab.router.relay.proxy import UpstreamError, UpstreamPools, error_text, forward_headers
from swaplab.router.relay.recovery import Failure, explain_break, recover
from swaplab.router.relay.reshape import RESHAPE, Reshape
from swaplab.router.translate.book import RouteBook
from swaplab.router.watch.captures import CaptureStore
from swaplab.router.watch.inflight import InFlight
from swaplab.router.watch.observe import RequestObservation

log = logging.getLogger("swaplab.router")

# The selector a request was routed by, kept with the request for its activity record
# (llama-swap's `metadata.selector`).
SELECTOR = web.RequestKey("selector", str)
# What is kept of a request (`targets.Tracking`); every model route's is kept whole, `/upstream/` has its rule.
TRACKING = web.RequestKey("tracking", Tracking)
KEEP_ALL = Tracking()


class Answered(Exception):
    """The router answered the request itself on its way (a failure, a refusal): `response` ends it.

    Raised, not returned: the way a request usually takes returns the upstream's answer alone,
    and a stage's refusal cannot be mistaken for it (the lane's responses are not aiohttp's)."""

    def __init__(self, response: web.StreamResponse):
        super().__init__()
        self.response = response


class Exchange:
    """Takes a request to a local model or a peer and its answer back, stage by stage."""

    def __init__(
        self,
        fleet: Fleet,
        peers: PeerWatch,
        pools: UpstreamPools,
        metrics: Metrics,
        record: Callable[[RequestObservation], None],
        captures: CaptureStore | None = None,
        inflight: InFlight | None = None,
    ):
        self.fleet = fleet
        self.peers = peers
        self.metrics = metrics
        self.routes = RouteBook()
        """Which servers lack Anthropic's or the Responses API (`router.translate`)."""
        self.pools = pools
        self._record = record
        """Where every observed request ends up (`RequestObservation.on_end`)."""
        self._captures = captures  # the router's: where requests are captured (None or no budget: none is)
        self._inflight = inflight
        self._clock = KeepAliveClock()
        self._words = Words(explain_break, self._too_long)
        """What the router says of a local model's failed answer (`relay.answer`), given the request's lease."""

    @property
    def config(self) -> Config:
        return self.fleet.config

    # -- to a local model --------------------------------------------------------------------

    async def to_model(
        self, request: web.Request, model_id: str, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        reshape = request.get(RESHAPE)
        observation = self.observe(request, model_id, path if reshape is None else reshape.path, name)  # 1
        model = self.fleet.config.models[model_id]
        keepalive = heartbeats(request, path, document, model.heartbeat_interval, self._clock, reshape)  # 2
        lease: Lease | None = None
        try:
            try:  # 3: every request passes here; a ready model with nothing queued admits without a coroutine
                lease = self.fleet.admit_now(model_id) or await self._admit(model, path, document, keepalive, reshape)
            except SwaplabError as error:
                return await failed(observation, *refusal(error), keepalive)
            except asyncio.CancelledError:
                observation.end(completed=False, disconnected=True)  # left while queued
                raise
            observation.admitted(lease.waited_for, lease.fallback, lease.run.claim_restored if lease.run.restored else None)
            try:  # 4
                upstream, lease, reshape = await self._send(request, lease, name, path, body, document, reshape,
                                                            observation, keepalive)
            except Answered as answered:
                return answered.response
            if reshape is None:  # 5
                response, lease.completed = await answer(request, upstream, observation, keepalive, self._words, lease)
            else:
                response, lease.completed = await answer_reshaped(
                    request, upstream, reshape, observation, keepalive, self._words, lease
                )
            return response
        finally:
            if lease is not None:
                self.fleet.release(lease, succeeded=lease.completed,
                                   keep_alive=reshape.keep_alive if reshape is not None else None)
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()

    async def _admit(
        self, model: ModelConfig, path: str, document: dict | None, keepalive: KeepAlive | None, reshape: Reshape | None
    ) -> Lease:
        """Admission through the fleet's queue; with `sendLoadingState`, loading progress streams meanwhile."""
        model_id = model.id
        began = time.perf_counter()
        if keepalive is None or not wants_loading_state(model, path, document) or (
            self.fleet.state_of(model_id) is State.READY
        ):
            lease = await self.fleet.acquire(model_id)
        else:
            started = time.monotonic()

            def progress() -> bytes:
                entry = next((e for e in self.fleet.status() if e["model"] == model_id), {})
                text = progress_text(model_id, entry.get("state", "starting"), time.monotonic() - started,
                                     entry.get("waiting"), entry.get("phase", ""), entry.get("progress"))
                return loading_event(model_id, text) if reshape is None else reshape.loading(text)

            keepalive.show_progress(progress, LOADING_INTERVAL)
            try:
                lease = await self.fleet.acquire(model_id)
            finally:
                keepalive.show_heartbeats()
        if reshape is not None:
            reshape.load_seconds = time.perf_counter() - began
        return lease

    async def _send(
        self, request: web.Request, lease: Lease, name: str, path: str, body: bytes, document: dict | None,
        reshape: Reshape | None, observation: RequestObservation, keepalive: KeepAlive | None,
    ) -> tuple[aiohttp.ClientResponse, Lease, Reshape | None]:
        """The upstream request, once its headers are in, with the lease it went on (a restart trades it
        for a new one) and the reshape of its answer (a translation adds one); `Answered` where the
        router answers it itself."""
        admitted = lease
        attempt = 0
        try:
            while True:
                attempt += 1
                # The entry of the server that admitted it: a reload while it was queued
                # must not mix the old entry's filters with the new entry's server.
                model = lease.model
                sent_path = path
                if document is not None:
                    try:
                        sent = _filtered(body, document, model.use_model_name or None, model.filters, name)
                    except UnreadableBody as error:
                        raise Answered(await failed(observation, error.status, str(error), "invalid_request_error",
                                                    None, keepalive))
                elif model.use_model_name:  # a form or ?model=: renamed there, as llama-swap does
                    sent = await renamed_form(request.headers.get("Content-Type", ""), body, model.use_model_name)
                    if request.method == "GET" and request.query.get("model") == name:
                        sent_path = str(URL(path).update_query(model=model.use_model_name))
                else:
                    sent = body
                observation.sending(sent)
                try:
                    upstream = await self.pools.open(
                        request.method, model.proxy.rstrip("/") + sent_path, model.timeouts,
                        self.upstream_headers(request, backend_credentials(model, sent_path)), sent,
                    )
                except UpstreamError as error:
                    if not error.unreachable:
                        raise Answered(await failed(observation, error.status, str(error), "upstream_error", None,
                                                    keepalive))
                    recovered = await recover(self.fleet, self.metrics, lease, error, first=attempt == 1)
                    if isinstance(recovered, Failure):
                        raise Answered(await failed(observation, recovered.status, recovered.message,
                                                    "upstream_error", recovered.retry_after, keepalive))
                    lease = recovered
                    continue
                if upstream.status != 404 or reshape is not None:
                    return upstream, lease, reshape
                learned = await self.routes.after_404(request, upstream, ("model", model.id, model.cmd),
                                                      model.translate, sent_path, document, name, f"model {model.id!r}")
                if isinstance(learned, web.Response):  # a request the translation refuses
                    raise Answered(_refused(observation, learned))
                if not isinstance(learned, translate.Translation):
                    return learned, lease, reshape
                # Sent again, translated: not a new attempt.
                reshape, path, document = learned.reshape, learned.path, learned.document
                body = filters.encode(document)
                attempt -= 1
        except BaseException:
            if lease is not admitted:  # the caller releases the lease it knows of; a restart's is released here
                self.fleet.release(lease, succeeded=False, keep_alive=reshape.keep_alive if reshape is not None else None)
            raise

    # -- to a peer ---------------------------------------------------------------------------

    async def to_peer(
        self, request: web.Request, target: PeerTarget, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        peer = target.peer
        reshape = request.get(RESHAPE)
        observation = self.observe(request, target.model, path if reshape is None else reshape.path, name, peer.id)
        health = self.peers.health(peer.id, target.model)  # its admission: the peer's own
        if not health.available:
            return await failed(
                observation, 503, f"peer model {peer.id}/{target.model} is unavailable: {health.reason}",
                "model_unavailable",
            )
        if document is not None:
            try:
                body = _filtered(body, document, target.model, peer.filters, name)
            except UnreadableBody as error:
                return await failed(observation, error.status, str(error), "invalid_request_error")
        observation.sending(body)
        keepalive = heartbeats(request, path, document, self.config.heartbeat_interval, self._clock, reshape)
        try:
            try:
                upstream, reshape = await self._send_to_peer(request, target, name, path, body, document, reshape,
                                                             observation, keepalive)
            except Answered as answered:
                return answered.response

            if reshape is None:
                response, _ = await answer(request, upstream, observation, keepalive, PEER_WORDS, peer)
            else:
                response, _ = await answer_reshaped(request, upstream, reshape, observation, keepalive, PEER_WORDS, peer)
            return response
        finally:
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()

    async def _send_to_peer(
        self, request: web.Request, target: PeerTarget, name: str, path: str, body: bytes, document: dict | None,
        reshape: Reshape | None, observation: RequestObservation, keepalive: KeepAlive | None,
    ) -> tuple[aiohttp.ClientResponse, Reshape | None]:
        """The request to the peer, once its headers are in; a 404 on a route the peer lacks is sent again,
        translated; `Answered` where the router answers it itself."""
        peer = target.peer
        while True:  # twice at most
            try:
                upstream = await self.pools.open(
                    request.method, peer.proxy.rstrip("/") + path, peer.timeouts,
                    self.upstream_headers(request, peer_credentials(peer)), body,
                )
            except UpstreamError as error:
                raise Answered(await failed(observation, error.status, f"peer {peer.id!r}: {error}", "upstream_error",
                                            None, keepalive))
            if upstream.status != 404 or reshape is not None:
                return upstream, reshape
            learned = await self.routes.after_404(request, upstream, ("peer", peer.id, peer.proxy), peer.translate,
                                                  path, document, name, f"peer {peer.id!r}")
            if isinstance(learned, web.Response):
                raise Answered(_refused(observation, learned))
            if not isinstance(learned, translate.Translation):
                return learned, reshape
            reshape, path, document = learned.reshape, learned.path, learned.document
            body = _filtered(filters.encode(document), document, target.model, peer.filters, name)
            observation.sending(body)

    # -- what every request has ----------------------------------------------------------------

    def observe(self, request: web.Request, model: str, path: str, name: str, peer: str | None = None,
                capture: bool = True) -> RequestObservation:
        """The request's observation, opened: captured while captures have room, listed in flight."""
        selector = request.get(SELECTOR)
        tracking = request.get(TRACKING, KEEP_ALL)
        observation = RequestObservation.of(
            request, model, path, name, peer, self._record if tracking.activity else self._forget,
            self.fleet.config.session_id_headers, self._captures if capture and tracking.activity else None,
            {"selector": selector} if selector is not None else None,
        )
        if self._inflight is not None:
            # Removed where it is recorded (or forgotten), when it ends. Unlisted ones too are watched
            # (a write timeout is no less due on them), but not shown.
            self._inflight.add(observation, request, listed=tracking.in_flight)
        return observation

    def _forget(self, observation: RequestObservation) -> None:
        """The end of a request that leaves no activity row: only its in-flight entry goes."""
        if self._inflight is not None:
            self._inflight.remove(observation)

    def _too_long(self, lease: Lease, status: int, body: bytes) -> bytes | None:
        return too_long(self.fleet.config.path, lease.model, status, body)

    def upstream_headers(self, request: web.Request, credentials: dict[str, str] | None) -> CIMultiDict[str]:
        """The headers sent upstream: the client's, less hop-by-hop ones, plus a peer's or a backend's
        own `credentials` (which replace the client's)."""
        headers = forward_headers(request.headers)
        if self.fleet.config.api_keys or credentials:
            for name in CREDENTIAL_HEADERS:  # the router's key is the router's, not the upstream's
                headers.pop(name, None)
        if credentials:
            headers.update(credentials)
        return headers


async def _peer_broke_off(peer: PeerConfig) -> str:
    return f"peer {peer.id!r} broke off mid-response"


PEER_WORDS = Words(_peer_broke_off)
"""What the router says of a peer's failed answer: its own words, none added to its errors."""


def _refused(observation: RequestObservation, refused: web.Response) -> web.Response:
    """A request the translation refuses, answered and recorded as the router's own."""
    observation.fail(refused.status, error_text(refused.body))  # type: ignore[arg-type]  # json_response's: bytes
    observation.answered(refused, refused.body)  # type: ignore[arg-type]
    return refused


def _filtered(body: bytes, document: dict, upstream_model: str | None, rules: Filters, requested: str) -> bytes:
    """The model's upstream name and `filters` (`setParamsByID` by the `requested` name) applied;
    the original bytes when nothing changes."""
    rewritten = filters.rewrite(document, upstream_model, rules, requested)
    return body if rewritten is None else filters.encode(rewritten)


def backend_credentials(model: ModelConfig, path: str) -> dict[str, str] | None:
    """A local server started with its own key (the entry's `apiKey`, or its `--api-key`) is sent that
    key, as a peer is sent its `apiKey`: a client of the router needs none of the backend's."""
    return call_headers(model, path) or None
