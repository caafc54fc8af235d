"""llama-swap's activity API over a real store: pages, filters, sorts, 400s, record shape, stats."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import pytest

from swaplab.results.activity import ActivityRecord, insert_activity
from swaplab.results.activityapi import (
    ActivityQueryError,
    activity_page,
    activity_stats,
    histogram,
    parse_activity_query,
    rfc3339,
)
from swaplab.results.store import connect

SHAPES = json.loads((Path(__file__).parent / "fixtures" / "llama-swap-api" / "shapes.json").read_text())
ACTIVITY_ROUTE = SHAPES["routes"]["GET /api/metrics/activity"]
STATS_ROUTE = SHAPES["routes"]["GET /api/metrics/stats"]
T = 1_800_000_000  # 2027-01-15T08:00:00Z
LLAMA_SWAP_FIELDS = [
    "id", "timestamp", "model", "req_path", "resp_content_type", "resp_status_code", "tokens", "duration_ms",
    "has_capture",
]
SWAPLAB_FIELDS = [
    "time", "requested_model", "peer", "ttft_ms", "client_disconnected", "session_id", "capture_id", "waited_for",
]


def record(**fields) -> ActivityRecord:
    return ActivityRecord(**{"time": T, "model": "m", "path": "/v1/chat/completions", "status": 200,
                             "duration_ms": 10.0, **fields})


def store(tmp_path: Path, *records: ActivityRecord) -> Path:
    path = tmp_path / "swaplab.db"
    with closing(connect(path)) as connection:
        insert_activity(connection, records)
    return path


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def ids(page: dict) -> list[int]:
    return [row["id"] for row in page["data"]]


@pytest.fixture
def local_zone(monkeypatch):
    """`local_zone("IST-5:30")` sets the process's local time zone (POSIX TZ) for one test."""
    def set_zone(zone: str) -> None:
        monkeypatch.setenv("TZ", zone)
        time.tzset()

    yield set_zone
    monkeypatch.undo()
    time.tzset()


# -- paging --------------------------------------------------------------------------


def test_pages_newest_id_first_with_llama_swaps_totals(tmp_path):
    db = store(tmp_path, *(record(time=T + n) for n in range(7)))
    first = activity_page(db, {"limit": "3"})
    assert (first["page"], first["limit"], first["total"], first["total_pages"]) == (1, 3, 7, 3)
    assert ids(first) == [7, 6, 5]
    assert ids(activity_page(db, {"limit": "3", "page": "2"})) == [4, 3, 2]
    last = activity_page(db, {"limit": "3", "page": "3"})
    assert ids(last) == [1] and last["total_pages"] == 3
    past = activity_page(db, {"limit": "3", "page": "4"})
    assert past["data"] == [] and past["total"] == 7 and past["page"] == 4
    exact = activity_page(db, {"limit": "7"})
    assert exact["total_pages"] == 1 and len(exact["data"]) == 7
    default = activity_page(db, {})
    assert (default["page"], default["limit"], default["total_pages"]) == (1, 25, 1)
    assert ids(default) == [7, 6, 5, 4, 3, 2, 1]


def test_an_empty_store_has_no_pages(tmp_path):
    page = activity_page(store(tmp_path), {})
    assert page == {"data": [], "page": 1, "limit": 25, "total": 0, "total_pages": 0}


def test_a_page_beyond_any_offset_sqlite_can_hold_is_empty(tmp_path):
    db = store(tmp_path, record())
    page = activity_page(db, {"page": str(2**63 - 1), "limit": "999"})
    assert page["data"] == [] and page["total"] == 1


def test_reads_through_an_open_connection_of_any_row_factory(tmp_path):
    db = store(tmp_path, record(model="a"), record(model="b"))
    with closing(sqlite3.connect(db)) as connection:  # row_factory None: plain tuples
        assert [row["model"] for row in activity_page(connection, {})["data"]] == ["b", "a"]
        assert activity_stats(connection)["total_requests"] == 2


# -- filters -------------------------------------------------------------------------


