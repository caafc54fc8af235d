"""How the router's log lines look: llama-swap's `logTimeFormat` layouts and its one-line request log.

Every line `swaplab serve` prints starts with the time. `logTimeFormat` names one of Go's
time layouts (`rfc3339`, `kitchen`, `stampmilli`, ..., case-insensitive), and swaplab prints
the time as Go would; unset (or `""`) it is swaplab's `2026-12-07 17:40:22`, local time
(llama-swap prints none then), and `none` prints none. `logRequests: true` turns on one
line per request in llama-swap's access-log format.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import re
from collections.abc import Callable, Sequence

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from swaplab.config.security import Network

# llama-swap.go's table: name -> Go layout.
LAYOUTS = {
    "ansic": "Mon Jan _2 15:04:05 2006",
    "unixdate": "Mon Jan _2 15:04:05 MST 2006",
    "rubydate": "Mon Jan 02 15:04:05 -0700 2006",
    "rfc822": "02 Jan 06 15:04 MST",
    "rfc822z": "02 Jan 06 15:04 -0700",
    "rfc850": "Monday, 02-Jan-06 15:04:05 MST",
    "rfc1123": "Mon, 02 Jan 2006 15:04:05 MST",
    "rfc1123z": "Mon, 02 Jan 2006 15:04:05 -0700",
    "rfc3339": "2006-01-02T15:04:05Z07:00",
    "rfc3339nano": "2006-01-02T15:04:05.999999999Z07:00",
    "kitchen": "3:04PM",
    "stamp": "Jan _2 15:04:05",
    "stampmilli": "Jan _2 15:04:05.000",
    "stampmicro": "Jan _2 15:04:05.000000",
    "stampnano": "Jan _2 15:04:05.000000000",
}
DEFAULT_LAYOUT = "2006-01-02 15:04:05"
"""The console's time when `logTimeFormat` is unset or "": local time to the second, as Go's layout."""
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def layout_of(name: str) -> str | None:
    """The Go layout `logTimeFormat` names (trimmed, any case): `DEFAULT_LAYOUT` for "" (unset);
    None, no time, for `none` or a name llama-swap does not know (the config warns of those)."""
    name = name.strip().lower()
    return LAYOUTS.get(name) if name else DEFAULT_LAYOUT


def _offset(when: datetime.datetime, colon: bool, zulu: bool) -> str:
    offset = when.utcoffset() or datetime.timedelta(0)
    if zulu and not offset:
        return "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}" if colon else f"{sign}{hours:02d}{minutes:02d}"


def _tokens(when: datetime.datetime, nanosecond: int) -> list[tuple[str, str]]:
    """Go's layout elements, longest first, each with its text for `when`."""
    hour12 = when.hour % 12 or 12
    fraction = f"{nanosecond:09d}"
    return [
        ("Z07:00", _offset(when, colon=True, zulu=True)),
        ("-0700", _offset(when, colon=False, zulu=False)),
        (".999999999", ("." + fraction).rstrip("0").rstrip(".")),
        (".000000000", "." + fraction),
        (".000000", "." + fraction[:6]),
        (".000", "." + fraction[:3]),
        ("January", _MONTHS[when.month - 1]),
        ("Monday", _DAYS[when.weekday()]),
        ("2006", f"{when.year:04d}"),
        ("MST", when.tzname() or _offset(when, colon=False, zulu=False)),
        ("Jan", _MONTHS[when.month - 1][:3]),
        ("Mon", _DAYS[when.weekday()][:3]),
        ("_2", f"{when.day:2d}"),
        ("01", f"{when.month:02d}"),
        ("02", f"{when.day:02d}"),
        ("06", f"{when.year % 100:02d}"),
        ("15", f"{when.hour:02d}"),
        ("03", f"{hour12:02d}"),
        ("04", f"{when.minute:02d}"),
        ("05", f"{when.second:02d}"),
        ("PM", "PM" if when.hour >= 12 else "AM"),
        ("3", str(hour12)),
    ]


def format_go_time(layout: str, when: datetime.datetime, nanosecond: int | None = None) -> str:
    """`when` written by Go's `time.Format(layout)`, for the elements llama-swap's layouts use."""
    tokens = _tokens(when, when.microsecond * 1000 if nanosecond is None else nanosecond)
    out: list[str] = []
    position = 0
    while position < len(layout):
        for token, text in tokens:
            if layout.startswith(token, position):
                out.append(text)
                position += len(token)
                break
        else:
            out.append(layout[position])
            position += 1
    return "".join(out)


def console_time(log_time_format: str, created: float) -> str:
    """What a console line written at `created` (a Unix time) starts with: its local time in the
    layout `logTimeFormat` names, and a space; "" when it names none."""
    layout = layout_of(log_time_format)
    if layout is None:
        return ""
    return format_go_time(layout, datetime.datetime.fromtimestamp(created).astimezone()) + " "


