"""Streaming responses the router speaks itself: heartbeats while a client waits, and error events.

The seed's worst incident: an agent client on a server chunk-prefilling a 64k prompt got
no byte for minutes, timed out, retried, and queued a second 64k prefill behind the
first. A streaming client that has waited `heartbeatInterval` seconds for its first byte
(the model loading, the request queued, or the backend prefilling) gets its response
committed (200, `text/event-stream`) and a heartbeat every interval after that, in its
protocol's own form: an SSE comment on the OpenAI routes, Anthropic's `event: ping` on
`/v1/messages`. Whatever goes wrong after that point reaches the client as an error event
of the same protocol. A short wait changes nothing: no timer fires, no byte is added.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from swaplab.router.door.dialect import Dialect, route_dialect
from swaplab.router.door.reply import stream_response

if TYPE_CHECKING:
    from swaplab.router.relay.reshape import Reshape

EVENT_STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


HEARTBEATS = {
    Dialect.OPENAI: b": keep-alive\n\n",
    Dialect.RESPONSES: b": keep-alive\n\n",
    Dialect.ANTHROPIC: b'event: ping\ndata: {"type": "ping"}\n\n',
}


def heartbeats(
    request: web.Request, path: str, document: dict | None, interval: float, clock: KeepAliveClock,
    reshape: Reshape | None = None,
) -> KeepAlive | None:
    """The heartbeats of a request that asked for a stream, armed: the first is due `interval` seconds
    from now (none when it is 0); None for any other request. A `reshape`'s stream has its own framing."""
    if reshape is not None:
        if not reshape.streaming:
            return None
        keepalive = KeepAlive(
            request, reshape.dialect, interval, clock, reshape.heartbeat,
            {"Content-Type": reshape.content_type, "X-Accel-Buffering": "no"},
        )
    elif document is None or document.get("stream") is not True:
        return None
    else:
        keepalive = KeepAlive(request, route_dialect(path), interval, clock)
    if interval > 0:  # armed here, not by a method: every streaming request passes here
        keepalive.due = asyncio.get_running_loop().time() + interval
        clock.add(keepalive, keepalive.due)
    return keepalive


