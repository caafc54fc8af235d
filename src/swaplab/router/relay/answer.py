"""The answer, once the upstream's head is in: the heartbeats hand over, the relay copies, the observation ends.

`path.exchange` calls `answer` (or `answer_reshaped`, for a reply in another API's shape) as
its last stage. The three concerns meet here, in order, and nowhere else: the heartbeats
(`keepalive`) either committed an event stream the upstream's events continue, or go on
beating into the upstream's own stream until its first byte; the relay (`proxy`) writes the
upstream's head and copies its body, calling only the observation's `on_chunk`; the
observation sees the head here, and ends here on every way out, with how it went.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from swaplab.router.door.dialect import dialect_of
from swaplab.router.door.reply import send_whole, stream_response
from swaplab.router.relay.keepalive import KeepAlive, error_event
from swaplab.router.relay.proxy import (
    ERROR_BODY_BYTES,
    copy,
    copy_reshaped,
    error_text,
    read_error,
    reply_head,
)
from swaplab.router.relay.reshape import Reshape
from swaplab.router.watch.observe import RequestObservation

log = logging.getLogger("swaplab.router")


@dataclass(frozen=True, slots=True)
class Words:
    """What the router says of an answer that failed, about its subject (the lease of a local model,
    a peer): why it broke off, and what to change in a small error answer (None: it goes as it came).

    Made once per kind of upstream, not per request (the request passes its subject): two closures
    per request were two more objects for the cyclic collector to walk while the request streams.
    """

    broke_off: Callable[[Any], Awaitable[str]]
    error: Callable[[Any, int, bytes], bytes | None] | None = None


async def answer(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    observation: RequestObservation,
    keepalive: KeepAlive | None = None,
    words: Words | None = None,
    subject: Any = None,
) -> tuple[web.StreamResponse, bool]:
    """The upstream's answer to the client as it arrives; the upstream closed on any exit.

    Returns the client's response and whether the upstream's answer arrived in full. The
    observation sees the status and every chunk (and any error event the router adds), and
    ends on every way out (a client that went away included). `keepalive` is the client's
    heartbeats: if they already committed an event stream, the upstream's events continue it
    (and an upstream that answers anything but an event stream ends it with an error event);
    otherwise they may still beat into the upstream's own event stream until its first chunk.
    `words` say, in the router's words, why `subject`'s upstream broke off, and may add what to
    change to a small error answer (`contextlimit`), which is then read whole: a success never
    meets them.
    """
    status = upstream.status
    content_type = upstream.content_type
    is_event_stream = content_type == "text/event-stream"
    explain_error = words.error if words is not None else None
    observation.on_headers(status, content_type)
    completed = disconnected = False
    failure = None
    response: web.StreamResponse | None = keepalive.response if keepalive is not None else None
    try:
        if response is not None and (status != 200 or not is_event_stream):
            # The heartbeats committed an event stream; the upstream's answer is not one to continue it.
            await keepalive.stop()  # type: ignore[union-attr]
            body = await upstream.content.read(4096)
            observation.on_chunk(body)
            if explain_error is not None:
                body = explain_error(subject, status, body) or body
            failure = f"the backend answered HTTP {status}: {error_text(body)}"
            await _end_stream(response, error_event(failure, keepalive.dialect, status), observation)  # type: ignore[union-attr]
            return response, False
        whole = None
        if explain_error is not None and response is None and status >= 400:
            whole = await read_error(upstream)
            if whole is not None:
                whole = explain_error(subject, status, whole) or whole
        if response is None:
            response = reply_head(request, upstream, whole)
            if keepalive is not None:
                keepalive.hold()  # the upstream's head goes out, not a heartbeat's
            await response.prepare(request)
            observation.response = response  # the in-flight view shows its headers
            observation.upstream = upstream  # what a cancel closes
            if keepalive is not None:
                if status == 200 and is_event_stream:
                    keepalive.adopt(response)  # beats go on in the upstream's stream until its first byte
                elif not keepalive.quiet():
                    await keepalive.stop()
        try:
            chunk = await upstream.content.readany() if whole is None else whole
            if keepalive is not None and not keepalive.quiet():
                await keepalive.stop()  # the first byte is here: no heartbeat may come between chunks
            await copy(request, upstream, response, chunk, observation.on_chunk)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as error:
            # The backend broke off mid-response. A stream gets a final error event rather
            # than a silent hang or a truncated body that looks complete.
            failure = await _broken(upstream, error, observation, keepalive, words, subject)
            if not is_event_stream:
                if request.transport is not None:
                    request.transport.close()  # a truncated body must not look complete
                return response, False
            dialect = keepalive.dialect if keepalive is not None else dialect_of(request.path)
            await _end_stream(response, error_event(failure, dialect), observation)
            return response, False
        completed = True
        return response, True
    except (asyncio.CancelledError, ConnectionResetError):
        # aiohttp cancels the handler when its client disconnects; a write to a
        # closed client raises ConnectionResetError.
        disconnected = True
        raise
    finally:
        if completed:
            upstream.release()
        else:
            upstream.close()  # drop the connection: the upstream sees its client go away
        observation.response = response  # what the client got, for a capture
        observation.end(completed=completed, disconnected=disconnected, error=failure)


async def answer_reshaped(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    reshape: Reshape,
    observation: RequestObservation,
    keepalive: KeepAlive | None = None,
    words: Words | None = None,
    subject: Any = None,
) -> tuple[web.StreamResponse, bool]:
    """`answer`, with the client's reply in another API's shape (`reshape`), e.g. Ollama's over OpenAI's.

    The observation sees the upstream's own bytes. A streamed reply is committed once the
    upstream's answer is known to be one to reshape (or by a heartbeat before that); a
    non-streamed one is answered whole at the end, so an upstream that breaks off, or answers
    an error, still gets its status to the client.
    """
    status = upstream.status
    content_type = upstream.content_type
    observation.on_headers(status, content_type)
    observation.upstream_route(upstream.url.path)
    completed = disconnected = False
    failure = None
    response: web.StreamResponse | None = keepalive.response if keepalive is not None else None
    try:
        if not reshape.accepts(status, content_type):
            if keepalive is not None:
                response = await keepalive.stop()
            body = await upstream.content.read(ERROR_BODY_BYTES)
            observation.on_chunk(body)
            if words is not None and words.error is not None and status >= 400:
                body = words.error(subject, status, body) or body
            failure = f"the backend answered HTTP {status}: {error_text(body)}"
            if response is None:
                code = status if status >= 400 else 502
                whole = reshape.error_response(code, error_text(body) if status >= 400 else failure)
                return await send_whole(request, whole.status, whole.body, whole.content_type), False  # type: ignore[arg-type]
            await _end_stream(response, reshape.error(failure), observation)
            return response, False
        observation.upstream = upstream  # what a cancel closes
        try:
            chunk = await upstream.content.readany()
            if keepalive is not None:
                response = keepalive.response if keepalive.quiet() else await keepalive.stop()
            if response is None and reshape.streaming:
                response = stream_response(
                    request, headers={"Content-Type": reshape.content_type, "X-Accel-Buffering": "no"}
                )
                await response.prepare(request)
            observation.response = response
            response = await copy_reshaped(request, upstream, response, reshape, chunk, observation.on_chunk)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as error:
            failure = await _broken(upstream, error, observation, keepalive, words, subject)
            if keepalive is not None:
                response = response or keepalive.response
            if response is None:
                whole = reshape.error_response(502, failure)
                return await send_whole(request, whole.status, whole.body, whole.content_type), False  # type: ignore[arg-type]
            await _end_stream(response, reshape.error(failure), observation)
            return response, False
        completed = True
        return response, True
    except (asyncio.CancelledError, ConnectionResetError):
        disconnected = True
        raise
    finally:
        if completed:
            upstream.release()
        else:
            upstream.close()
        observation.response = response
        observation.end(completed=completed, disconnected=disconnected, error=failure)


async def _broken(
    upstream: aiohttp.ClientResponse, error: Exception, observation: RequestObservation, keepalive: KeepAlive | None,
    words: Words | None, subject: Any,
) -> str:
    """An upstream broke off mid-answer: heartbeats over, and why, in the router's words."""
    if not observation.cancelled:
        log.warning("upstream %s broke off mid-response: %s", upstream.url, error)
    if keepalive is not None:
        await keepalive.stop()
    if observation.cancelled:
        return observation.cancelled
    if words is not None:
        return await words.broke_off(subject)
    return "the upstream broke off mid-response"


async def _end_stream(response: web.StreamResponse, event: bytes, observation: RequestObservation) -> None:
    """A stream under way ends with the router's own final event (an error), seen by the capture."""
    observation.wrote(event)
    await response.write(event)
    await response.write_eof()