class GoTimeFormatter(logging.Formatter):
    """swaplab's log line (`LEVEL logger: message`) after its time (`console_time`)."""

    def __init__(self, log_time_format: str):
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.log_time_format = log_time_format

    def format(self, record: logging.LogRecord) -> str:
        return console_time(self.log_time_format, record.created) + super().format(record)


def console_formatter(log_time_format: str) -> logging.Formatter:
    """The console's formatter: the time in the layout `logTimeFormat` names (`layout_of`)."""
    return GoTimeFormatter(log_time_format)


def go_duration(seconds: float) -> str:
    """A duration as Go's `%v` writes it (`1.5s`, `12.345ms`, `850µs`, `0s`)."""
    nanoseconds = round(seconds * 1e9)
    if nanoseconds == 0:
        return "0s"
    sign = "-" if nanoseconds < 0 else ""
    nanoseconds = abs(nanoseconds)
    if nanoseconds < 1_000:
        return f"{sign}{nanoseconds}ns"
    if nanoseconds < 1_000_000:
        return f"{sign}{_trim(nanoseconds / 1_000)}µs"
    if nanoseconds < 1_000_000_000:
        return f"{sign}{_trim(nanoseconds / 1_000_000)}ms"
    whole, rest = divmod(nanoseconds, 1_000_000_000)
    hours, whole = divmod(whole, 3600)
    minutes, whole = divmod(whole, 60)
    text = f"{_trim(whole + rest / 1e9)}s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return sign + text


def _trim(value: float) -> str:
    return f"{value:.9f}".rstrip("0").rstrip(".")


# Polled often; llama-swap leaves them out of the request log.
UNLOGGED_PREFIXES = ("/wol-health", "/api/performance", "/metrics")


class RequestLog(AbstractAccessLogger):
    """`logRequests: true`: one line per request, as llama-swap's request log writes it:
    `Request IP "METHOD PATH PROTO" STATUS BYTES "USER-AGENT" DURATION`.

    PATH is the path as the client sent it, still percent-encoded, without its query (whose
    values may be keys), control characters escaped: a `%0a` or a raw newline cannot forge a
    line, nor an escape sequence reach a terminal. IP is the peer's address, or the client a
    trusted proxy names (`security.trustedProxies`, `client_address`). aiohttp makes one per
    connection from the class alone: `request_log` binds the config to a subclass.
    """

    @staticmethod
    def trusted_proxies() -> Sequence[Network]:
        return ()

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if request.path.startswith(UNLOGGED_PREFIXES):
            return
        version = f"HTTP/{request.version.major}.{request.version.minor}"
        address = client_address(
            request.remote or "", request.headers.get("X-Forwarded-For"), request.headers.get("X-Real-IP"),
            self.trusted_proxies(),
        )
        self.logger.info(
            'Request %s "%s %s %s" %d %d "%s" %s', log_safe(address), log_safe(request.method),
            log_safe(request.raw_path.partition("?")[0]), version, response.status, response.body_length,
            log_safe(request.headers.get("User-Agent", "")), go_duration(time),
        )


def request_log(trusted_proxies: Callable[[], Sequence[Network]]) -> type[RequestLog]:
    """`RequestLog` believing `X-Forwarded-For` from the peers `trusted_proxies()` names (read per request, so a
    reload counts)."""
    return type("RequestLog", (RequestLog,), {"trusted_proxies": staticmethod(trusted_proxies)})


_UNSAFE = re.compile(r'[\x00-\x1f\x7f-\x9f"\\\u2028\u2029]')
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}


def log_safe(text: str) -> str:
    """`text` fit for one log line inside quotes: control characters as `\\n`, `\\x1b`, ...; `"` and `\\` escaped."""
    return _UNSAFE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    character = match.group(0)
    if character in _ESCAPES:
        return _ESCAPES[character]
    return f"\\x{ord(character):02x}" if ord(character) < 0x100 else f"\\u{ord(character):04x}"


def client_address(
    peer: str, forwarded_for: str | None, real_ip: str | None, trusted_proxies: Sequence[Network]
) -> str:
    """The client's address: the peer's, unless the peer is a trusted proxy.

    A trusted proxy's `X-Forwarded-For` is read from its right end (the hop it appended), each
    hop believed only while the one after it is trusted too, so a client cannot name itself by
    sending a header of its own; without one, a trusted proxy's `X-Real-IP`. A hop that is not
    an address ends the walk at the last one that was.
    """
    if not _trusted(peer, trusted_proxies):
        return peer
    hops = [hop.strip() for hop in (forwarded_for or "").split(",") if hop.strip()]
    if not hops and real_ip and _address(real_ip.strip()) is not None:
        return real_ip.strip()
    address = peer
    for hop in reversed(hops):
        if _address(hop) is None:
            break
        address = hop
        if not _trusted(hop, trusted_proxies):
            break
    return address


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(text: str, trusted_proxies: Sequence[Network]) -> bool:
    address = _address(text)
    return address is not None and any(address in network for network in trusted_proxies)
