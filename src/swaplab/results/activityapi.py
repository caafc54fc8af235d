"""llama-swap's activity API over swaplab's activity table: `GET /api/metrics/activity` and `GET /api/metrics/stats`.

Pure queries (no HTTP): the router calls them in a thread and answers an
`ActivityQueryError` (a `ValueError`) with a 400 carrying its message, which is
llama-swap's own. The shapes are llama-swap's at 0bdb372
(tests/fixtures/llama-swap-api/README.md), so its web UI reads swaplab unchanged.

A record has llama-swap's fields under llama-swap's names, with llama-swap's values
derived from swaplab's columns:

    id, timestamp (whole seconds, local offset), model, req_path (`path`),
    resp_content_type ("" when unknown), resp_status_code (`status`),
    tokens {cache_tokens, draft_tokens, draft_acc_tokens, input_tokens, output_tokens,
    prompt_per_second, tokens_per_second}, duration_ms (whole ms), has_capture,
    error_msg (omitted when none), metadata (omitted when none)

and beside them, never in their place, what swaplab knows that llama-swap does not,
under swaplab's column names and with swaplab's values (None where unknown):

    time (unix seconds, fractional), requested_model, peer, ttft_ms,
    client_disconnected, session_id, capture_id, waited_for

`timestamp` is when swaplab received the request (its `time`), llama-swap's is when the
response finished. The stats add `ttft_histogram` and `duration_histogram` beside
llama-swap's two, in the same shape.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from swaplab.errors import SwaplabError
from swaplab.results.activity import Database, opened
from swaplab.results.stats import percentile
from swaplab.results.store import default_path

DEFAULT_LIMIT = 25
MAX_LIMIT = 999
HISTOGRAM_PERCENTILES = (50, 95, 99)
MIN_BINS, MAX_BINS = 5, 20

# llama-swap's values, as SQL over swaplab's columns, so that a page sorts by exactly
# what it shows and ties fall to the id as they do in llama-swap.
#
# The token rule (llama-swap's server/metrics.go:320-353,434-496): when nothing of the
# upstream's accounting was read (an error, an empty or non-JSON body) every token value
# is 0. When something was read (any of swaplab's seven accounting columns is known),
# each unknown cache_tokens, draft_tokens, draft_acc_tokens, prompt_per_second and
# tokens_per_second is -1, while an unknown input_tokens or output_tokens stays 0
# (llama-swap never reports those as -1).
_ACCOUNTED = (
    "COALESCE(prompt_tokens, completion_tokens, cached_tokens, prompt_per_second, tokens_per_second, "
    "draft_tokens, draft_accepted_tokens) IS NOT NULL"
)
_UNKNOWN = f"(CASE WHEN {_ACCOUNTED} THEN -1 ELSE 0 END)"
TOKENS: dict[str, str] = {  # in llama-swap's order
    "cache_tokens": f"COALESCE(cached_tokens, {_UNKNOWN})",
    "draft_tokens": f"COALESCE(draft_tokens, {_UNKNOWN})",
    "draft_acc_tokens": f"COALESCE(draft_accepted_tokens, {_UNKNOWN})",
    "input_tokens": "COALESCE(prompt_tokens, 0)",
    "output_tokens": "COALESCE(completion_tokens, 0)",
    "prompt_per_second": f"COALESCE(prompt_per_second, {_UNKNOWN})",
    "tokens_per_second": f"COALESCE(tokens_per_second, {_UNKNOWN})",
}
_RATES = frozenset({"prompt_per_second", "tokens_per_second"})
_SECOND = "CAST(time AS INTEGER)"  # llama-swap keeps whole seconds
_CONTENT_TYPE = "COALESCE(resp_content_type, '')"
_DURATION = "CAST(duration_ms AS INTEGER)"  # llama-swap keeps whole milliseconds

# llama-swap's sort keys (its UI's column ids), each to the value it orders by.
SORT_KEYS: dict[str, str] = {
    "id": "id",
    "time": _SECOND,
    "model": "model",
    "req_path": "path",
    "resp_status_code": "status",
    "resp_content_type": _CONTENT_TYPE,
    "cached": TOKENS["cache_tokens"],
    "prompt": TOKENS["input_tokens"],
    "generated": TOKENS["output_tokens"],
    "drafted": TOKENS["draft_tokens"],
    "prompt_speed": TOKENS["prompt_per_second"],
    "gen_speed": TOKENS["tokens_per_second"],
    "duration": _DURATION,
}

_SELECT = ", ".join([
    "id", f"{_SECOND} AS api_second", "model", "path", f"{_CONTENT_TYPE} AS api_content_type", "status",
    *(f"{expression} AS api_{name}" for name, expression in TOKENS.items()),
    f"{_DURATION} AS api_duration_ms", "capture_id", "error", "metadata",
    "time", "requested_model", "peer", "ttft_ms", "client_disconnected", "session_id", "waited_for",
])

_TOTALS = (
    f"SELECT COUNT(*), COALESCE(SUM({TOKENS['input_tokens']}), 0), COALESCE(SUM({TOKENS['output_tokens']}), 0),"
    f" COALESCE(SUM(MAX({TOKENS['cache_tokens']}, 0)), 0) FROM activity"  # a -1 must not subtract
)

# Go's time.Parse(time.RFC3339, ...): ASCII digits, an upper-case T and Z, a fraction of
# any length after a point or a comma.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))", re.ASCII
)
_GO_INTEGER = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi takes
_GO_INT_MAX = 2**63 - 1


class QueryParameterError(SwaplabError, ValueError):
    """A query parameter (or a path's id) that its route cannot take, answered 400; the message says which and why."""


class ActivityQueryError(QueryParameterError):
    """A query parameter llama-swap answers with 400; the message is llama-swap's."""


@dataclass(frozen=True, slots=True)
class Instant:
    """A parsed RFC 3339 time: whole unix seconds and the nanoseconds after them."""

    seconds: int
    nanoseconds: int = 0


@dataclass(frozen=True, slots=True)
class ActivityQuery:
    """The parameters of one `GET /api/metrics/activity`, checked."""

    models: tuple[str, ...] = ()
    start: Instant | None = None
    end: Instant | None = None
    min_id: int | None = None
    max_id: int | None = None
    limit: int = DEFAULT_LIMIT
    page: int = 1
    sort: str = "id"
    order: str = "desc"


QueryParameters = Mapping[str, str | Sequence[str]]


def parse_activity_query(query: QueryParameters) -> ActivityQuery:
    """The checked parameters, in llama-swap's order of checks; ActivityQueryError with its message when one is bad."""
    models = tuple(model for model in (value.strip() for value in _values(query, "model")) if model)
    start = _instant(query, "start")
    end = _instant(query, "end")
    if start is not None and end is not None and (start.seconds, start.nanoseconds) > (end.seconds, end.nanoseconds):
        raise ActivityQueryError("start must be before end")
    min_id = _row_id(query, "min_id")
    max_id = _row_id(query, "max_id")
    if min_id is not None and max_id is not None and min_id > max_id:
        raise ActivityQueryError("min_id must be <= max_id")
    limit = DEFAULT_LIMIT
    if raw := _first(query, "limit"):
        parsed = _go_integer(raw)
        if parsed is None:
            raise ActivityQueryError("invalid limit")
        if not 1 <= parsed <= MAX_LIMIT:
            raise ActivityQueryError(f"limit must be between 1 and {MAX_LIMIT}")
        limit = parsed
    page = 1
    if raw := _first(query, "page"):
        parsed = _go_integer(raw)
        if parsed is None or parsed < 1:
            raise ActivityQueryError("page must be >= 1")
        page = parsed
    sort = _first(query, "sort") or "id"
    if sort not in SORT_KEYS:
        raise ActivityQueryError("invalid sort column")
    order = _first(query, "order").lower() or "desc"
    if order not in ("asc", "desc"):
        raise ActivityQueryError("order must be asc or desc")
    return ActivityQuery(models, start, end, min_id, max_id, limit, page, sort, order)


def activity_page(
    db: Database, query: QueryParameters, has_capture: Callable[[int], bool] | None = None
) -> dict[str, Any]:
    """llama-swap's `GET /api/metrics/activity` page; `has_capture(capture_id)` says whether a capture is still kept.

    `db` is a path, an open connection, or None for the default store.
    """
    checked = parse_activity_query(query)
    where, parameters = _where(checked)
    direction = "ASC" if checked.order == "asc" else "DESC"
    order_by = f" ORDER BY {SORT_KEYS[checked.sort]} {direction}"
    if checked.sort != "id":
        order_by += f", id {direction}"
    offset = (checked.page - 1) * checked.limit
    with opened(db) as connection:
        total = connection.execute(f"SELECT COUNT(*) FROM activity{where}", parameters).fetchone()[0]
        rows: list[dict[str, Any]] = []
        if offset < total:  # also keeps an offset past SQLite's integers out of the query
            cursor = connection.execute(
                f"SELECT {_SELECT} FROM activity{where}{order_by} LIMIT ? OFFSET ?",
                [*parameters, checked.limit, offset],
            )
            names = [column[0] for column in cursor.description]  # whatever the connection's row_factory
            rows = [dict(zip(names, row)) for row in cursor]
    return {
        "data": [_record(row, has_capture) for row in rows],
        "page": checked.page,
        "limit": checked.limit,
        "total": total,
        "total_pages": math.ceil(total / checked.limit),
    }


def activity_stats(db: Database, model: str | None = None) -> dict[str, Any]:
    """llama-swap's `GET /api/metrics/stats` of every row or of `model`'s (an exact id), with TTFT and duration too."""
    where, parameters = "", []
    if model is not None and model.strip():
        where, parameters = " WHERE model = ?", [model.strip()]
    with opened(db) as connection:
        requests, input_tokens, output_tokens, cache_tokens = connection.execute(
            _TOTALS + where, parameters
        ).fetchone()
        rows = connection.execute(
            f"SELECT prompt_per_second, tokens_per_second, ttft_ms, duration_ms FROM activity{where}", parameters
        ).fetchall()
    prompt_rates, decode_rates, ttfts, durations = zip(*rows, strict=True) if rows else ((), (), (), ())
    return {
        "total_requests": requests,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "total_cache_tokens": cache_tokens,
        # llama-swap's rates count when > 0: 0 and -1 mean not reported. A TTFT of 0 is none either.
        "prompt_histogram": histogram(_positive(prompt_rates)),
        "gen_histogram": histogram(_positive(decode_rates)),
        "ttft_histogram": histogram(_positive(ttfts)),
        "duration_histogram": histogram(durations),
        # swaplab's own: which SQLite file these are from (the page shows it; None for a connection).
        "store": store_name(db),
    }


def store_name(db: Database) -> str | None:
    """The path of the store `db` names (None: the default store); None for an open connection."""
    if isinstance(db, sqlite3.Connection):
        return None
    return str(db if db is not None else default_path())


def histogram(values: Iterable[float]) -> dict[str, Any] | None:
    """llama-swap's histogram (store.go:391-452): Sturges bins clamped to 5-20, p50, p95, p99; None for no values."""
    ordered = sorted(float(value) for value in values)
    if not ordered:
        return None
    low, high = ordered[0], ordered[-1]
    if low == high:
        bins, size = [len(ordered)], 0.0
    else:
        count = min(MAX_BINS, max(MIN_BINS, math.ceil(math.log2(len(ordered))) + 1))
        size = (high - low) / count
        bins = [0] * count
        for value in ordered:
            bins[min(math.floor((value - low) / size), count - 1)] += 1
    shape: dict[str, Any] = {"bins": bins, "min": low, "max": high, "binSize": size}
    for q in HISTOGRAM_PERCENTILES:
        shape[f"p{q}"] = percentile(ordered, q)
    return shape


def rfc3339(seconds: int) -> str:
    """Unix `seconds` as Go writes a local time.Time: `Z` for a zero offset, an offset's seconds dropped."""
    local = datetime.fromtimestamp(seconds).astimezone()
    text = local.replace(tzinfo=None).isoformat(timespec="seconds")
    offset = int((local.utcoffset() or timedelta()).total_seconds())
    if offset == 0:
        return text + "Z"
    minutes = abs(offset) // 60
    return f"{text}{'-' if offset < 0 else '+'}{minutes // 60:02d}:{minutes % 60:02d}"


# -- the parts ---------------------------------------------------------------------


def _where(query: ActivityQuery) -> tuple[str, list[Any]]:
    conditions: list[str] = []
    parameters: list[Any] = []
    if query.models:
        conditions.append(f"model IN ({', '.join('?' for _ in query.models)})")
        parameters += query.models
    # Inclusive on the whole second a row shows (`time` is fractional), as llama-swap's
    # comparison of whole seconds; written on `time` itself so its index serves.
    if query.start is not None:
        conditions.append("time >= ?")
        parameters.append(query.start.seconds)
    if query.end is not None:
        conditions.append("time < ?")
        parameters.append(query.end.seconds + 1)
    if query.min_id is not None:
        conditions.append("id >= ?")
        parameters.append(query.min_id)
    if query.max_id is not None:
        conditions.append("id <= ?")
        parameters.append(query.max_id)
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), parameters