def test_model_matches_the_resolved_id_only_and_repeats(tmp_path):
    db = store(
        tmp_path,
        record(model="qwen", requested_model="fast"),
        record(model="gemma"),
        record(model="llama", requested_model="qwen"),
        record(model="o'brien"),
    )
    assert ids(activity_page(db, {"model": "qwen"})) == [1]
    assert ids(activity_page(db, {"model": "fast"})) == []  # an alias the client sent is not the model
    assert ids(activity_page(db, {"model": ["qwen", "gemma"]})) == [2, 1]
    assert ids(activity_page(db, {"model": ["", "  ", " gemma "]})) == [2]  # blanks ignored, trimmed
    assert ids(activity_page(db, {"model": ["", " "]})) == [4, 3, 2, 1]  # only blanks: every model
    assert ids(activity_page(db, {"model": "o'brien"})) == [4]  # a bound parameter, not SQL text
    assert activity_page(db, {"model": ["qwen", "gemma"]})["total"] == 2


def test_start_and_end_are_inclusive_on_the_whole_second_a_row_shows(tmp_path):
    db = store(
        tmp_path,
        record(time=T - 0.5),  # shows T-1
        record(time=T + 0.7),  # shows T
        record(time=T + 1.0),
        record(time=T + 1.9),  # shows T+1
        record(time=T + 2.0),
    )
    assert ids(activity_page(db, {"start": utc(T), "end": utc(T + 1)})) == [4, 3, 2]
    assert ids(activity_page(db, {"start": utc(T + 1)})) == [5, 4, 3]
    assert ids(activity_page(db, {"end": utc(T)})) == [2, 1]
    assert ids(activity_page(db, {"start": utc(T + 2), "end": utc(T + 2)})) == [5]
    # A fraction in the query counts from its whole second, as llama-swap's Unix() does.
    assert ids(activity_page(db, {"start": "2027-01-15T08:00:00.999Z", "end": "2027-01-15T08:00:00.999Z"})) == [2]
    # Another offset names the same instant.
    assert ids(activity_page(db, {"start": "2027-01-15T13:30:01+05:30"})) == [5, 4, 3]
    assert ids(activity_page(db, {"end": "2027-01-15T04:59:59-03:00"})) == [1]


def test_min_and_max_id_are_inclusive_and_combine_with_the_rest(tmp_path):
    db = store(tmp_path, *(record(model="a" if n % 2 else "b", time=T + n) for n in range(1, 9)))
    assert ids(activity_page(db, {"min_id": "3", "max_id": "5"})) == [5, 4, 3]
    assert ids(activity_page(db, {"min_id": "7"})) == [8, 7]
    assert ids(activity_page(db, {"max_id": "2"})) == [2, 1]
    assert ids(activity_page(db, {"min_id": "4", "max_id": "4"})) == [4]
    page = activity_page(db, {"model": "a", "min_id": "2", "end": utc(T + 7), "limit": "1", "order": "asc"})
    assert ids(page) == [3] and page["total"] == 3 and page["total_pages"] == 3  # 3, 5, 7


# -- sorting -------------------------------------------------------------------------


def sorting_rows() -> list[ActivityRecord]:
    """Rows where every sort key has both ties and different values (unknowns included).

    Within a tie the stored values disagree with the id order (time, duration, content type)
    so that sorting by the stored value instead of the shown one fails.
    """
    return [
        record(time=T + 0.2, model="b", path="/v1/completions", status=200, resp_content_type="application/json",
               prompt_tokens=100, completion_tokens=10, cached_tokens=5, draft_tokens=4, draft_accepted_tokens=3,
               prompt_per_second=300.0, tokens_per_second=50.0, duration_ms=120.9),
        record(time=T + 0.1, model="a", status=500, error="boom", resp_content_type="",
               duration_ms=120.4),  # nothing read: all 0
        record(time=T + 1.1, model="a", resp_content_type="text/event-stream", prompt_tokens=100,
               completion_tokens=20, tokens_per_second=40.0, duration_ms=30.0),  # cached, drafts, prefill: -1
        record(time=T + 1.5, model="c", path="/v1/completions", status=200, resp_content_type="application/json",
               prompt_tokens=7, completion_tokens=20, cached_tokens=5, draft_tokens=4, draft_accepted_tokens=1,
               prompt_per_second=300.0, tokens_per_second=40.0, duration_ms=5.0),
        record(time=T + 3.0, model="b", status=502, duration_ms=5.9),  # nothing read: all 0
        record(time=T + 3.5, model="a", resp_content_type="text/event-stream", prompt_tokens=7,
               completion_tokens=10, cached_tokens=0, draft_tokens=9, draft_accepted_tokens=9,
               prompt_per_second=120.5, tokens_per_second=61.2, duration_ms=30.2),
    ]


