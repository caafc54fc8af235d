"""A model request the router answers itself: what the fleet's refusal tells the client, and the answer,
recorded like any other (inside an event stream under way, its final event in the route's framing)."""

from __future__ import annotations

from aiohttp import web

from swaplab.errors import SwaplabError
from swaplab.fleet.lease import BackendUnavailable, OverCapacity
from swaplab.router.door.responses import error_response
from swaplab.router.relay.keepalive import KeepAlive, error_event
from swaplab.router.watch.observe import RequestObservation


async def failed(
    observation: RequestObservation,
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
    observation.fail(status, message)
    committed = await keepalive.stop() if keepalive is not None else None
    if committed is not None and keepalive is not None:
        event = error_event(message, keepalive.dialect, status)
        observation.answered(committed, event)  # for its capture, built in the next batch
        await committed.write(event)
        await committed.write_eof()
        return committed
    response = error_response(status, message, kind)
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(retry_after)))
    observation.answered(response, response.body)  # type: ignore[arg-type]  # json_response's: bytes
    return response


def refusal(error: SwaplabError) -> tuple[int, str, str, float | None]:
    """What the client is told when the fleet refuses a request: status, message, error type, Retry-After."""
    if isinstance(error, OverCapacity):
        return 429, str(error), "rate_limit_exceeded", error.retry_after
    if isinstance(error, BackendUnavailable):
        return 503, str(error), "model_unavailable", error.retry_after
    return 503, str(error), "model_unavailable", None
