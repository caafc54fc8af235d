"""What the server records and prints: logging, the activity store, captures, the UI's session
headers and performance sampling (`logToStdout`, `logTimeFormat`, `logRequests`,
`metricsMaxInMemory`, `captureBuffer`, `store`, `ui`, `performance`), read as llama-swap reads them."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from swaplab.config.tree import Item
from swaplab.config.yamlreader import YamlSection, shown

LOG_DESTINATIONS = ("proxy", "upstream", "both", "none")
LOG_TIME_FORMATS = (
    "ansic", "unixdate", "rubydate", "rfc822", "rfc822z", "rfc850", "rfc1123", "rfc1123z",
    "rfc3339", "rfc3339nano", "kitchen", "stamp", "stampmilli", "stampmicro", "stampnano",
)  # fmt: skip
"""llama-swap's names for Go's time layouts (case-insensitive); "" = swaplab's own time (llama-swap's: none)."""
NO_TIME = "none"
"""swaplab's `logTimeFormat` for console lines without a time (llama-swap's "")."""
DEFAULT_SESSION_HEADERS = ("X-Session-ID", "X-Litellm-Session-Id")
DEFAULT_METRICS_MAX_IN_MEMORY = 1000
DEFAULT_CAPTURE_BUFFER_MB = 5
DEFAULT_PERFORMANCE_EVERY = 5.0
MINIMUM_PERFORMANCE_EVERY = 5.0
GO_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
GO_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Telemetry:
    log_time_format: str = ""
    log_to_stdout: str = "proxy"
    log_requests: bool = False
    metrics_max_in_memory: int = DEFAULT_METRICS_MAX_IN_MEMORY
    capture_buffer_mb: int = DEFAULT_CAPTURE_BUFFER_MB
    store_path: str | None = None
    session_id_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    performance_disabled: bool = False
    performance_every: float = DEFAULT_PERFORMANCE_EVERY


def read_telemetry(top: YamlSection) -> Telemetry:
    """The logging, store, capture, UI and performance settings, llama-swap's defaults applied."""
    log_time_format = top.string("logTimeFormat").strip()
    if log_time_format and log_time_format.lower() not in (*LOG_TIME_FORMATS, NO_TIME):
        top.findings.warn(
            top.entries["logTimeFormat"].key_line,
            f"logTimeFormat '{log_time_format}' is not one of {', '.join(LOG_TIME_FORMATS)}; "
            f"logs carry no timestamp (as in llama-swap)",
        )
        log_time_format = NO_TIME
    log_to_stdout = top.string("logToStdout", "proxy")
    if log_to_stdout not in LOG_DESTINATIONS:
        top.findings.fault(
            top.entries["logToStdout"].key_line, f"logToStdout must be one of: {', '.join(LOG_DESTINATIONS)}"
        )
        log_to_stdout = "proxy"
    metrics = top.integer("metricsMaxInMemory", DEFAULT_METRICS_MAX_IN_MEMORY)
    performance = _performance(top)
    return Telemetry(
        log_time_format=log_time_format.lower(),
        log_to_stdout=log_to_stdout,
        log_requests=top.boolean("logRequests", False),
        metrics_max_in_memory=metrics if metrics > 0 else DEFAULT_METRICS_MAX_IN_MEMORY,
        capture_buffer_mb=max(0, top.integer("captureBuffer", DEFAULT_CAPTURE_BUFFER_MB)),
        store_path=_store_path(top),
        session_id_headers=_session_headers(top),
        performance_disabled=performance[0],
        performance_every=performance[1],
    )


def _store_path(top: YamlSection) -> str | None:
    """`store.path`, checked as llama-swap checks it at load: the file swaplab itself will write.

    Relative to the working directory, as in llama-swap. A `store` block without a path is a fault.
    """
    section = top.section("store")
    if section is None:
        return None
    path = section.string("path")
    line = section.entries["path"].key_line if "path" in section.entries else top.entries["store"].key_line
    section.finish()
    problem = store_path_problem(path)
    if problem is not None:
        top.findings.fault(line, problem)
        return None
    return path


def store_path_problem(path: str) -> str | None:
    """llama-swap's objection to a store path (load_posix.go validateStorePath), or None."""
    if not path.strip():
        return "store.path must not be empty"
    if os.path.isdir(path):
        return f"store.path: {path} is a directory, not a file"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else f"store.path: {path} is not writable: permission denied"
    directory = os.path.dirname(path) or "."
    if not os.access(directory, os.W_OK):
        reason = "permission denied" if os.path.isdir(directory) else "no such directory"
        return f"store.path: directory {directory} is not writable: {reason}"
    return None


def _session_headers(top: YamlSection) -> tuple[str, ...]:
    """`ui.activity.session_id`: trimmed, blanks dropped, deduplicated ignoring case (the first
    spelling kept); `[]` or null disables it, absent is the default pair."""
    ui = top.section("ui")
    if ui is None:
        return DEFAULT_SESSION_HEADERS
    activity = ui.section("activity")
    ui.finish()
    if activity is None:
        return DEFAULT_SESSION_HEADERS
    entry = activity.entries.get("session_id")
    headers = DEFAULT_SESSION_HEADERS
    if entry is not None:
        items = activity.strings("session_id") if entry.item.value is not None else []
        activity.read_keys.add("session_id")
        headers = _normalised_headers(items)
    activity.finish()
    return headers


def _normalised_headers(items: list[Item]) -> tuple[str, ...]:
    headers: list[str] = []
    seen: set[str] = set()
    for item in items:
        name = item.text.strip()
        if name and name.lower() not in seen:
            seen.add(name.lower())
            headers.append(name)
    return tuple(headers)


def _performance(top: YamlSection) -> tuple[bool, float]:
    """`performance.disabled` and `performance.every` (a Go duration such as `15s` or `1m30s`, at least 5 s)."""
    section = top.section("performance")
    if section is None:
        return False, DEFAULT_PERFORMANCE_EVERY
    disabled = section.boolean("disabled", False)
    every = DEFAULT_PERFORMANCE_EVERY
    entry = section.entry("every")
    if entry is not None:
        try:
            every = go_duration(entry.item)
        except (TypeError, ValueError) as error:
            section.fault(entry, f"expected a duration such as 15s or 1m30s, got {shown(entry.item)} ({error})")
        else:
            if every == 0:  # llama-swap's "not set"
                every = DEFAULT_PERFORMANCE_EVERY
            elif every < MINIMUM_PERFORMANCE_EVERY:
                section.findings.fault(
                    entry.key_line, f"performance: every must be at least 5s, got {entry.item.text}"
                )
                every = DEFAULT_PERFORMANCE_EVERY
    section.finish()
    return disabled, every


def go_duration(item: Item) -> float:
    """Seconds in a Go duration string (`1h30m`, `90s`, `1.5m`, `0`), as time.ParseDuration reads it.

    A bare number other than 0 is refused, as yaml.v3 refuses it for a time.Duration.
    """
    text = item.value
    if not isinstance(text, str):
        if item.value == 0 and not isinstance(item.value, bool):
            return 0.0
        raise TypeError("a duration needs a unit")
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    if not body:
        raise ValueError("empty duration")
    seconds, position = 0.0, 0
    while position < len(body):
        match = GO_DURATION.match(body, position)
        if match is None or match.group(1) in ("", "."):
            raise ValueError("not a Go duration")
        seconds += float(match.group(1)) * GO_DURATION_UNITS[match.group(2)]
        position = match.end()
    return -seconds if text.startswith("-") else seconds