def _record(row: dict[str, Any], has_capture: Callable[[int], bool] | None) -> dict[str, Any]:
    capture_id = row["capture_id"]
    tokens = {
        name: float(row[f"api_{name}"]) if name in _RATES else int(row[f"api_{name}"]) for name in TOKENS
    }
    record: dict[str, Any] = {
        "id": row["id"],
        "timestamp": rfc3339(row["api_second"]),
        "model": row["model"],
        "req_path": row["path"],
        "resp_content_type": row["api_content_type"],
        "resp_status_code": row["status"],
        "tokens": tokens,
        "duration_ms": row["api_duration_ms"],
        "has_capture": capture_id is not None and has_capture is not None and bool(has_capture(capture_id)),
    }
    if row["error"]:  # Go's omitempty: no key for an empty message either
        record["error_msg"] = row["error"]
    if row["metadata"] is not None and (metadata := json.loads(row["metadata"])):
        record["metadata"] = metadata
    record.update(
        time=row["time"],
        requested_model=row["requested_model"],
        peer=row["peer"],
        ttft_ms=row["ttft_ms"],
        client_disconnected=bool(row["client_disconnected"]),
        session_id=row["session_id"],
        capture_id=capture_id,
        waited_for=row["waited_for"],
    )
    return record


def _positive(values: Iterable[float | None]) -> list[float]:
    return [value for value in values if value is not None and value > 0]


