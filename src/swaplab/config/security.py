"""The top-level `security:` section: who may call the router from a browser, and its limits.

`security.cors` is llama-swap's block (its #1133: `allowedOrigins`, `allowCredentials`,
`allowedMethods`, `allowedHeaders`, `exposedHeaders`, `maxAge`), with a safe default where
llama-swap's is wide open: same-origin and loopback origins only. The rest is swaplab's:
`allowedHosts` (the DNS-rebinding check), `trustedProxies` (whose `X-Forwarded-For` is
believed), `basicAuth` (whether a 401 offers Basic) and `limits` (time and size bounds on
what a client sends). docs/security.md explains each default.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace

from swaplab.config.yamlreader import YamlSection

DEFAULT_CORS_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
DEFAULT_CORS_MAX_AGE = 600

MIB = 1024 * 1024
DEFAULT_HEADER_TIMEOUT = 30.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_BODY_DEADLINE = 300.0
DEFAULT_WRITE_TIMEOUT = 60.0  # nginx's send_timeout
DEFAULT_MAX_BODY_MB = 256
DEFAULT_MAX_WEBSOCKET_MESSAGE_MB = 16
DEFAULT_LARGE_BODY_MB = 16
DEFAULT_MAX_LARGE_BODIES = 4
DEFAULT_MAX_HELD_BODIES_MB = 1024


@dataclass(frozen=True)
class Cors:
    """`security.cors`; `allowed_origins` adds to the origins always allowed (same-origin, loopback)."""

    allowed_origins: tuple[str, ...] = ()
    """Exact origins (`https://app.example:8443`, lower-cased, no trailing slash), or `*` for any."""
    allow_credentials: bool = False
    allowed_methods: tuple[str, ...] = DEFAULT_CORS_METHODS
    allowed_headers: tuple[str, ...] = ()
    """Empty: the names a preflight asks for, when each is a plain token (what llama-swap answers)."""
    exposed_headers: tuple[str, ...] = ()
    max_age: int = DEFAULT_CORS_MAX_AGE

    @property
    def any_origin(self) -> bool:
        return "*" in self.allowed_origins


@dataclass(frozen=True)
class Limits:
    """`security.limits`: how long and how much a client may take to send a request (and to read its answer)."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    """Seconds a connection may take to send a request's line and headers (and may sit idle between requests)."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds a request's body may go without a byte arriving."""
    body_deadline: float = DEFAULT_BODY_DEADLINE
    """Seconds a request's whole body may take, however steadily it trickles in."""
    write_timeout: float = DEFAULT_WRITE_TIMEOUT
    """Seconds a client may read nothing of its answer while bytes wait for it; then it is cut (`inflight`)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_MB * MIB
    max_websocket_message_bytes: int = DEFAULT_MAX_WEBSOCKET_MESSAGE_MB * MIB
    large_body_bytes: int = DEFAULT_LARGE_BODY_MB * MIB
    """A body past this (or of unknown length) needs one of `max_large_bodies` slots while it is read."""
    max_large_bodies: int = DEFAULT_MAX_LARGE_BODIES
    max_held_body_bytes: int = DEFAULT_MAX_HELD_BODIES_MB * MIB
    """Bytes of request bodies held at once, being read or read and not yet answered (`guard.HeldBodies`)."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Security:
    cors: Cors = field(default_factory=Cors)
    allowed_hosts: tuple[str, ...] = ()
    """Host names (lower-cased, no port) accepted besides loopback ones while listening on loopback; `*`: any."""
    trusted_proxies: tuple[Network, ...] = ()
    """Peers whose `X-Forwarded-For` names the client (in the request log); nobody's by default."""
    basic_auth: bool = False
    """Whether a 401 offers `Basic` (a browser then prompts, remembers it, and sends it cross-site)."""
    limits: Limits = field(default_factory=Limits)


def read_security(section: YamlSection | None) -> Security:
    """The `security:` section; absent: every default (docs/security.md)."""
    if section is None:
        return Security()
    cors = _read_cors(section.section("cors"))
    hosts = tuple(_host(section, item) for item in section.strings("allowedHosts"))
    proxies = tuple(network for item in section.strings("trustedProxies") if (network := _network(section, item)))
    basic_auth = section.boolean("basicAuth", False)
    limits = _read_limits(section.section("limits"))
    section.finish()
    return Security(cors, tuple(host for host in hosts if host), proxies, basic_auth, limits)


