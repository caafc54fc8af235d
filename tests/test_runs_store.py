"""Runs and their requests in the store (real SQLite files): migrations 2 and 3, the run record, save/list/get, all-or-nothing writes."""

from __future__ import annotations

import json
import math
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from swaplab.errors import SwaplabError
from swaplab.results.activity import recent_activity
from swaplab.results.runs import (
    RequestRow, Run, get_run, list_runs, recorded_models, runs_for_models, save_run, served_run,
)
from swaplab.results.store import MIGRATIONS, SCHEMA_VERSION, connect, schema_version

START = 1_800_000_000.0


def a_run(number: int = 0, **fields) -> Run:
    values = dict(
        kind="throughput", target_url="http://127.0.0.1:8080", model="smollm2", started_at=START + number,
        ended_at=START + number + 30, parameters={"concurrency": [1, 2], "reps": 2},
        summary={"levels": [{"concurrency": 1, "output_tokens_per_second": {"mean": 140.0, "min": 139.0, "max": 141.0, "n": 2}}]},
    )
    return Run(**{**values, **fields})


def some_requests(count: int = 3, **fields) -> list[RequestRow]:
    return [
        RequestRow(rep=1, level="c=1", seq=seq, sent_at=START + seq, ttft_ms=30.0 + seq, completion_tokens=64, **fields)
        for seq in range(count)
    ]


def table_columns(connection: sqlite3.Connection, table: str) -> list[str]:
    return [row["name"] for row in connection.execute(f"PRAGMA table_info({table})")]


def count(path: Path, table: str) -> int:
    with closing(sqlite3.connect(path)) as plain:
        return plain.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


# -- the migration ---------------------------------------------------------------------------


def test_a_version_1_file_keeps_its_activity_and_gains_the_run_tables(tmp_path):
    path = tmp_path / "v1.db"
    with closing(connect(path, migrations=MIGRATIONS[:1])) as old:  # what the router wrote before runs existed
        # A row in version 1's own columns: today's insert_activity writes columns later versions added.
        old.execute(
            "INSERT INTO activity (time, model, path, status, duration_ms, completion_tokens) VALUES (?, ?, ?, ?, ?, ?)",
            (START, "smollm2", "/v1/completions", 200, 12.5, 9),
        )
        old.commit()
        assert schema_version(old) == 1
        assert old.execute("SELECT name FROM sqlite_master WHERE name = 'runs'").fetchone() is None
    with closing(connect(path)) as connection:
        assert schema_version(connection) == SCHEMA_VERSION >= 3  # every migration since, in one open
        assert table_columns(connection, "runs") == [
            "id", "kind", "target_url", "model", "requested_model", "backend_kind", "backend_version", "config_hash", "host",
            "swaplab_version", "parameters", "started_at", "ended_at", "warmup_discarded", "summary", "status",
        ]
        assert table_columns(connection, "requests") == [
            "id", "run_id", "rep", "level", "seq", "sent_at", "first_token_at", "end_at", "ttft_ms", "tpot_ms", "e2e_ms",
            "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "finish_reason", "error",
            "warmup", "data",
        ]
        indexes = {row["name"] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"runs_by_model", "runs_by_requested_model", "runs_by_kind", "runs_by_time", "requests_by_run"} <= indexes
        assert [row["completion_tokens"] for row in recent_activity(connection)] == [9]
        save_run(connection, a_run(), some_requests())
    assert count(path, "runs") == 1 and count(path, "activity") == 1