SHOWN = {  # each sort key to the value of a record it must order by
    "id": lambda row: row["id"],
    "time": lambda row: int(row["time"]),
    "model": lambda row: row["model"],
    "req_path": lambda row: row["req_path"],
    "resp_status_code": lambda row: row["resp_status_code"],
    "resp_content_type": lambda row: row["resp_content_type"],
    "cached": lambda row: row["tokens"]["cache_tokens"],
    "prompt": lambda row: row["tokens"]["input_tokens"],
    "generated": lambda row: row["tokens"]["output_tokens"],
    "drafted": lambda row: row["tokens"]["draft_tokens"],
    "prompt_speed": lambda row: row["tokens"]["prompt_per_second"],
    "gen_speed": lambda row: row["tokens"]["tokens_per_second"],
    "duration": lambda row: row["duration_ms"],
}


@pytest.mark.parametrize("order", ["asc", "desc", "ASC", "Desc"])
@pytest.mark.parametrize("key", list(SHOWN))
def test_every_sort_key_orders_by_what_it_shows_then_by_id(tmp_path, key, order):
    db = store(tmp_path, *sorting_rows())
    rows = activity_page(db, {"sort": key, "order": order})["data"]
    shown = [SHOWN[key](row) for row in rows]
    assert len(set(shown)) > 1
    if key != "id":
        assert len(set(shown)) < len(shown), "the data must have ties to prove the id breaks them"
    descending = order.lower() == "desc"
    expected = sorted(rows, key=lambda row: (SHOWN[key](row), row["id"]), reverse=descending)
    assert ids({"data": rows}) == ids({"data": expected})


def test_sorting_by_hand_unknowns_first_and_pages_follow_the_sort(tmp_path):
    db = store(tmp_path, *sorting_rows())
    # cache_tokens: -1 (read, not reported) < 0 (nothing read, id 2 and 5; and a real 0, id 6) < 5 (ids 1, 4)
    assert ids(activity_page(db, {"sort": "cached", "order": "asc"})) == [3, 2, 5, 6, 1, 4]
    assert ids(activity_page(db, {"sort": "cached"})) == [4, 1, 6, 5, 2, 3]
    # duration_ms in whole ms: 5, 5, 30, 30, 120, 120
    assert ids(activity_page(db, {"sort": "duration", "order": "asc"})) == [4, 5, 3, 6, 1, 2]
    assert ids(activity_page(db, {"sort": "time", "order": "asc", "limit": "2", "page": "2"})) == [3, 4]
    assert ids(activity_page(db, {"sort": "model", "order": "asc", "model": ["a", "c"]})) == [2, 3, 6, 4]


def test_the_default_sort_is_id_descending_whatever_the_times(tmp_path):
    db = store(tmp_path, record(time=T + 5), record(time=T + 1), record(time=T + 3))
    assert ids(activity_page(db, {})) == [3, 2, 1]
    assert ids(activity_page(db, {"order": "asc"})) == [1, 2, 3]
    assert ids(activity_page(db, {"sort": "time"})) == [1, 3, 2]


