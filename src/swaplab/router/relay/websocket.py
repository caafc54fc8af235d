"""Websocket passthrough under `/upstream/<model>/...`: the client's socket and the upstream's, frames relayed both ways.

Our side is aiohttp's `WebSocketResponse`, the upstream's `ClientSession.ws_connect` on
the model's (or peer's) pool. Text and binary frames go across as they come; a close on
either side closes the other with the same code and reason. Pings are answered on each
hop by aiohttp itself rather than relayed (each side's liveness is its own hop's).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict

from swaplab.router.watch.observe import RequestObservation

log = logging.getLogger("swaplab.router")

# The handshake's own headers: aiohttp writes the upstream's.
HANDSHAKE_HEADERS = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
)
# Close codes that say how a connection ended and may not be sent in a close frame (RFC 6455 7.4.1).
UNSENDABLE_CODES = frozenset({1005, 1006, 1015})
CLOSE_SECONDS = 10.0
GOING_AWAY = 1001


async def relay_websocket(
    request: web.Request,
    session: aiohttp.ClientSession,
    url: str,
    headers: CIMultiDict[str],
    observation: RequestObservation,
    max_message: int,
) -> tuple[web.StreamResponse, bool]:
    """Open the upstream's websocket, accept the client's, relay until one side closes.

    Returns the client's response and whether the conversation ended with a close frame
    (rather than a broken connection). An upstream that refuses the handshake answers the
    client with its status, in the router's words.
    """
    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    upstream_headers = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HANDSHAKE_HEADERS)
    try:
        upstream = await session.ws_connect(
            url, headers=upstream_headers, protocols=protocols, max_msg_size=max_message,
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_SECONDS),
        )
    except aiohttp.WSServerHandshakeError as error:
        message = f"upstream {url} refused the websocket: HTTP {error.status} {error.message}"
        observation.fail(error.status, message)
        return web.json_response({"error": {"message": message, "type": "upstream_error", "code": error.status}},
                                 status=error.status), False
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as error:
        message = f"cannot open the websocket at {url}: {error or type(error).__name__}"
        observation.fail(502, message)
        return web.json_response({"error": {"message": message, "type": "upstream_error", "code": 502}},
                                 status=502), False
    # A message past `max_message` (security.limits.maxWebsocketMessageMB) on either side closes
    # that side with 1009 (aiohttp's check, made as the frame's length is read), and so the relay.
    client = web.WebSocketResponse(
        protocols=(upstream.protocol,) if upstream.protocol else (), max_msg_size=max_message
    )
    completed = False
    disconnected = False
    try:
        await client.prepare(request)
        observation.on_headers(101, "")
        to_upstream = asyncio.ensure_future(_pump(client, upstream))
        to_client = asyncio.ensure_future(_pump(upstream, client))
        try:
            done, _ = await asyncio.wait({to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED)
            first = to_upstream if to_upstream in done else to_client
            close_code, reason, clean = first.result()
            other = upstream if first is to_upstream else client
            await other.close(code=close_code, message=reason.encode())
            await asyncio.gather(to_upstream, to_client, return_exceptions=True)
            completed = clean
        finally:
            for task in (to_upstream, to_client):
                task.cancel()
        return client, completed
    except (asyncio.CancelledError, ConnectionResetError):
        disconnected = client.close_code is None  # not after a close frame: a connection that broke
        raise
    finally:
        # A client that closes and hangs up cancels this handler (aiohttp's handler
        # cancellation) before the relay above can pass its close on: its code goes here.
        code = client.close_code
        await upstream.close(code=GOING_AWAY if code is None or code in UNSENDABLE_CODES else code)
        observation.end(completed=completed or not disconnected and code is not None, disconnected=disconnected)


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
) -> tuple[int, str, bool]:
    """Copy frames from `source` to `sink` until `source` closes: its close code, reason, and whether it closed cleanly."""
    while True:
        message = await source.receive()
        if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            try:
                if message.type is WSMsgType.TEXT:
                    await sink.send_str(message.data)
                else:
                    await sink.send_bytes(message.data)
            except ConnectionResetError:  # the sink went away: its own pump reports how
                return WSCloseCode.INTERNAL_ERROR, "the other side went away", False
        elif message.type is WSMsgType.CLOSE:
            code = message.data if isinstance(message.data, int) else WSCloseCode.OK
            if code in UNSENDABLE_CODES:
                code = WSCloseCode.OK
            return code, message.extra or "", True
        elif message.type in (WSMsgType.CLOSING, WSMsgType.CLOSED):
            code = source.close_code
            if code is None or code in UNSENDABLE_CODES:
                return WSCloseCode.INTERNAL_ERROR, "the other side went away", False
            return code, "", True
        elif message.type is WSMsgType.ERROR:
            log.debug("websocket relay: %s", message.data)
            return WSCloseCode.INTERNAL_ERROR, "the other side went away", False
