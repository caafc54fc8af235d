"""Which servers lack which API: declared, known from the engine, or learned from a 404.

A model's or peer's `translate:` says so where the user knows. Else the engine's contract
does (TabbyAPI's release serves neither `/v1/messages` nor `/v1/responses`). Else the
server's first 404 on such a route, when its body does not speak of a model (vLLM answers
404 for a model name it does not serve, and that is not a missing route), is learned: that
request is sent again, translated, and every later one is translated at once. What is
learned is kept per server as configured (its command or its URL): an entry that changes is
asked afresh.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from aiohttp import web

from swaplab.engines import contract, engine_of
from swaplab.router import translate
from swaplab.router.relay.reshape import RESHAPE

log = logging.getLogger("swaplab.router")

# What a 404 on a translated route may say and still be a missing route, read at most this far.
NOT_FOUND_BYTES = 4096


class RouteBook:
    """The routes servers were found to lack, since the router started."""

    def __init__(self) -> None:
        self._missing: set[tuple[object, str]] = set()

    def lacks(self, server: object, api: str, declared: dict[str, bool], cmd: tuple[str, ...] = ()) -> bool:
        """Whether requests to `api` on `server` are translated."""
        said = declared.get(api)
        if said is not None:
            return said
        return (server, api) in self._missing or (bool(cmd) and _engine_lacks(cmd, api))

    def may_learn(self, api: str, declared: dict[str, bool]) -> bool:
        """Whether a 404 may teach that the server lacks `api` (not when the config says it has it)."""
        return api not in declared

    async def after_404(
        self, request: web.Request, upstream: Any, server: object, declared: dict[str, bool], path: str,
        document: dict[str, Any] | None, requested: str, label: str,
    ) -> Any:
        """A 404 from `server` (`label` in the log) on `path`. When it is a route the router translates and the
        body says the route is missing, the server is remembered to lack it, and the request's translation is
        returned (or the 400 saying it cannot be translated); else the response to relay, as it came."""
        api = translate.ROUTES.get(path.partition("?")[0])
        if api is None or document is None or RESHAPE in request or not self.may_learn(api, declared):
            return upstream
        body, answer = await read_not_found(upstream)
        if not route_missing(body):
            return answer
        upstream.release()
        self.learn(server, api, label)
        return translate.begin(request, path, document, requested)

    def learn(self, server: object, api: str, label: str) -> None:
        if (server, api) not in self._missing:
            self._missing.add((server, api))
            log.info("%s answered 404 on the %s API's route: its requests are translated to chat completions "
                     "from now on (say `translate: {%s: true}` in its entry to skip the first try)", label, api, api)


def route_missing(body: bytes) -> bool:
    """Whether a 404's body says the route is missing, rather than the model (a model name the server
    does not serve: vLLM's `The model ... does not exist`, a router's `model ... not found`)."""
    return b"model" not in body[:NOT_FOUND_BYTES].lower()


_ROUTES = {"messages": "/v1/messages", "responses": "/v1/responses"}


@functools.lru_cache(maxsize=256)
def _engine_lacks(cmd: tuple[str, ...], api: str) -> bool:
    engine = engine_of(cmd)
    return engine is not None and _ROUTES[api] in contract(engine).absent


class _Buffered:
    """A body's first bytes, already read, then the rest of it: read (`readany`, `read`) as the relay reads."""

    def __init__(self, body: bytes, rest):  # type: ignore[no-untyped-def]  # the upstream's stream
        self._body = body
        self._rest = rest

    async def readany(self) -> bytes:
        if not self._body:
            return await self._rest.readany()
        body, self._body = self._body, b""
        return body

    async def read(self, limit: int = -1) -> bytes:
        if not self._body:
            return await self._rest.read(limit)
        if limit < 0:
            return self._body + await self._rest.read()
        body, self._body = self._body[:limit], self._body[limit:]
        return body


class ReadResponse:
    """An upstream's 404, read to see whether it is a missing route, handed to the relay as it came."""

    def __init__(self, upstream, body: bytes):  # type: ignore[no-untyped-def]  # aiohttp's or the wire's response
        self._upstream = upstream
        self.status = upstream.status
        self.reason = upstream.reason
        self.headers = upstream.headers
        self.content_type = upstream.content_type
        self.content_length = upstream.content_length
        self.url = upstream.url
        self.content = _Buffered(body, upstream.content)

    def release(self) -> None:
        self._upstream.release()

    def close(self) -> None:
        self._upstream.close()


async def read_not_found(upstream) -> tuple[bytes, ReadResponse]:  # type: ignore[no-untyped-def]
    """A 404's first bytes (all of a missing route's), and the response to relay when it is not one."""
    body = await upstream.content.read(NOT_FOUND_BYTES)
    return body, ReadResponse(upstream, body)
