"""`GET /api/events`: llama-swap's live feed for its web page and the tools that read it.

Every message is framed as llama-swap frames it: an SSE event named `message` whose data
is `{"type": T, "data": "<the payload as a JSON string>"}` (the payload encoded twice,
as its UI expects). Types: `modelStatus`, `logData`, `activity`, `inflight`, `uiConfig`,
`profileChanged`. Messages are published by the fleet's and the router's own changes (a
backend's state, a log line, a recorded request, a request starting or ending), never by
polling; a model's change reaches the stream in the same turn of the event loop.

Nothing is built while nobody listens: `publish` returns at once without subscribers.
A subscriber that falls 1024 messages behind loses the newest, as llama-swap's does.
swaplab adds a comment line (`: keep-alive`) every 15 s of silence, which SSE readers
ignore and proxies need.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

QUEUE_SIZE = 1024
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": keep-alive\n\n"
HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Content-Type-Options": "nosniff",
    "X-Accel-Buffering": "no",
}


def frame(kind: str, payload: Any) -> bytes:
    """One message in llama-swap's envelope: `event:message`, its payload JSON inside a JSON string."""
    envelope = {"type": kind, "data": json.dumps(payload, separators=(",", ":"))}
    return b"event:message\ndata:" + json.dumps(envelope, separators=(",", ":")).encode() + b"\n\n"


class EventHub:
    """The subscribers of `/api/events` and what is published to them."""

    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[bytes]] = set()
        self._pending: dict[str, Callable[[], Any]] = {}
        self._flush: asyncio.Handle | None = None

    @property
    def listening(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self) -> asyncio.Queue[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=QUEUE_SIZE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[bytes]) -> None:
        self._subscribers.discard(queue)

    def publish(self, kind: str, payload: Any) -> None:
        """Send one message to every subscriber now."""
        if not self._subscribers:
            return
        message = frame(kind, payload)
        for queue in self._subscribers:
            if not queue.full():
                queue.put_nowait(message)

    def publish_soon(self, kind: str, payload: Callable[[], Any]) -> None:
        """Send `payload()` once, at the end of this turn of the loop, however often asked meanwhile:
        five backends changing in one decision make one `modelStatus`, read after all of them."""
        if not self._subscribers:
            return
        self._pending[kind] = payload
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._publish_pending)

    def _publish_pending(self) -> None:
        self._flush = None
        pending, self._pending = self._pending, {}
        for kind, payload in pending.items():
            self.publish(kind, payload())