# -- 400s ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"limit": "abc"}, "invalid limit"),
        ({"limit": "5.0"}, "invalid limit"),
        ({"limit": "1e3"}, "invalid limit"),
        ({"limit": str(2**63)}, "invalid limit"),  # past Go's int
        ({"limit": "0"}, "limit must be between 1 and 999"),
        ({"limit": "1000"}, "limit must be between 1 and 999"),
        ({"limit": "-3"}, "limit must be between 1 and 999"),
        ({"page": "0"}, "page must be >= 1"),
        ({"page": "two"}, "page must be >= 1"),
        ({"page": str(2**63)}, "page must be >= 1"),
        ({"sort": "prompt_tokens"}, "invalid sort column"),  # swaplab's column name is not a key
        ({"sort": "ID"}, "invalid sort column"),
        ({"sort": "id; DROP TABLE activity"}, "invalid sort column"),
        ({"order": "up"}, "order must be asc or desc"),
        ({"start": "2027-01-15"}, "invalid 'start' timestamp, use RFC3339 format"),
        ({"start": "2027-01-15 08:00:00Z"}, "invalid 'start' timestamp, use RFC3339 format"),
        ({"start": "2027-01-15t08:00:00z"}, "invalid 'start' timestamp, use RFC3339 format"),
        ({"start": "2027-13-01T00:00:00Z"}, "invalid 'start' timestamp, use RFC3339 format"),
        ({"start": "2027-01-15T08:00:00+25:00"}, "invalid 'start' timestamp, use RFC3339 format"),
        ({"start": "1800000000"}, "invalid 'start' timestamp, use RFC3339 format"),
        ({"start": "\uff12\uff10\uff12\uff17-01-15T08:00:00Z"}, "invalid 'start' timestamp, use RFC3339 format"),
        ({"limit": "\uff15"}, "invalid limit"),  # a full-width 5: Go takes ASCII digits only
        ({"end": "yesterday"}, "invalid 'end' timestamp, use RFC3339 format"),
        ({"start": "2027-01-15T08:00:01Z", "end": "2027-01-15T08:00:00Z"}, "start must be before end"),
        ({"start": "2027-01-15T08:00:00.5Z", "end": "2027-01-15T08:00:00.25Z"}, "start must be before end"),
        ({"start": "2027-01-15T08:00:00Z", "end": "2027-01-15T08:59:59+01:00"}, "start must be before end"),
        ({"min_id": "0"}, "min_id must be >= 1"),
        ({"min_id": "x"}, "min_id must be >= 1"),
        ({"max_id": "-1"}, "max_id must be >= 1"),
        ({"min_id": "5", "max_id": "4"}, "min_id must be <= max_id"),
        # llama-swap's order of checks: times, ids, limit, page, sort, order.
        ({"order": "up", "sort": "nope", "page": "0", "limit": "x", "min_id": "0", "start": "x"},
         "invalid 'start' timestamp, use RFC3339 format"),
        ({"order": "up", "sort": "nope", "page": "0", "limit": "x", "min_id": "0"}, "min_id must be >= 1"),
        ({"order": "up", "sort": "nope", "page": "0", "limit": "x"}, "invalid limit"),
        ({"order": "up", "sort": "nope", "page": "0"}, "page must be >= 1"),
        ({"order": "up", "sort": "nope"}, "invalid sort column"),
    ],
)
def test_a_bad_parameter_is_llama_swaps_400_message(tmp_path, query, message):
    with pytest.raises(ActivityQueryError) as raised:
        activity_page(tmp_path / "never-opened.db", query)
    assert str(raised.value) == message
    assert isinstance(raised.value, ValueError)
    assert not (tmp_path / "never-opened.db").exists()  # checked before the store is touched


@pytest.mark.parametrize(
    "query",
    [
        {"limit": " 5 ", "page": "+2"},  # trimmed; Go's Atoi takes a sign
        {"limit": "", "page": "", "sort": "", "order": "", "start": " ", "min_id": ""},  # blank = absent
        {"limit": ["7", "bad"]},  # only the first value counts
        {"start": "2027-01-15T08:00:00Z", "end": "2027-01-15T08:00:00Z"},
        {"start": "2027-01-15T08:00:00.123456789123+02:00"},
        {"start": "2027-01-15T08:00:00,5Z"},  # Go takes a comma before a fraction too
        {"min_id": "4", "max_id": "4"},
        {"order": "ASC", "sort": "gen_speed"},
    ],
)
def test_parameters_llama_swap_accepts(query):
    parse_activity_query(query)


