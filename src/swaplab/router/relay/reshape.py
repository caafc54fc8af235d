"""A reply in another API's shape than the upstream's: what the relay needs of a translation.

Ollama's routes (`router.ollama`) send the backend an OpenAI request and give their
client Ollama's reply. The exchange (`path.exchange`) finds the request's `Reshape` under `RESHAPE` and
hands it to `answer.answer_reshaped`, which feeds it the upstream's bytes and writes what it
returns. The observation still sees the upstream's own bytes, so the activity row, the
token counts and the capture read the OpenAI response as they would on OpenAI's routes.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from swaplab.router.door.dialect import Dialect


class Reshape(Protocol):
    """One request's translation of the upstream's reply (`router.ollama.replies`)."""

    streaming: bool
    """The client asked for a stream: heartbeats and loading state may go ahead of the reply."""
    content_type: str
    """The client's content type (Ollama's stream: `application/x-ndjson`)."""
    dialect: Dialect
    keep_alive: float | None
    """The request's own idle limit for its model, seconds (negative: forever); None: the model's `ttl`."""
    path: str
    """The route the client called (the activity row's path), not the upstream's."""
    load_seconds: float
    status: int
    """A whole (non-streamed) reply's status, read once `finish` has run: 200, or the upstream's mid-reply error's."""
    """How long the request waited for its model to be ready (Ollama's `load_duration`), set by the forwarder."""

    def accepts(self, status: int, content_type: str) -> bool:
        """Whether the upstream's answer is one this reshapes (else it is an error, told in the client's shape)."""

    def feed(self, chunk: bytes) -> bytes:
        """The client's bytes for one upstream chunk (b"" until there is something whole to send)."""

    def finish(self) -> bytes:
        """The client's last bytes once the upstream's reply is complete (a non-streamed reply: all of it)."""

    def error(self, message: str) -> bytes:
        """A final line saying what went wrong, inside a reply already under way."""

    def error_response(self, status: int, message: str) -> web.Response:
        """A whole error answer in the client's shape, before anything was sent."""

    def heartbeat(self) -> bytes:
        """An empty chunk of the reply, while the client waits for its first one."""

    def loading(self, text: str) -> bytes:
        """A chunk showing the model's loading state (`sendLoadingState`) as the reply's own thinking text."""


RESHAPE = web.RequestKey("reshape", Reshape)