def test_a_version_2_file_names_its_runs_as_the_activity_table_does(tmp_path):
    path = tmp_path / "v2.db"
    with closing(connect(path, migrations=MIGRATIONS[:2])) as old:  # `model` the name asked for, `alias` the id
        old.execute("INSERT INTO runs (kind, target_url, model, alias, swaplab_version, started_at, status) "
                    "VALUES ('throughput', 'http://r', 'smollm2-135m', 'smollm2', '0.1.0', ?, 'completed')", [START])
        old.execute("INSERT INTO runs (kind, target_url, model, alias, swaplab_version, started_at, status) "
                    "VALUES ('grill', 'http://b', 'gemma3-270m', NULL, '0.1.0', ?, 'completed')", [START + 1])
        old.execute("INSERT INTO requests (run_id, rep, level, seq, ttft_ms) VALUES (1, 1, 'c=1', 0, 31.0)")
        assert schema_version(old) == 2
    with closing(connect(path)) as connection:
        assert schema_version(connection) == SCHEMA_VERSION
        assert "alias" not in table_columns(connection, "runs")
        indexes = {row["name"] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "runs_by_alias" not in indexes and "runs_by_requested_model" in indexes
        through_alias, direct = list_runs(connection, limit=10)[::-1]
        assert (through_alias["model"], through_alias["requested_model"]) == ("smollm2", "smollm2-135m")
        assert (direct["model"], direct["requested_model"]) == ("gemma3-270m", None)
        assert [run["id"] for run in list_runs(connection, model="smollm2-135m")] == [through_alias["id"]]
        assert recorded_models(connection) == ["gemma3-270m", "smollm2", "smollm2-135m"]
        assert get_run(connection, through_alias["id"])["requests"][0]["ttft_ms"] == 31.0
        save_run(connection, a_run(2, requested_model="smollm2-135m"))
    assert count(path, "runs") == 3


def test_listing_by_model_uses_the_index(tmp_path):
    with closing(connect(tmp_path / "a.db")) as connection:
        plan = " ".join(row[-1] for row in connection.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM runs WHERE model = ? OR requested_model = ? ORDER BY started_at DESC", ["m", "m"]))
    assert "runs_by_model" in plan and "runs_by_requested_model" in plan


# -- save, list, get -------------------------------------------------------------------------


def test_a_run_comes_back_as_it_was_saved(tmp_path):
    db = tmp_path / "a.db"
    run = a_run(
        requested_model="smollm2-135m", backend_kind="llama.cpp", backend_version="b6000", config_hash="3f2a9c1e",
        host="bench-box", warmup_discarded=1, status="completed",
        parameters={"input_tokens": 128, "concurrency": [1, 2], "json": Path("/tmp/report.json"), "odd": math.nan},
    )
    requests = [
        RequestRow(rep=0, level="c=1", seq=0, warmup=True, ttft_ms=180.0),
        RequestRow(
            rep=1, level="c=1", seq=0, sent_at=START, first_token_at=START + 0.031, end_at=START + 0.48,
            ttft_ms=31.0, tpot_ms=7.1, e2e_ms=480.0, prompt_tokens=128, completion_tokens=64, cached_tokens=0,
            reasoning_tokens=12, finish_reason="length", data={"itl_ms": [7.0, 7.2, 7.1]},
        ),
        RequestRow(rep=1, level="c=1", seq=1, error="HTTP 503: model is loading"),
    ]
    run_id = save_run(db, run, requests)
    got = get_run(db, run_id)
    assert got is not None and got["id"] == run_id
    for name in ("kind", "target_url", "model", "requested_model", "backend_kind", "backend_version", "config_hash", "host",
                 "swaplab_version", "started_at", "ended_at", "warmup_discarded", "summary", "status"):
        assert got[name] == getattr(run, name), name
    # JSON any reader accepts: paths as strings, NaN as null.
    assert got["parameters"] == {"input_tokens": 128, "concurrency": [1, 2], "json": "/tmp/report.json", "odd": None}
    assert (got["request_count"], got["error_count"]) == (2, 1)  # the warm-up request is not counted
    assert [request["seq"] for request in got["requests"]] == [0, 0, 1]
    warm, measured, failed = got["requests"]
    assert warm["warmup"] is True and measured["warmup"] is False and warm["data"] is None
    for name in ("rep", "level", "seq", "sent_at", "first_token_at", "end_at", "ttft_ms", "tpot_ms", "e2e_ms",
                 "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "finish_reason", "error"):
        assert measured[name] == getattr(requests[1], name), name
    assert measured["data"] == {"itl_ms": [7.0, 7.2, 7.1]}
    assert failed["error"] == "HTTP 503: model is loading" and measured["run_id"] == run_id
    assert get_run(db, run_id + 1) is None


def test_a_served_run_is_named_as_the_store_names_it_and_its_report_header_as_reports_always_did(tmp_path):
    from swaplab.client.server import ServerInfo
    from swaplab.results.report import check_report_path, report_header, write_report

    def server(model: str) -> ServerInfo:
        return ServerInfo(
            url="http://127.0.0.1:8080", model=model, model_id="smollm2", alias=model if model != "smollm2" else None,
            backend_kind="llama.cpp", backend_version="b6000", router=True, config_hash="3f2a9c1e", context_tokens=4096,
            known_models=("smollm2", "smollm2-135m"), upstream_prefix="/upstream/smollm2",
        )

    through_alias = served_run("grill", server("smollm2-135m"), started_at=START, ended_at=START + 9,
                               parameters={"reps": 3}, summary={"score": 1}, all_failed=False)
    assert (through_alias.model, through_alias.requested_model, through_alias.status) == ("smollm2", "smollm2-135m", "completed")
    by_id = served_run("throughput", server("smollm2"), started_at=START, ended_at=START + 9, parameters={},
                       summary={}, all_failed=True, warmup_discarded=1)
    assert (by_id.model, by_id.requested_model, by_id.status, by_id.warmup_discarded) == ("smollm2", None, "failed", 1)
    run_id = save_run(tmp_path / "a.db", through_alias)
    assert [run["id"] for run in list_runs(tmp_path / "a.db", model="smollm2-135m")] == [run_id]

    header = report_header(through_alias, run_id)
    assert (header["run_id"], header["model"], header["model_id"], header["alias"]) == (run_id, "smollm2-135m", "smollm2", "smollm2")
    assert (header["target_url"], header["config_hash"], header["parameters"]) == ("http://127.0.0.1:8080", "3f2a9c1e", {"reps": 3})
    assert (report_header(by_id, 2)["model"], report_header(by_id, 2)["alias"]) == ("smollm2", None)
    with pytest.raises(SwaplabError, match="--json .*: directory .* does not exist"):
        check_report_path(str(tmp_path / "missing" / "report.json"))
    write_report(str(tmp_path / "report.json"), {**header, "extra": tmp_path})
    assert json.loads((tmp_path / "report.json").read_text())["extra"] == str(tmp_path)
    assert not (tmp_path / "report.json.partial").exists()


def test_defaults_name_the_machine_and_the_swaplab_version(tmp_path):
    import socket

    from swaplab import __version__

    run_id = save_run(tmp_path / "a.db", Run(kind="grill", target_url="http://x", model="m", started_at=START))
    got = get_run(tmp_path / "a.db", run_id)
    assert (got["host"], got["swaplab_version"], got["status"]) == (socket.gethostname(), __version__, "completed")
    assert (got["parameters"], got["summary"], got["requests"], got["request_count"]) == ({}, {}, [], 0)


def test_list_runs_newest_first_filtered_by_model_or_alias_and_kind(tmp_path):
    db = tmp_path / "a.db"
    with closing(connect(db)) as connection:
        first = save_run(connection, a_run(1), some_requests(2))
        second = save_run(connection, a_run(2, kind="prefill", requested_model="smollm2-135m"), some_requests(1, error="boom"))
        third = save_run(connection, a_run(3, model="gemma3-270m"))
        fourth = save_run(connection, a_run(4, model="smollm2-135m", requested_model="smollm2", kind="grill"))
    assert [run["id"] for run in list_runs(db)] == [fourth, third, second, first]
    assert [run["id"] for run in list_runs(db, limit=2)] == [fourth, third]
    assert [run["id"] for run in list_runs(db, model="smollm2")] == [fourth, second, first]
    assert [run["id"] for run in list_runs(db, model="smollm2-135m")] == [fourth, second]
    assert [run["id"] for run in list_runs(db, model="smollm2", kind="prefill")] == [second]
    assert list_runs(db, model="nobody") == []
    listed = {run["id"]: run for run in list_runs(db)}
    assert (listed[first]["request_count"], listed[first]["error_count"]) == (2, 0)
    assert (listed[second]["request_count"], listed[second]["error_count"]) == (1, 1)
    assert "requests" not in listed[first] and listed[first]["summary"]["levels"][0]["concurrency"] == 1


def test_runs_for_models_finds_runs_recorded_under_an_alias(tmp_path):
    db = tmp_path / "a.db"
    with closing(connect(db)) as connection:  # the seed's model: one id, two aliases, runs under each name
        by_alias = save_run(connection, a_run(3, kind="grill", model="glm-4.7-flash-sglang-tp2"))
        by_id = save_run(connection, a_run(1, kind="throughput", model="glm-flash-sglang"))
        resolved = save_run(connection, a_run(2, kind="prefill", model="glm-flash-sglang", requested_model="glm-flash"))
        save_run(connection, a_run(4, kind="grill", model="glm-flash-awq"))  # same weights, another model
    names = ["glm-flash-sglang", "glm-4.7-flash-sglang-tp2", "glm-flash-sglang"]
    assert [run["id"] for run in runs_for_models(db, names)] == [by_id, resolved, by_alias]  # oldest first
    assert [run["id"] for run in runs_for_models(db, iter(names), kind="grill")] == [by_alias]
    assert [run["id"] for run in runs_for_models(db, names, kind=("throughput", "prefill"))] == [by_id, resolved]
    assert runs_for_models(db, ["glm-flash"]) == runs_for_models(db, ["glm-flash"], kind="prefill")
    assert runs_for_models(db, []) == [] and runs_for_models(db, ["qwen"]) == []
    assert recorded_models(db) == [
        "glm-4.7-flash-sglang-tp2", "glm-flash", "glm-flash-awq", "glm-flash-sglang",
    ]


# -- all or nothing -----------------------------------------------------------------------------


def test_an_error_while_iterating_the_requests_leaves_no_trace(tmp_path):
    db = tmp_path / "a.db"
    kept = save_run(db, a_run(1), some_requests(2))

    def interrupted():
        yield from some_requests(5)
        raise KeyboardInterrupt  # ^C at the end of a long run, while it is being saved

    with pytest.raises(KeyboardInterrupt):
        save_run(db, a_run(2), interrupted())
    assert [run["id"] for run in list_runs(db)] == [kept]
    assert count(db, "runs") == 1 and count(db, "requests") == 2

    with closing(connect(db)) as connection:  # a caller's own connection is left usable, outside any transaction

        def broken():
            yield some_requests(1)[0]
            raise RuntimeError("the client crashed")

        with pytest.raises(RuntimeError, match="client crashed"):
            save_run(connection, a_run(3), broken())
        assert not connection.in_transaction
        after = save_run(connection, a_run(4), some_requests(1))
    assert [run["id"] for run in list_runs(db)] == [after, kept]
    assert count(db, "requests") == 3


def test_a_request_the_store_refuses_leaves_no_run(tmp_path):
    db = tmp_path / "a.db"
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        save_run(db, a_run(), [*some_requests(2), RequestRow(rep=1, level="c=1", seq=3, data={"bad": object()})])
    assert count(db, "runs") == 0 and count(db, "requests") == 0


def test_a_reader_never_sees_half_a_run(tmp_path):
    db = tmp_path / "a.db"
    connect(db).close()
    seen: list[int] = []

    def watched():
        for request in some_requests(4):
            # Another process reading while the run is being written (WAL: it reads the last commit).
            with closing(connect(db)) as reader:
                seen.append(len(list_runs(reader)) + reader.execute("SELECT count(*) FROM requests").fetchone()[0])
            yield request

    run_id = save_run(db, a_run(), watched())
    assert seen == [0, 0, 0, 0]
    assert get_run(db, run_id)["request_count"] == 4


def test_a_run_needs_a_kind_and_a_model(tmp_path):
    with pytest.raises(ValueError, match="a kind and a model"):
        save_run(tmp_path / "a.db", a_run(model=""))
