"""Who may call the router from where: the Host check (DNS rebinding) and the Origin policy (CORS).

One pure decision, `decide`, over plain facts of a request (`Facts`) and the config's
`security:` (`config.security.Security`); `security_middleware` in `router/limits.py` applies it
to every request before any handler or key check runs, and handlers never re-check it.

- **Host**: while the router listens on a loopback address (or whenever
  `security.allowedHosts` is set), a request whose `Host` is a name other than a loopback
  one (`localhost`, `*.localhost`) or an allowed host is refused 403; an address is always
  accepted, since rebinding needs a name. A page on `attacker.example` rebound to 127.0.0.1
  still sends `Host: attacker.example`, so it never reads a byte.
- **Origin**: a browser's request carries `Origin` (and `Sec-Fetch-Site`). Same-origin,
  loopback origins (`http://localhost:3000`, as Ollama allows) and `security.cors.allowedOrigins`
  are allowed, and get CORS headers; any other origin is refused 403 on whatever changes
  state (every method but GET and HEAD, GETs that start or stop models, websocket upgrades)
  and gets no CORS grant for reads, so its page cannot read the answer.
- **Preflights** (`OPTIONS` with `Access-Control-Request-Method`) are answered here by the
  same policy, Private Network Access included, and never forwarded nor asked for a key.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlsplit

from swaplab.config.security import Security

READ_METHODS = frozenset({"GET", "HEAD"})
STATE_CHANGING_GETS = ("/unload", "/props", "/v1/audio/voices", "/sdapi/v1/loras")
"""GET routes that start or stop a model (the model GET routes start theirs)."""
STATE_CHANGING_GET_PREFIXES = ("/upstream/",)
"""Forwarded to a model's own server as they come: a GET there may start the model, or change it."""
TOKEN = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Facts:
    """What the policy reads of a request: its method, path and the headers a browser controls."""

    method: str
    path: str
    host: str | None = None
    origin: str | None = None
    fetch_site: str | None = None
    """`Sec-Fetch-Site` (`cross-site`, `same-site`, `same-origin`, `none`), which every current browser sends."""
    preflight_method: str | None = None
    """`Access-Control-Request-Method`, on an OPTIONS preflight."""
    preflight_headers: str = ""
    """`Access-Control-Request-Headers`, on a preflight."""
    private_network: bool = False
    """`Access-Control-Request-Private-Network: true` (Chrome's Private Network Access preflight)."""
    upgrade: bool = False
    """A websocket upgrade."""
    listen_loopback: bool = True
    """Whether the router listens on a loopback address only."""


class Caller(Enum):
    """Where a request comes from, as far as a browser tells."""

    NO_BROWSER = "no browser origin"  # no Origin and no cross-site Sec-Fetch-Site: a client, curl, a navigation
    SAME_ORIGIN = "same origin"
    ALLOWED = "allowed origin"
    FOREIGN = "foreign origin"


@dataclass(frozen=True)
class Verdict:
    """`status` 0: the request goes on, `headers` added to its response; else it is answered now."""

    status: int = 0
    message: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    caller: Caller = Caller.NO_BROWSER

    @property
    def goes_on(self) -> bool:
        return self.status == 0


def decide(facts: Facts, security: Security) -> Verdict:
    """The Host check, then the Origin policy; a preflight is answered here either way."""
    refused = _host_refusal(facts, security)
    if refused is not None:
        return Verdict(403, refused)
    caller = classify(facts, security)
    cors = security.cors
    is_preflight = facts.method == "OPTIONS" and facts.origin is not None and facts.preflight_method is not None
    if is_preflight:
        if caller is Caller.FOREIGN:
            return Verdict(403, _origin_refusal(facts), caller=caller)
        headers = [
            *_grant(facts.origin or "", security),
            ("Access-Control-Allow-Methods", ", ".join(cors.allowed_methods)),
            ("Access-Control-Allow-Headers", _allowed_headers(facts.preflight_headers, security)),
            ("Access-Control-Max-Age", str(cors.max_age)),
        ]
        if facts.private_network:
            headers.append(("Access-Control-Allow-Private-Network", "true"))
        return Verdict(204, headers=tuple(headers), caller=caller)
    if caller is Caller.FOREIGN:
        if changes_state(facts):
            return Verdict(403, _origin_refusal(facts), caller=caller)
        return Verdict(caller=caller)  # a read goes on, with no grant: the page cannot read it
    if caller is Caller.ALLOWED:
        headers = list(_grant(facts.origin or "", security))
        if cors.exposed_headers:
            headers.append(("Access-Control-Expose-Headers", ", ".join(cors.exposed_headers)))
        return Verdict(headers=tuple(headers), caller=caller)
    return Verdict(caller=caller)


