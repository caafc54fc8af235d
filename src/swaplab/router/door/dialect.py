"""Which API dialect a route's event stream speaks: the one fact heartbeats, error events and the
observation's search for the first content event all read (a leaf: it imports nothing of the router)."""

from __future__ import annotations

import enum


class Dialect(enum.Enum):
    """How a route frames its event stream (and so its heartbeats, errors and content events)."""

    OPENAI = "openai"  # chat/completions, completions, llama.cpp's /completion: `data:` lines
    RESPONSES = "responses"  # /v1/responses: typed `event:` lines
    ANTHROPIC = "anthropic"  # /v1/messages: typed `event:` lines, `ping` for keep-alive
    OLLAMA = "ollama"  # Ollama's /api/chat, /api/generate: a JSON object per line; its `Reply` frames heartbeats


_DIALECTS = {
    "/v1/chat/completions": Dialect.OPENAI,
    "/v1/completions": Dialect.OPENAI,
    "/completion": Dialect.OPENAI,
    "/infill": Dialect.OPENAI,
    "/v1/responses": Dialect.RESPONSES,
    "/v1/messages": Dialect.ANTHROPIC,
}


def route_dialect(path: str) -> Dialect | None:
    """The dialect of the streaming route at `path` (a query is ignored); None for a route that has none."""
    return _DIALECTS.get(path.split("?", 1)[0])


def dialect_of(path: str) -> Dialect:
    """The dialect an event stream on `path` speaks (OpenAI's where the route has none of its own)."""
    return route_dialect(path) or Dialect.OPENAI