def _values(query: QueryParameters, name: str) -> list[str]:
    value = query.get(name)
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _first(query: QueryParameters, name: str) -> str:
    """The first value of `name`, trimmed; "" when absent (Go's URL.Query().Get)."""
    values = _values(query, name)
    return values[0].strip() if values else ""


def whole_number(raw: str, name: str, low: int, high: int) -> int:
    """`raw`, the value of parameter `name`, as a whole number from `low` to `high`, read as Go's
    strconv.Atoi reads it (ASCII digits, a sign); QueryParameterError saying what it must be otherwise."""
    value = _go_integer(raw)
    if value is None or not low <= value <= high:
        raise QueryParameterError(f"{name} must be a whole number from {low} to {high}, not {raw[:40]!r}")
    return value


def _go_integer(raw: str) -> int | None:
    if not _GO_INTEGER.fullmatch(raw):
        return None
    value = int(raw)
    return value if -_GO_INT_MAX - 1 <= value <= _GO_INT_MAX else None


def _row_id(query: QueryParameters, name: str) -> int | None:
    raw = _first(query, name)
    if not raw:
        return None
    value = _go_integer(raw)
    if value is None or value < 1:
        raise ActivityQueryError(f"{name} must be >= 1")
    return value


def _instant(query: QueryParameters, name: str) -> Instant | None:
    raw = _first(query, name)
    if not raw:
        return None
    match = _RFC3339.fullmatch(raw)
    invalid = ActivityQueryError(f"invalid '{name}' timestamp, use RFC3339 format")
    if match is None:
        raise invalid
    year, month, day, hour, minute, second, fraction, utc, sign, offset_hours, offset_minutes = match.groups()
    try:
        zone = UTC
        if not utc:
            if int(offset_hours) > 23 or int(offset_minutes) > 59:
                raise ValueError("offset out of range")
            offset = timedelta(hours=int(offset_hours), minutes=int(offset_minutes))
            zone = timezone(-offset if sign == "-" else offset)
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=zone)
    except ValueError:
        raise invalid from None
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    seconds = (moment - epoch) // timedelta(seconds=1)  # exact: no float on the way
    return Instant(seconds, int((fraction or "0")[:9].ljust(9, "0")))