def changes_state(facts: Facts) -> bool:
    """Whether a request may change the router's state: anything but a plain read."""
    if facts.upgrade or facts.method not in READ_METHODS:
        return True
    return facts.path in STATE_CHANGING_GETS or facts.path.startswith(STATE_CHANGING_GET_PREFIXES)


def classify(facts: Facts, security: Security) -> Caller:
    origin = facts.origin
    if origin is None:
        # A no-cors GET (an <img>, a form) sends no Origin, but says it is cross-site.
        return Caller.FOREIGN if (facts.fetch_site or "").lower() == "cross-site" else Caller.NO_BROWSER
    normalized = origin.strip().lower().rstrip("/")
    parts = _origin_parts(normalized)
    if parts is None:  # "null" (a sandboxed frame, a file), or garbage
        return Caller.FOREIGN
    scheme, host, port = parts
    if facts.host is not None and _same_authority(host, port, facts.host, scheme):
        return Caller.SAME_ORIGIN
    if is_loopback_host(host):
        return Caller.ALLOWED
    cors = security.cors
    if cors.any_origin or normalized in cors.allowed_origins or _with_default_port(scheme, host, port) in cors.allowed_origins:
        return Caller.ALLOWED
    return Caller.FOREIGN


@functools.lru_cache(maxsize=1024)  # every request asks, about the same few names
def is_loopback_host(host: str) -> bool:
    """`localhost`, a `*.localhost` name (RFC 6761: always loopback), or a loopback address."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_listen(host: str) -> bool:
    """Whether `--listen HOST` is loopback only (0.0.0.0 and :: are every address, so not)."""
    return is_loopback_host(host)


@functools.lru_cache(maxsize=1024)
def split_host(header: str) -> tuple[str, int | None]:
    """A `Host` header's name (lower-cased, brackets of IPv6 kept off) and port."""
    header = header.strip().lower()
    if header.startswith("["):
        name, _, rest = header[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif header.count(":") == 1:
        name, _, port_text = header.partition(":")
    else:
        name, port_text = header, ""
    port = int(port_text) if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 else None
    return name.rstrip("."), port


@functools.lru_cache(maxsize=1024)
def _is_address(name: str) -> bool:
    """An address written as such: no DNS answer stands behind it, so no rebinding either."""
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _host_refusal(facts: Facts, security: Security) -> str | None:
    allowed = security.allowed_hosts
    if facts.host is None or "*" in allowed or not (facts.listen_loopback or allowed):
        return None
    name, _ = split_host(facts.host)
    if is_loopback_host(name) or _is_address(name) or name in allowed:
        return None
    shown = facts.host.encode("ascii", "backslashreplace").decode()[:200]
    return (
        f"Host {shown!r} is not a name of this router: it answers loopback names only (a web page "
        "could reach it through DNS rebinding otherwise). To use it under that name, add it to "
        "security.allowedHosts in the config."
    )


def _origin_refusal(facts: Facts) -> str:
    origin = (facts.origin or "(a cross-site page)").encode("ascii", "backslashreplace").decode()[:200]
    return (
        f"origin {origin!r} may not {'open a websocket on' if facts.upgrade else 'change'} this router "
        "(only same-origin and loopback pages may); to allow that site, add it to "
        "security.cors.allowedOrigins in the config."
    )


def _grant(origin: str, security: Security) -> tuple[tuple[str, str], ...]:
    headers = [("Access-Control-Allow-Origin", origin.strip()), ("Vary", "Origin")]
    if security.cors.allow_credentials:
        headers.append(("Access-Control-Allow-Credentials", "true"))
    return tuple(headers)


def _allowed_headers(requested: str, security: Security) -> str:
    """The configured list, else the requested names when each is a plain token (never echo other text)."""
    configured = security.cors.allowed_headers
    if configured:
        return ", ".join(configured)
    names = [name.strip() for name in requested.split(",") if name.strip()]
    return ", ".join(names) if names and all(TOKEN.match(name) for name in names) else ""


def _origin_parts(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, its port filled in; None for `null` or anything else."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path or parts.query or parts.username:
        return None
    return parts.scheme, parts.hostname, port if port is not None else DEFAULT_PORTS[parts.scheme]


def _same_authority(host: str, port: int, host_header: str, scheme: str) -> bool:
    name, header_port = split_host(host_header)
    return name.strip("[]") == host.strip("[]") and (header_port or DEFAULT_PORTS[scheme]) == port


def _with_default_port(scheme: str, host: str, port: int) -> str:
    shown_host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown_host}" if port == DEFAULT_PORTS[scheme] else f"{scheme}://{shown_host}:{port}"
