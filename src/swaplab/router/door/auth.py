"""`apiKeys`: every route but `/health` needs one of the keys, as Bearer, x-api-key or Basic password."""

from __future__ import annotations

import base64
import hmac

from aiohttp import web

# /health for load balancers (and llama-swap's /wol-health); the redirects to the page and the
# page's static files hold no data (it sends a key for the rest).
OPEN_PATHS = frozenset({"/health", "/wol-health", "/", "/upstream", "/ui", "/ui/"})
OPEN_PREFIXES = ("/ui/static/",)
CREDENTIAL_HEADERS = ("Authorization", "x-api-key")
# The streams a browser opens with EventSource or a plain GET, which cannot send headers: there
# the key may come as `?api_key=` (request logs and captures never hold a query string of these).
QUERY_KEY_PATHS = ("/api/events", "/logs/stream")


def presented_key(request: web.Request) -> str | None:
    """The key a client presented, in whichever of the three forms it used."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip()
    if scheme.lower() == "basic" and value:
        try:
            _, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except ValueError:  # not base64 (binascii.Error), not ASCII, or a password that is not UTF-8
            return None
        return password
    return request.headers.get("x-api-key") or None


def key_matches(presented: str | None, keys: tuple[str, ...]) -> bool:
    if presented is None:
        return False
    # The bytes as sent: both HTTP parsers decode headers with surrogateescape, so a byte that is
    # not UTF-8 is compared as itself (and matches no configured key) rather than failing to encode.
    sent = presented.encode("utf-8", "surrogateescape")
    # Compare against every key, in constant time each, so timing tells nothing.
    return any([hmac.compare_digest(sent, key.encode()) for key in keys])


def key_refusal(request: web.Request, keys: tuple[str, ...], offer_basic: bool) -> web.Response | None:
    """The 401 for a request without a valid key while `keys` are configured, or None (`guard.admission_middleware`
    asks, before a byte of the body is read; a reload's keys apply to the next request).

    Every method needs the key, OPTIONS included: the CORS preflights a browser sends
    without credentials are answered before this (`router.guard`), and never forwarded.
    """
    if not keys or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
        return None
    presented = presented_key(request)
    if presented is None and request.method == "GET" and request.path.startswith(QUERY_KEY_PATHS):
        presented = request.query.get("api_key") or None
    if key_matches(presented, keys):
        return None
    body = {"error": {"message": "invalid or missing API key", "type": "authentication_error", "code": 401}}
    response = web.json_response(body, status=401)
    # Basic only when asked for (`security.basicAuth`): a browser then prompts, remembers the
    # password and sends it with every request to this host, cross-site ones included.
    # One challenge per header line: browsers ignore Basic when it shares a line.
    if offer_basic:
        response.headers.add("WWW-Authenticate", 'Basic realm="swaplab"')
    response.headers.add("WWW-Authenticate", 'Bearer realm="swaplab"')
    if request.body_exists and not request.content.is_eof():
        # Refused on its headers (no body is read before this check): the connection ends.
        # aiohttp drains what the client still sends for its lingering time, keeping none
        # of it (so the client can read this answer rather than a reset), then closes.
        response.force_close()
    return response