def test_parsed_parameters():
    parsed = parse_activity_query({
        "model": ["a", " b "], "limit": "10", "page": "3", "sort": "prompt_speed", "order": "ASC",
        "start": "2027-01-15T08:00:00.25Z", "min_id": "2", "max_id": "9",
    })
    assert parsed.models == ("a", "b")
    assert (parsed.limit, parsed.page, parsed.sort, parsed.order) == (10, 3, "prompt_speed", "asc")
    assert (parsed.start.seconds, parsed.start.nanoseconds) == (T, 250_000_000)
    assert parsed.end is None and (parsed.min_id, parsed.max_id) == (2, 9)


# -- the record ----------------------------------------------------------------------


def test_a_record_has_llama_swaps_fields_and_swaplabs_beside_them(tmp_path, local_zone):
    local_zone("UTC0")
    db = store(tmp_path, record(
        time=T + 0.75, model="qwen3-8b", requested_model="fast", peer="gpu2", path="/v1/chat/completions",
        status=200, resp_content_type="text/event-stream", duration_ms=4432.9, prompt_tokens=512,
        completion_tokens=256, cached_tokens=128, prompt_per_second=1843.2, tokens_per_second=61.7,
        draft_tokens=40, draft_accepted_tokens=31, ttft_ms=280.5, session_id="lspg-1", capture_id=17,
        metadata='{"selector": "fast", "fifo_priority": "0"}', waited_for="start",
    ))
    [row] = activity_page(db, {}, has_capture=lambda capture_id: True)["data"]
    assert list(row) == [*LLAMA_SWAP_FIELDS, "metadata", *SWAPLAB_FIELDS]
    assert row == {
        "id": 1,
        "timestamp": "2027-01-15T08:00:00Z",
        "model": "qwen3-8b",
        "req_path": "/v1/chat/completions",
        "resp_content_type": "text/event-stream",
        "resp_status_code": 200,
        "tokens": {
            "cache_tokens": 128, "draft_tokens": 40, "draft_acc_tokens": 31, "input_tokens": 512,
            "output_tokens": 256, "prompt_per_second": 1843.2, "tokens_per_second": 61.7,
        },
        "duration_ms": 4432,
        "has_capture": True,
        "metadata": {"selector": "fast", "fifo_priority": "0"},
        "time": T + 0.75,
        "requested_model": "fast",
        "peer": "gpu2",
        "ttft_ms": 280.5,
        "client_disconnected": False,
        "session_id": "lspg-1",
        "capture_id": 17,
        "waited_for": "start",
    }
    assert list(row["tokens"]) == list(ACTIVITY_ROUTE["example"]["data"][0]["tokens"])


def test_a_failed_request_shows_its_error_and_zero_tokens(tmp_path):
    db = store(tmp_path, record(status=400, error="the request exceeds the available context size",
                                duration_ms=18.2, client_disconnected=True))
    [row] = activity_page(db, {})["data"]
    assert list(row) == [*LLAMA_SWAP_FIELDS, "error_msg", *SWAPLAB_FIELDS]
    assert row["error_msg"] == "the request exceeds the available context size"
    assert row["resp_content_type"] == "" and row["duration_ms"] == 18 and row["has_capture"] is False
    assert row["client_disconnected"] is True
    assert row["requested_model"] is row["peer"] is row["ttft_ms"] is row["capture_id"] is None
    assert set(row["tokens"].values()) == {0}


def test_an_empty_error_or_metadata_is_omitted_as_go_omits_it(tmp_path):
    db = store(tmp_path, record(error="", metadata="{}"))
    [row] = activity_page(db, {})["data"]
    assert "error_msg" not in row and "metadata" not in row


