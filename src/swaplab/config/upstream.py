"""What a model and a peer both say about their upstream: its URL, request filters, timeouts."""

from __future__ import annotations

from urllib.parse import urlsplit

from swaplab.config.model import Filters, Timeouts
from swaplab.config.tree import to_plain
from swaplab.config.yamlreader import YamlSection, shown

PROTECTED_PARAMS = ("model",)
"""Request parameters filters may neither strip nor set: routing depends on them."""


def is_http_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def read_filters(owner: YamlSection, legacy_names: bool) -> Filters:
    """`filters:` of a model (which may still spell it `strip_params`) or of a peer."""
    section = owner.section("filters")
    if section is None:
        return Filters()
    strip = _strip_params(section, "stripParams")
    if legacy_names and not strip:
        strip = _strip_params(section, "strip_params")
    set_item = section.mapping("setParams")
    set_params = to_plain(set_item) if set_item is not None else {}
    for name in PROTECTED_PARAMS:
        if name in set_params:
            del set_params[name]
            section.findings.warn(
                set_item.value[name].key_line, f"{section.where('setParams')}.{name}: '{name}' cannot be set; ignored"
            )
    section.finish()
    return Filters(strip_params=strip, set_params=set_params)


def _strip_params(section: YamlSection, key: str) -> tuple[str, ...]:
    entry = section.entry(key)
    if entry is None:
        return ()
    if entry.item.is_sequence:
        names = [item.text for item in section.strings(key)]
    elif entry.item.is_scalar:
        names = entry.item.text.split(",")
    else:
        section.fault(entry, f"expected a comma-separated string or a list, got {shown(entry.item)}")
        return ()
    # llama-swap's sanitising: trimmed, deduplicated, sorted, `model` never stripped.
    return tuple(sorted({name.strip() for name in names} - {"", *PROTECTED_PARAMS}))


def read_timeouts(owner: YamlSection, response_header: float | None) -> Timeouts:
    """`timeouts:` in seconds, 0 meaning no limit."""
    # llama-swap's defaults (Go's http.DefaultTransport).
    defaults = Timeouts(connect=30.0, response_header=response_header, idle_conn=90.0)
    section = owner.section("timeouts")
    if section is None:
        return defaults

    def read(key: str, default: float | None) -> float | None:
        value = section.number(key, default)
        return None if value == 0 else value

    timeouts = Timeouts(
        connect=read("connect", defaults.connect),
        response_header=read("responseHeader", defaults.response_header),
        idle_conn=read("idleConn", defaults.idle_conn),
    )
    section.finish()
    return timeouts