def _read_cors(section: YamlSection | None) -> Cors:
    if section is None:
        return Cors()
    origins = tuple(_origin(section, item) for item in section.strings("allowedOrigins"))
    methods = tuple(item.text.strip().upper() for item in section.strings("allowedMethods")) or DEFAULT_CORS_METHODS
    headers = tuple(item.text.strip() for item in section.strings("allowedHeaders"))
    exposed = tuple(item.text.strip() for item in section.strings("exposedHeaders"))
    cors = Cors(
        allowed_origins=tuple(origin for origin in origins if origin),
        allow_credentials=section.boolean("allowCredentials", False),
        allowed_methods=methods,
        allowed_headers=headers,
        exposed_headers=exposed,
        max_age=section.integer("maxAge", DEFAULT_CORS_MAX_AGE, minimum=0),
    )
    if cors.any_origin and cors.allow_credentials:
        section.findings.fault(
            section.entries["allowCredentials"].key_line,
            "security.cors.allowCredentials cannot be true with allowedOrigins '*': "
            "any web page could then send the user's credentials; list the origins instead",
        )
    section.finish()
    return cors


def _read_limits(section: YamlSection | None) -> Limits:
    if section is None:
        return Limits()

    def mib(key: str, default: int) -> int:
        value = section.number(key, float(default), unit="MiB")
        if value is not None and value <= 0:
            section.findings.fault(section.entries[key].key_line, f"{section.where(key)}: must be more than 0")
            return default * MIB
        return int((value if value is not None else default) * MIB)

    def seconds(key: str, default: float) -> float:
        value = section.number(key, default)
        if value is not None and value <= 0:
            section.findings.fault(section.entries[key].key_line, f"{section.where(key)}: must be more than 0 seconds")
            return default
        return default if value is None else value

    limits = Limits(
        header_timeout=seconds("headerTimeout", DEFAULT_HEADER_TIMEOUT),
        body_timeout=seconds("bodyTimeout", DEFAULT_BODY_TIMEOUT),
        body_deadline=seconds("bodyDeadline", DEFAULT_BODY_DEADLINE),
        write_timeout=seconds("writeTimeout", DEFAULT_WRITE_TIMEOUT),
        max_body_bytes=mib("maxBodyMB", DEFAULT_MAX_BODY_MB),
        max_websocket_message_bytes=mib("maxWebsocketMessageMB", DEFAULT_MAX_WEBSOCKET_MESSAGE_MB),
        large_body_bytes=mib("largeBodyMB", DEFAULT_LARGE_BODY_MB),
        max_large_bodies=section.integer("maxLargeBodies", DEFAULT_MAX_LARGE_BODIES, minimum=1),
        max_held_body_bytes=mib("maxHeldBodiesMB", DEFAULT_MAX_HELD_BODIES_MB),
    )
    if "maxHeldBodiesMB" not in section.entries:  # at least one body of the largest size the router takes
        limits = replace(limits, max_held_body_bytes=max(limits.max_held_body_bytes, limits.max_body_bytes))
    elif limits.max_held_body_bytes < limits.max_body_bytes:
        section.findings.fault(
            section.entries["maxHeldBodiesMB"].key_line,
            f"{section.where('maxHeldBodiesMB')} ({limits.max_held_body_bytes / MIB:g}) must be at least "
            f"maxBodyMB ({limits.max_body_bytes / MIB:g}): a body the router takes must fit in what it may hold",
        )
    section.finish()
    return limits


def _origin(section: YamlSection, item) -> str:
    """An origin as browsers send it: `scheme://host[:port]`, no path; `*` for any."""
    text = item.text.strip().rstrip("/").lower()
    if text == "*":
        return text
    scheme, separator, rest = text.partition("://")
    if not separator or scheme not in ("http", "https") or not rest or "/" in rest:
        section.findings.fault(
            item.line,
            f"security.cors.allowedOrigins: {item.text!r} is not an origin (scheme://host[:port], e.g. "
            "https://app.example), nor '*'",
        )
        return ""
    return text


def _host(section: YamlSection, item) -> str:
    """A host name or address as a `Host` header carries it, without its port; `*` for any."""
    text = item.text.strip().lower()
    if text != "*" and (not text or "/" in text or " " in text or "://" in text):
        section.findings.fault(
            item.line, f"security.allowedHosts: {item.text!r} is not a host name (e.g. mybox.lan), nor '*'"
        )
        return ""
    return text


def _network(section: YamlSection, item) -> Network | None:
    try:
        return ipaddress.ip_network(item.text.strip(), strict=False)
    except ValueError:
        section.findings.fault(
            item.line, f"security.trustedProxies: {item.text!r} is not an address or network (e.g. 10.0.0.0/8)"
        )
        return None
