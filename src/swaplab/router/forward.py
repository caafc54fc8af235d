"""The model request path: which server a request goes to, its admission, and the relay.

A request names a model (JSON `model`, a form field, `?model=`, or `/upstream/<model>/`);
a local one is admitted through the fleet (at once when it is ready and nothing is
queued), its body rewritten by the entry's `filters`, and relayed to the backend; a
backend that crashed under it is restarted and the request sent once more. A peer's
model is relayed to the peer. Each request is observed from start to end and handed to
`record`. Every request passes here: nothing is added to this path without measuring
it (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from swaplab.config.model import Config, Filters
from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet, State
from swaplab.fleet.lease import BackendUnavailable, Lease, OverCapacity
from swaplab.metrics import Metrics
from swaplab.router import filters
from swaplab.router.auth import CREDENTIAL_HEADERS
from swaplab.router.keepalive import KeepAlive, KeepAliveClock, error_event, stream_dialect
from swaplab.router.loading import INTERVAL_SECONDS as LOADING_INTERVAL
from swaplab.router.loading import loading_event, progress_text, wants_loading_state
from swaplab.router.observe import RequestObservation
from swaplab.router.peers import PeerWatch, peer_credentials
from swaplab.router.proxy import UpstreamError, UpstreamPools, forward_headers, open_upstream, relay
from swaplab.router.responses import error_response, unknown_model
from swaplab.router.targets import PeerTarget, model_from_body, resolve, split_upstream_path

log = logging.getLogger("swaplab.router")

# The routes whose requests name a model and go to its server.
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

# A backend refused or reset a connection: this long for its process to be seen exiting
# before the router concludes it still runs (a server's exit and its socket's closing are
# moments apart; a wrapper's child may go first).
EXIT_GRACE_SECONDS = 2.0


class Forwarder:
    """Sends each model request to its server: the fleet's backends, or a peer."""

    def __init__(
        self,
        fleet: Fleet,
        peers: PeerWatch,
        pools: UpstreamPools,
        metrics: Metrics,
        record: Callable[[RequestObservation], None],
    ):
        self.fleet = fleet
        self.peers = peers
        self.metrics = metrics
        self._record = record
        """Where every observed request ends up (`RequestObservation.on_end`)."""
        self._upstream_session = pools.session
        self._keepalive_clock = KeepAliveClock()

    @property
    def config(self) -> Config:
        """The config in force; the fleet owns it (a reload changes it there)."""
        return self.fleet.config

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
            return unknown_model(self.config, request.match_info["tail"].split("/")[0])
        name, path = split
        if request.query_string:
            path = f"{path}?{request.query_string}"
        body = await request.read()
        return await self._forward(request, name, path, body, None)

    async def _forward(
        self, request: web.Request, name: str, path: str, body: bytes, document: dict | None
    ) -> web.StreamResponse:
        target = resolve(self.config, name)
        if target is None:
            return unknown_model(self.config, name)  # not recorded: its label would be whatever was typed
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
