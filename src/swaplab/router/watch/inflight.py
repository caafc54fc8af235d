"""Requests on their way, as llama-swap's web page lists them, and `POST /api/inflight/{id}/cancel`.

Every forwarded request is registered when its observation is made and removed when it
ends; the registry holds the request's own handler task, so a cancel is the same thing
as the client going away (aiohttp's handler cancellation closes the upstream at once).
The `inflight` messages of `/api/events` are llama-swap's: a `snapshot` on connect, an
`upsert` when a request starts and, while anyone listens, at most every 250 ms while its
response grows, and a `remove` when it ends. Nothing is published without a listener;
the registry itself costs a dict insert and delete per request.

It also keeps `security.limits.writeTimeout`: while any request is on its way, one timer
samples each one's client connection (`writetimeout`), and a client that has read nothing of
its answer for that long is cut: its connection aborted (its handler is then cancelled,
which closes the upstream and gives back its model, as on a disconnect), its activity
saying why. No client that does not read can hold a model, and so a swap, for longer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from swaplab.config.security import DEFAULT_WRITE_TIMEOUT, Network
from swaplab.router.watch.captures import header_map
from swaplab.router.watch.events import EventHub
from swaplab.router.watch.logformat import client_address
from swaplab.router.watch.writetimeout import Stall, cut_message, next_stall, sample_interval, stalled_too_long

if TYPE_CHECKING:
    from aiohttp import web

    from swaplab.router.watch.observe import RequestObservation

UPDATE_SECONDS = 0.25

log = logging.getLogger("swaplab.router")


class Flight:
    """One request on its way; its times are its observation's."""

    __slots__ = ("id", "observation", "request", "task", "published", "stall", "listed")

    def __init__(self, flight_id: int, observation: RequestObservation, request: web.Request,
                 task: asyncio.Task[Any] | None, listed: bool = True):
        self.id = flight_id
        self.observation = observation
        self.request = request
        """Read only when the entry is shown: nothing is copied or redacted on the request path."""
        self.task = task
        self.published: tuple[int, bool] = (-1, False)
        """(bytes, headers sent) when it was last published, so an unchanged request is not sent again."""
        self.stall: Stall | None = None
        """Since when its client has read nothing while bytes wait for it (`writetimeout`)."""
        self.listed = listed
        """Shown (and cancellable) as llama-swap lists requests; an unlisted one (a model's own page under
        `/upstream/`) is only watched for `writeTimeout`, as it holds its model all the same."""