def error_event(message: str, dialect: Dialect = Dialect.OPENAI, status: int = 502) -> bytes:
    """A final event saying what went wrong, framed as the route's own errors are.

    The `openai` and `anthropic` SDKs raise it as an API error with this message.
    """
    if dialect is Dialect.ANTHROPIC:
        kind = "overloaded_error" if status in (429, 503, 529) else "api_error"
        payload = {"type": "error", "error": {"type": kind, "message": message}}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    if dialect is Dialect.RESPONSES:
        payload = {"type": "error", "code": str(status), "message": message, "param": None}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    if dialect is Dialect.OLLAMA:  # its clients raise a line with `error` as their ResponseError
        return json.dumps({"error": message}).encode() + b"\n"
    payload = {"error": {"message": message, "type": "upstream_error", "code": status}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class KeepAliveClock:
    """One timer for every waiting client, instead of one per request.

    A request path that arms and disarms a timer of its own pays for it on every
    request (a heap entry, twice: before the upstream's headers and again before its
    first chunk); almost none ever beats. Waiting clients join a set (cheap) and the
    clock wakes when the earliest is due.
    """

    __slots__ = ("_waiting", "_timer", "_timer_at")

    def __init__(self) -> None:
        self._waiting: set[KeepAlive] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def add(self, keepalive: KeepAlive, due: float) -> None:
        self._waiting.add(keepalive)
        if self._timer is None or due < self._timer_at:
            self._wake_at(due)

    def discard(self, keepalive: KeepAlive) -> None:
        self._waiting.discard(keepalive)  # the timer, if set, finds nobody due and lapses

    def _wake_at(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_at(when, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        due = [k for k in self._waiting if k.due <= now]
        for keepalive in due:
            self._waiting.discard(keepalive)
            keepalive.begin()
        if self._waiting:
            self._wake_at(min(k.due for k in self._waiting))


class KeepAlive:
    """Keeps one streaming client's connection visibly alive until the upstream's first byte.

    `heartbeats()` makes one, armed; after `interval` seconds without `stop()`, the response is
    committed and a heartbeat goes out every `interval`. `show_progress(producer, every)`
    commits at once and writes `producer()`'s bytes every `every` seconds instead
    (`sendLoadingState`), until `show_heartbeats()` goes back to plain heartbeats. Writes
    never overlap: `stop()` waits for a write under way and returns the committed
    response, if any, so the caller's next write follows the last heartbeat.
    """

    __slots__ = (
        "dialect", "response", "due", "beats", "_request", "_clock", "_interval", "_every", "_producer", "_task",
        "_writing", "_stopped", "_held", "_heartbeat", "_headers",
    )

    def __init__(
        self, request: web.Request, dialect: Dialect, interval: float, clock: KeepAliveClock,
        heartbeat: Callable[[], bytes] | None = None, headers: dict[str, str] | None = None,
    ):
        """`heartbeat` and `headers` frame a dialect without fixed heartbeats (Ollama's: an empty chunk
        of its own reply, under its own content type)."""
        self.dialect = dialect
        self._heartbeat = heartbeat
        self._headers = headers or EVENT_STREAM_HEADERS
        self.response: web.StreamResponse | None = None
        """The response once committed (by a heartbeat, or adopted from the relay)."""
        self.due = 0.0
        """When the first heartbeat is due (the loop's clock); 0 when never (an `interval` of 0)."""
        self.beats = 0
        self._request = request
        self._clock = clock
        self._interval = interval
        self._every = interval
        self._producer: Callable[[], bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._writing = False
        self._stopped = False
        self._held = False

    def hold(self) -> None:
        """Nothing may be committed for now (the relay is about to commit the upstream's own headers)."""
        self._held = True
        self._clock.discard(self)

    def adopt(self, response: web.StreamResponse) -> None:
        """The relay committed the upstream's own event stream: heartbeats, when due, go there."""
        self.response = response
        self._held = False
        if self.due and self._task is None and not self._stopped:
            self._clock.add(self, self.due)

    def show_progress(self, producer: Callable[[], bytes], every: float) -> None:
        self._producer = producer
        self._every = every
        self._clock.discard(self)
        if self._task is None and not self._stopped:
            self.begin()

    def show_heartbeats(self) -> None:
        """Back to heartbeats; the next one is due `interval` seconds after the last progress event."""
        self._producer = None
        self._every = self._interval
        if self._task is not None and not self._writing and self._interval <= 0:
            self._task.cancel()
            self._task = None

    def quiet(self) -> bool:
        """No more heartbeats, if none is under way (the common case, without a coroutine).

        Returns False when one is: then `await stop()`.
        """
        if self._task is not None:
            return False
        self._stopped = True
        if self.due:
            self._clock.discard(self)
        return True

    async def stop(self) -> web.StreamResponse | None:
        """No more heartbeats; returns the committed response, if there is one."""
        self._stopped = True
        task = self._task
        if task is None:
            if self.due:
                self._clock.discard(self)
            return self.response
        self._task = None
        if not self._writing:
            task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # a client gone mid-write: the handler hears of it by itself
        return self.response

    def begin(self) -> None:
        """Start beating now (the clock calls this when the first heartbeat is due)."""
        if not self._stopped and not self._held and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            self._writing = True
            try:
                if self.response is None:
                    response = stream_response(self._request, headers=self._headers)
                    await response.prepare(self._request)
                    self.response = response
                if self._producer is not None:
                    payload = self._producer()
                else:
                    payload = self._heartbeat() if self._heartbeat is not None else HEARTBEATS[self.dialect]
                await self.response.write(payload)
                self.beats += 1
            finally:
                self._writing = False
            if self._stopped or self._every <= 0:
                return
            await asyncio.sleep(self._every)