@pytest.mark.parametrize(
    ("fields", "tokens"),
    [
        # Nothing of the upstream's accounting read: all 0.
        ({}, (0, 0, 0, 0, 0, 0, 0)),
        # Usage read: unknown cache, drafts and rates are -1; input/output are never -1.
        ({"prompt_tokens": 12, "completion_tokens": 3}, (-1, -1, -1, 12, 3, -1, -1)),
        ({"prompt_tokens": 12}, (-1, -1, -1, 12, 0, -1, -1)),
        ({"completion_tokens": 3}, (-1, -1, -1, 0, 3, -1, -1)),
        ({"cached_tokens": 0}, (0, -1, -1, 0, 0, -1, -1)),
        # Timings or vLLM metrics read without usage count as read too.
        ({"tokens_per_second": 55.5}, (-1, -1, -1, 0, 0, -1, 55.5)),
        ({"prompt_per_second": 900.0}, (-1, -1, -1, 0, 0, 900.0, -1)),
        ({"draft_tokens": 8, "draft_accepted_tokens": 6}, (-1, 8, 6, 0, 0, -1, -1)),
        # Everything known: as stored.
        ({"prompt_tokens": 9, "completion_tokens": 4, "cached_tokens": 2, "draft_tokens": 3,
          "draft_accepted_tokens": 1, "prompt_per_second": 10.5, "tokens_per_second": 20.25},
         (2, 3, 1, 9, 4, 10.5, 20.25)),
    ],
)
def test_token_values_follow_llama_swaps_zero_and_minus_one_rules(tmp_path, fields, tokens):
    db = store(tmp_path, record(**fields))
    [row] = activity_page(db, {})["data"]
    names = ("cache_tokens", "draft_tokens", "draft_acc_tokens", "input_tokens", "output_tokens",
             "prompt_per_second", "tokens_per_second")
    assert tuple(row["tokens"][name] for name in names) == tokens
    assert all(type(row["tokens"][name]) is int for name in names[:5])
    assert all(type(row["tokens"][name]) is float for name in names[5:])


def test_has_capture_asks_the_callers_predicate_for_rows_with_a_capture_id(tmp_path):
    db = store(tmp_path, record(capture_id=7), record(capture_id=8), record())
    asked = []

    def kept(capture_id: int) -> bool:
        asked.append(capture_id)
        return capture_id == 8

    assert [row["has_capture"] for row in activity_page(db, {}, has_capture=kept)["data"]] == [False, True, False]
    assert sorted(asked) == [7, 8]  # never asked about the row without a capture id
    assert [row["has_capture"] for row in activity_page(db, {})["data"]] == [False, False, False]


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        ("UTC0", "2027-01-15T08:00:00Z"),
        ("IST-5:30", "2027-01-15T13:30:00+05:30"),
        ("NST3:30", "2027-01-15T04:30:00-03:30"),
        ("PST8PDT,M3.2.0,M11.1.0", "2027-01-15T00:00:00-08:00"),
    ],
)
def test_timestamps_are_whole_seconds_in_the_local_zone_as_go_writes_them(tmp_path, local_zone, zone, expected):
    local_zone(zone)
    db = store(tmp_path, record(time=T + 0.999))
    assert activity_page(db, {})["data"][0]["timestamp"] == expected
    assert rfc3339(T) == expected


def test_a_summer_timestamp_carries_the_summer_offset(local_zone):
    local_zone("PST8PDT,M3.2.0,M11.1.0")
    assert rfc3339(T + 180 * 86400) == "2027-07-14T01:00:00-07:00"


# -- stats ---------------------------------------------------------------------------


