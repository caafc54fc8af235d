"""The one OpenAI streaming client swaplab shares (bench, grill): aiohttp, one connection pool.

Per request it records when it sent, when every token-bearing chunk arrived, the
server's own usage, the assembled answer and any error (`RequestResult`). The cost
per request is one JSON parse per chunk and a timestamp; the bench's selftest and
`benchmarks/client_overhead.py` measure what that adds.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from time import perf_counter
from types import SimpleNamespace
from typing import Any

import aiohttp

from swaplab.client.answer import StreamAssembler, error_text, read_whole_answer
from swaplab.client.errors import ServerUnreachableError
from swaplab.client.result import RequestResult
from swaplab.client.server import ServerInfo, ServerProbe

# llama.cpp's server drops idle keep-alive connections after 5 s; a pooled connection
# idle for longer than this is closed here first, so few requests meet a dropped one.
IDLE_SECONDS = 4.0
CONNECT_TIMEOUT_SECONDS = 10.0
# A request may wait this long for each read: long prefills (64k tokens on a slow
# backend take minutes before the first byte) must not be cut short.
READ_TIMEOUT_SECONDS = 900.0
JSON_HEADERS = {"Content-Type": "application/json"}
STREAM_TYPES = ("text/event-stream", "application/x-ndjson")


def base_url_of(url: str) -> str:
    """`http://host:port` from what a user types: a trailing `/` or `/v1` is dropped."""
    url = url.rstrip("/")
    url = url.removesuffix("/v1")
    if "://" not in url:
        url = f"http://{url}"
    return url


class OpenAIClient:
    """Talks to one OpenAI-compatible server (a backend or a swaplab router).

    Use as `async with OpenAIClient(url) as client:`. `on_token`, when given, is called
    once per token-bearing chunk of every stream (a live counter for progress bars).
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        read_timeout: float = READ_TIMEOUT_SECONDS,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        on_token: Callable[[], None] | None = None,
    ):
        self.base_url = base_url_of(url)
        self.on_token = on_token
        self._headers = dict(JSON_HEADERS)
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._idle_seconds = idle_seconds
        self._session: aiohttp.ClientSession | None = None
        self._fresh_session: aiohttp.ClientSession | None = None
        self._probe = ServerProbe(self)

    async def __aenter__(self) -> OpenAIClient:
        self._pool()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        for session in (self._session, self._fresh_session):
            if session is not None:
                await session.close()
        self._session = self._fresh_session = None

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_connection_reuseconn.append(_note_reused)
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._idle_seconds)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, trace_configs=[trace], auto_decompress=False
            )
        return self._session

    def _fresh(self) -> aiohttp.ClientSession:
        # Every request here gets a connection of its own: where a retry goes.
        if self._fresh_session is None:
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
            self._fresh_session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._fresh_session

    # -- generation ------------------------------------------------------------------

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        *,
        stream: bool = True,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        **parameters: Any,
    ) -> RequestResult:
        """POST /v1/chat/completions; streams (asking for usage) unless `stream=False`."""
        body: dict[str, Any] = {"model": model, "messages": messages, **parameters}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if tools:
            body["tools"] = tools
        if tool_choice is not None:
            body["tool_choice"] = tool_choice
        return await self.generate("/v1/chat/completions", body, stream=stream)

    async def complete(
        self, model: str, prompt: str | list[Any], *, stream: bool = True, max_tokens: int | None = None,
        **parameters: Any,
    ) -> RequestResult:
        """POST /v1/completions; streams (asking for usage) unless `stream=False`."""
        body: dict[str, Any] = {"model": model, "prompt": prompt, **parameters}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return await self.generate("/v1/completions", body, stream=stream)

    async def generate(self, path: str, body: dict[str, Any], *, stream: bool = True) -> RequestResult:
        """Send a generation request body as it is (plus `stream` and, streaming, `include_usage`)."""
        return await self.send(path, self.encode(body, stream=stream), stream=stream)

    @staticmethod
    def encode(body: dict[str, Any], *, stream: bool = True) -> bytes:
        """A generation body as the bytes `send` takes: `stream` set, and usage asked for when streaming."""
        body = {**body, "stream": stream}
        if stream:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return json.dumps(body).encode()

    async def send(self, path: str, payload: bytes, *, stream: bool = True) -> RequestResult:
        """POST a ready JSON body; the clock starts here, after any serialising."""
        url = self.base_url + path
        session = self._pool()
        result = RequestResult(sent_at=perf_counter(), streamed=stream)
        attempt = SimpleNamespace(reused=False)
        while True:
            try:
                async with session.post(url, data=payload, headers=self._headers, trace_request_ctx=attempt) as response:
                    result.status = response.status
                    await self._read(response, result, stream)
                    return result
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                if (
                    result.status is None
                    and attempt.reused
                    and result.attempts == 1
                    and not isinstance(error, aiohttp.ClientConnectorError)
                ):
                    # The server had closed the kept-alive connection we sent on, before
                    # any answer: the request never reached it. Once more, on a fresh one.
                    result.attempts += 1
                    session = self._fresh()
                    attempt = SimpleNamespace(reused=False)
                    continue
                result.error = describe(error)
            except (TimeoutError, aiohttp.ClientError) as error:
                result.error = describe(error)
            result.end_at = perf_counter()
            return result

    async def _read(self, response: aiohttp.ClientResponse, result: RequestResult, stream: bool) -> None:
        content_type = response.content_type
        if response.status >= 400:
            body = await response.read()
            result.end_at = perf_counter()
            result.error = f"HTTP {response.status}: {_error_of(body)}"
            return
        if stream and content_type in STREAM_TYPES:
            assembler = StreamAssembler(result, self.on_token)
            try:
                async for data in response.content.iter_any():
                    assembler.feed(data, perf_counter())
            except (TimeoutError, aiohttp.ClientError) as error:
                # Mid-stream: the server may have done the work; never retried.
                assembler.close(perf_counter())
                result.error = f"the stream broke: {describe(error)}"
                return
            assembler.close(perf_counter())
            return
        body = await response.read()
        now = perf_counter()
        result.streamed = False
        try:
            document = json.loads(body)
        except ValueError:
            result.end_at = now
            result.error = f"the answer is not JSON ({content_type or 'no content type'}): {body[:80]!r}"
            return
        read_whole_answer(result, document, now)

    # -- plain JSON endpoints --------------------------------------------------------

    async def get_json(self, path: str) -> tuple[int, Any]:
        """GET a JSON endpoint: (status, document or None). Raises ServerUnreachableError."""
        return await self._json("GET", path, None)

    async def post_json(self, path: str, body: Any) -> tuple[int, Any]:
        """POST JSON to an endpoint: (status, document or None). Raises ServerUnreachableError."""
        return await self._json("POST", path, json.dumps(body).encode())

    async def _json(self, method: str, path: str, payload: bytes | None) -> tuple[int, Any]:
        try:
            async with self._pool().request(method, self.base_url + path, data=payload, headers=self._headers) as response:
                body = await response.read()
                try:
                    return response.status, json.loads(body) if body else None
                except ValueError:
                    return response.status, None
        except aiohttp.ClientConnectorError as error:
            raise ServerUnreachableError(
                f"cannot reach {self.base_url} ({_reason(error)}); is the server running? Check --url"
            ) from None
        except (TimeoutError, aiohttp.ClientError) as error:
            raise ServerUnreachableError(f"{method} {self.base_url}{path} failed: {describe(error)}") from None

    # -- what the server is ----------------------------------------------------------

    async def server_info(self, model: str | None = None) -> ServerInfo:
        """Who serves `model` here: backend kind and version, router entry, context (cached per model)."""
        return await self._probe.server_info(model)

    async def tokenize(self, text: str, *, model: str | None = None) -> list[int]:
        """The server's own token ids for `text`, without special tokens (llama.cpp, vLLM, SGLang `/tokenize`)."""
        return await self._probe.tokenize(text, model)


async def _note_reused(session: aiohttp.ClientSession, context: SimpleNamespace, params: Any) -> None:
    request_context = context.trace_request_ctx
    if request_context is not None:
        request_context.reused = True


def describe(error: BaseException) -> str:
    """One line for a transport failure."""
    if isinstance(error, asyncio.TimeoutError):
        return "timed out waiting for the server"
    if isinstance(error, aiohttp.ClientConnectorError):
        return f"cannot connect: {_reason(error)}"
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    text = str(error) or type(error).__name__
    return text.splitlines()[0]


def _reason(error: aiohttp.ClientConnectorError) -> str:
    errno = getattr(error.os_error, "errno", None)
    return os.strerror(errno).lower() if errno else str(error)


def _error_of(body: bytes) -> str:
    try:
        return error_text(json.loads(body))
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300] or "(empty body)"