class InFlight:
    """The requests between their arrival and their end, by id (a decimal string, as llama-swap's)."""

    def __init__(
        self, events: EventHub, secrets: Callable[[], tuple[str, ...]],
        trusted_proxies: Callable[[], Sequence[Network]] = tuple,
        write_timeout: Callable[[], float] = lambda: DEFAULT_WRITE_TIMEOUT,
    ):
        self._events = events
        self._trusted_proxies = trusted_proxies
        """`security.trustedProxies`: whose `X-Forwarded-For` names the client in `remote_ip`."""
        self._secrets = secrets
        self._flights: dict[int, Flight] = {}
        self._ids = itertools.count(1)
        self._ticker: asyncio.TimerHandle | None = None
        self._write_timeout = write_timeout
        """`security.limits.writeTimeout`, read at each sample (a reload applies at once)."""
        self._watcher: asyncio.TimerHandle | None = None
        self.arrived = 0.0
        """When the latest request arrived (time.monotonic()): the router's bookkeeping waits for a quiet moment."""

    def __len__(self) -> int:
        return len(self._flights)

    def add(self, observation: RequestObservation, request: web.Request, listed: bool = True) -> None:
        """A request arrived (on its own handler task); `listed`: shown in the list, else only watched."""
        flight = observation.flight = Flight(next(self._ids), observation, request, asyncio.current_task(), listed)
        self._flights[flight.id] = flight
        if self._watcher is None:
            self._watch_soon()
        if not listed:
            return
        self.arrived = time.monotonic()
        if self._events.listening:
            self._publish_upsert(flight)
            self._tick_soon()

    def remove(self, observation: RequestObservation) -> None:
        """The request ended (however it ended)."""
        flight = observation.flight
        if flight is None:
            return
        observation.flight = None
        del self._flights[flight.id]
        if flight.listed and self._events.listening:
            self._events.publish("inflight", {"operation": "remove", "id": str(flight.id)})

    def cancel(self, flight_id: str) -> bool:
        """End the request now; False when no such request is on its way.

        A response being relayed: its upstream is closed (the model sees its client go away,
        as on a disconnect) and the client's stream ends with an error event saying it was
        cancelled. A request still waiting for its model: its handler is cancelled, as when
        its client leaves while queued.
        """
        self._prune()
        flight = self._flights.get(int(flight_id)) if flight_id.isascii() and flight_id.isdigit() else None
        if flight is None or flight.task is None or not flight.listed:
            return False
        observation = flight.observation
        if observation.upstream is not None and not observation.upstream.closed:
            observation.cancelled = f"request cancelled (POST /api/inflight/{flight_id}/cancel)"
            observation.upstream.close()
        else:
            flight.task.cancel()
        return True

    def snapshot(self) -> dict[str, Any]:
        """`{"operation": "snapshot", "requests": [...]}`, oldest first (llama-swap omits an empty list)."""
        self._prune()
        flights = sorted((f for f in self._flights.values() if f.listed), key=lambda f: f.id)  # ids count up: oldest first
        message: dict[str, Any] = {"operation": "snapshot"}
        if flights:
            message["requests"] = [self.entry(flight) for flight in flights]
        return message

    def entry(self, flight: Flight) -> dict[str, Any]:
        """llama-swap's in-flight entry, then swaplab's `requested_model` and `peer`."""
        observation, request = flight.observation, flight.request
        response = observation.response
        sent = response is not None and response.prepared
        secrets = self._secrets()
        entry: dict[str, Any] = {
            "id": str(flight.id),
            "timestamp": datetime.fromtimestamp(observation.time).astimezone().isoformat(timespec="microseconds"),
            "model": observation.model,
            "req_path": request.path,
            "method": request.method,
            "req_headers": header_map(request.headers.items(), secrets),
            "remote_ip": client_address(
                request.remote or "", request.headers.get("X-Forwarded-For"), request.headers.get("X-Real-IP"),
                self._trusted_proxies(),
            ),
            "resp_headers": header_map(response.headers.items(), secrets) if sent else {},
            "resp_bytes": observation.sent_bytes,
            "elapsed_ms": int(observation.elapsed() * 1000),
            "requested_model": observation.requested_model,
            "peer": observation.peer,
        }
        if observation.metadata:
            entry["metadata"] = observation.metadata
        return entry

    def _prune(self) -> None:
        """Drop a request whose handler ended without its observation ending (an error nobody foresaw):
        checked when the list is read, so the request path pays nothing for it."""
        for flight in [f for f in self._flights.values() if f.task is not None and f.task.done()]:
            self.remove(flight.observation)

    def _publish_upsert(self, flight: Flight) -> None:
        response = flight.observation.response
        flight.published = (flight.observation.sent_bytes, response is not None and response.prepared)
        self._events.publish("inflight", {"operation": "upsert", "request": self.entry(flight)})

    def _tick_soon(self) -> None:
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(UPDATE_SECONDS, self._tick)

    def _tick(self) -> None:
        """While anyone listens: an upsert for each request whose response started or grew since it was last sent."""
        self._ticker = None
        if not self._events.listening or not self._flights:
            return
        self._prune()
        for flight in self._flights.values():
            response = flight.observation.response
            if not flight.listed:
                continue
            if flight.published != (flight.observation.sent_bytes, response is not None and response.prepared):
                self._publish_upsert(flight)
        self._tick_soon()

    def _watch_soon(self) -> None:
        self._watcher = asyncio.get_running_loop().call_later(sample_interval(self._write_timeout()), self._watch_writes)

    def _watch_writes(self) -> None:
        """Sample every request's client connection; cut one that read nothing for `writeTimeout` (`writetimeout`)."""
        self._watcher = None
        self._prune()
        if not self._flights:
            return  # the next request arms it again
        limit, now = self._write_timeout(), time.monotonic()
        for flight in list(self._flights.values()):
            transport = flight.request.transport
            if transport is None or transport.is_closing():
                flight.stall = None
                continue
            flight.stall = next_stall(flight.stall, flight.observation.sent_bytes, transport.get_write_buffer_size(), now)
            if stalled_too_long(flight.stall, now, limit):
                flight.stall = None
                observation = flight.observation
                observation.cancelled = cut_message(limit)
                log.warning("%s %s for %s: %s", flight.request.method, flight.request.path, observation.model,
                            observation.cancelled)
                # Abort, not close: close would wait for the buffer to drain, which is what never happens.
                # The connection's loss cancels the handler, which closes the upstream and ends the lease.
                transport.abort()
        self._watch_soon()

    def watch(self) -> None:
        """A listener connected: keep its view of growing responses current."""
        if self._flights:
            self._tick_soon()