def test_stats_totals_count_positive_cache_tokens_only(tmp_path):
    db = store(
        tmp_path,
        record(model="a", prompt_tokens=100, completion_tokens=10, cached_tokens=40),
        record(model="a", prompt_tokens=50, completion_tokens=5),  # cache shown as -1: must not subtract
        record(model="a", status=500),
        record(model="b", prompt_tokens=7, completion_tokens=3, cached_tokens=2),
    )
    stats = activity_stats(db)
    assert (stats["total_requests"], stats["total_input_tokens"], stats["total_output_tokens"],
            stats["total_cache_tokens"]) == (4, 157, 18, 42)
    only_a = activity_stats(db, "a")
    assert (only_a["total_requests"], only_a["total_input_tokens"], only_a["total_output_tokens"],
            only_a["total_cache_tokens"]) == (3, 150, 15, 40)
    assert activity_stats(db, " b ")["total_requests"] == 1
    assert activity_stats(db, "")["total_requests"] == 4  # blank: every model
    assert activity_stats(db, "nobody")["total_requests"] == 0


def test_histograms_by_hand(tmp_path):
    rates = [10.0, 20.0, 30.0, 40.0, 50.0, 100.0]
    db = store(
        tmp_path,
        *(record(prompt_per_second=rate, tokens_per_second=7.0, ttft_ms=rate, duration_ms=rate, model="a")
          for rate in rates),
        record(model="a", prompt_per_second=0.0, tokens_per_second=None, ttft_ms=0.0, duration_ms=0.0),
        record(model="b", prompt_per_second=5000.0, duration_ms=1.0),
    )
    stats = activity_stats(db, "a")
    # n=6: ceil(log2 6)+1 = 4 bins, clamped up to 5; binSize (100-10)/5 = 18;
    # 10, 20 -> 0; 30, 40 -> 1; 50 -> 2; 100 -> 5, capped at 4.
    prompt = stats["prompt_histogram"]
    assert prompt["bins"] == [2, 2, 1, 0, 1]
    assert (prompt["min"], prompt["max"], prompt["binSize"]) == (10.0, 100.0, 18.0)
    # ranks 2.5, 4.75, 4.95 between 30|40 and 50|100
    assert prompt["p50"] == pytest.approx(35.0) and prompt["p95"] == pytest.approx(87.5)
    assert prompt["p99"] == pytest.approx(97.5)
    assert list(prompt) == STATS_ROUTE["histogram_required"]
    # Every rate the same: one bin of all of them, binSize 0.
    assert stats["gen_histogram"] == {"bins": [6], "min": 7.0, "max": 7.0, "binSize": 0.0,
                                      "p50": 7.0, "p95": 7.0, "p99": 7.0}
    assert stats["ttft_histogram"] == prompt  # ttft 0 left out, as a rate of 0
    # Every duration, 0 ms included: n=7, 5 bins of 20: 0, 10 | 20, 30 | 40, 50 | | 100.
    duration = stats["duration_histogram"]
    assert duration["bins"] == [2, 2, 2, 0, 1] and duration["min"] == 0.0 and duration["binSize"] == 20.0
    assert duration["p50"] == pytest.approx(30.0)
    assert activity_stats(db)["prompt_histogram"]["max"] == 5000.0


def test_no_value_is_a_null_histogram(tmp_path):
    db = store(tmp_path, record(status=502), record(prompt_per_second=0.0, tokens_per_second=0.0))
    stats = activity_stats(db)
    assert stats["prompt_histogram"] is None and stats["gen_histogram"] is None
    assert stats["ttft_histogram"] is None
    assert stats["duration_histogram"]["bins"] == [2]
    empty_store = store(tmp_path / "empty")
    empty = activity_stats(empty_store)
    assert empty == {"total_requests": 0, "total_input_tokens": 0, "total_output_tokens": 0, "total_cache_tokens": 0,
                     "prompt_histogram": None, "gen_histogram": None, "ttft_histogram": None,
                     "duration_histogram": None, "store": str(empty_store)}


@pytest.mark.parametrize(("count", "bins"), [(1, 1), (2, 5), (16, 5), (17, 6), (33, 7), (2**19, 20), (2**19 + 1, 20)])
def test_histogram_bin_count_is_sturges_clamped_to_5_20(count, bins):
    shape = histogram(range(count))
    assert len(shape["bins"]) == bins and sum(shape["bins"]) == count


def test_histogram_matches_llama_swaps_example_bin_size():
    example = STATS_ROUTE["example"]["gen_histogram"]
    shape = histogram([example["min"], 52.0, 57.0, 61.0, 63.0, example["max"]])
    assert shape["binSize"] == example["binSize"]  # (64.9 - 40.3) / 5, to the last bit
    assert shape["bins"] == [1, 0, 1, 1, 3] == example["bins"]
    assert histogram([]) is None


# -- the contract: shapes.json ---------------------------------------------------------


def at(payload, path: str, *, optional: bool = False) -> list:
    """Every value at a dotted shapes.json `path` (`[]`: each item of a list); KeyError for a missing required one."""
    values = [payload]
    for part in path.split("."):
        key, each = (part[:-2], True) if part.endswith("[]") else (part, False)
        found = []
        for value in values:
            if key:
                if key not in value:
                    if optional:
                        continue
                    raise KeyError(f"{path}: no {key!r} in {value!r}")
                value = value[key]
            found.extend(value if each else [value])
        values = found
    return values


def kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    kinds = {int: "integer", float: "float", str: "string", list: "array", dict: "object", type(None): "null"}
    return kinds[type(value)]


def check_against(route: dict, payload, *, paths: list[str] | None = None, example=None) -> None:
    example = route["example"] if example is None else example
    payload = json.loads(json.dumps(payload))  # what the client gets: also proves it serialises
    nullable = set(route.get("nullable", ()))
    for path in paths if paths is not None else route["required"]:
        allowed = {kind(value) for value in at(example, path)} | ({"null"} if path in nullable else set())
        for value in at(payload, path):
            assert kind(value) in allowed, (path, value, allowed)
    for path in route.get("optional", ()) if paths is None else ():
        allowed = {kind(value) for value in at(example, path, optional=True)}
        for value in at(payload, path, optional=True):
            assert kind(value) in allowed, (path, value, allowed)


def test_the_helper_can_fail():
    with pytest.raises(KeyError):
        at({"data": [{"id": 1}, {}]}, "data[].id")
    with pytest.raises(AssertionError):
        check_against(ACTIVITY_ROUTE, {**ACTIVITY_ROUTE["example"], "total": "2"})
    with pytest.raises(AssertionError):
        check_against(ACTIVITY_ROUTE, {**ACTIVITY_ROUTE["example"], "data": [
            {**ACTIVITY_ROUTE["example"]["data"][0], "duration_ms": 4432.5}]})
    assert at([{"a": [1, 2]}, {"a": [3]}], "[].a[]") == [1, 2, 3]
    check_against(ACTIVITY_ROUTE, ACTIVITY_ROUTE["example"])
    check_against(STATS_ROUTE, STATS_ROUTE["example"])


def test_an_activity_page_has_every_required_path_with_the_examples_type(tmp_path):
    db = store(tmp_path, *sorting_rows(), record(metadata='{"selector": "fast"}', capture_id=3))
    page = activity_page(db, {}, has_capture=lambda capture_id: True)
    assert any("error_msg" in row for row in page["data"]) and any("metadata" in row for row in page["data"])
    check_against(ACTIVITY_ROUTE, page)
    check_against(ACTIVITY_ROUTE, activity_page(db, {"model": "nobody"}))


def test_stats_have_every_required_path_with_the_examples_type(tmp_path):
    db = store(tmp_path, *sorting_rows(), record(ttft_ms=12.5))
    stats = activity_stats(db)
    check_against(STATS_ROUTE, stats)
    for name in ("prompt_histogram", "gen_histogram", "ttft_histogram", "duration_histogram"):
        assert stats[name] is not None
        check_against(STATS_ROUTE, stats[name], paths=STATS_ROUTE["histogram_required"],
                      example=STATS_ROUTE["example"]["prompt_histogram"])
    check_against(STATS_ROUTE, activity_stats(store(tmp_path / "empty")))
