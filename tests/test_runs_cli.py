"""`swaplab runs list` and `swaplab runs show` as real processes on real databases."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import pytest

from swaplab.results.runs import RequestRow, Run, save_run
from swaplab.results.stats import distribution, spread
from swaplab.results.store import SCHEMA_VERSION, connect

START = 1_800_000_000.0


def runs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swaplab", "runs", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def line_with(output: str, *cells: str) -> str:
    [line] = [line for line in output.splitlines() if all(cell in line for cell in cells)]
    return line


@pytest.fixture
def db(tmp_path):
    """A store with a throughput run through an alias, a grill run with a failed task, and an interrupted prefill."""
    path = tmp_path / "swaplab.db"
    levels = []
    requests = [RequestRow(rep=0, level="c=1", seq=0, warmup=True, ttft_ms=190.0)]
    for concurrency, rates, ttfts in ((1, [139.0, 141.0], [30.0, 31.0, 33.0, 32.0]), (2, [270.0, 274.0], [40.0, 41.0, 44.0, 45.0])):
        levels.append({
            "concurrency": concurrency,
            "output_tokens_per_second": spread(rates),
            "ttft_ms": distribution(ttfts),
            "achieved_output_tokens": spread([64, 64]),
            "error_rate": 0.25 if concurrency == 2 else 0.0,
        })
        for seq, ttft in enumerate(ttfts):
            requests.append(RequestRow(
                rep=1 + seq // 2, level=f"c={concurrency}", seq=seq, ttft_ms=ttft, prompt_tokens=128,
                completion_tokens=64, finish_reason="length",
            ))
    requests.append(RequestRow(rep=2, level="c=2", seq=4, error="HTTP 500: out of memory"))
    save_run(path, Run(
        kind="throughput", target_url="http://127.0.0.1:8080", model="smollm2", requested_model="smollm2-135m",
        backend_kind="llama.cpp", backend_version="b6000", config_hash="3f2a9c1e", host="bench-box",
        started_at=START, ended_at=START + 41.5, warmup_discarded=1,
        parameters={"input_tokens": 128, "output_tokens": 64, "concurrency": [1, 2], "reps": 2},
        summary={"levels": levels, "client_overhead_ms": 0.21, "scaling_ratio": 1.94},
    ), requests)
    save_run(path, Run(
        kind="grill", target_url="http://127.0.0.1:8080", model="gemma3-270m", started_at=START + 100,
        ended_at=START + 700, summary={"headline": "11.5/18 (11-12)", "score": spread([11, 12])},
    ), [RequestRow(rep=1, level="r2/text_justify", seq=0, error="sandbox: killed after 10 s")])
    save_run(path, Run(
        kind="prefill", target_url="http://127.0.0.1:9107", model="smollm2", started_at=START + 200, status="interrupted",
        summary={"levels": [{"concurrency": 1, "input_tokens": 1024, "ttft_ms": distribution([80.0, 82.0])},
                            {"concurrency": 1, "input_tokens": 8192, "ttft_ms": distribution([610.0, 640.0])}]},
    ))
    return path


def test_list_shows_every_run_oldest_at_the_bottom(db):
    result = runs("list", "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert f"Last 3 runs in {db}" in result.stdout
    first = line_with(result.stdout, "throughput")
    for cell in ("smollm2-135m (smollm2)", "llama.cpp b6000", "272 tok/s at c=2", "9 (1 failed)", "completed",
                 time.strftime("%Y-%m-%d %H:%M", time.localtime(START))):
        assert cell in first, (cell, first)
    second = line_with(result.stdout, "grill")
    assert "gemma3-270m" in second and "11.5/18 (11-12)" in second and "1 (1 failed)" in second
    third = line_with(result.stdout, "prefill")
    assert "TTFT 625 ms at c=1 in=8192" in third and "interrupted" in third
    lines = result.stdout.splitlines()
    assert lines.index(first) < lines.index(second) < lines.index(third)


def test_list_filters(db):
    by_alias = runs("list", "--db", str(db), "--model", "smollm2")  # the throughput run's alias and the prefill's model
    assert "throughput" in by_alias.stdout and "prefill" in by_alias.stdout and "grill" not in by_alias.stdout
    by_kind = runs("list", "--db", str(db), "--kind", "grill")
    assert "gemma3-270m" in by_kind.stdout and "smollm2" not in by_kind.stdout
    latest = runs("list", "--db", str(db), "--limit", "1")
    assert "prefill" in latest.stdout and "grill" not in latest.stdout
    nothing = runs("list", "--db", str(db), "--model", "qwen", "--kind", "grill")
    assert nothing.returncode == 0 and nothing.stdout.strip() == f"No grill runs for qwen in {db}."


def test_show_prints_metadata_parameters_levels_and_errors(db):
    result = runs("show", "1", "--db", str(db))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("Run 1: throughput of smollm2-135m (smollm2), completed")
    for label, value in (("target", "http://127.0.0.1:8080"), ("backend", "llama.cpp b6000"), ("config hash", "3f2a9c1e"),
                         ("host", "bench-box"), ("ended", "(took 41.5 s)"), ("warm-up", "1 repetition run and discarded"),
                         ("requests", "9 measured, 1 failed; 1 warm-up"), ("input_tokens", "128"),
                         ("concurrency", "[1, 2]"), ("client_overhead_ms", "0.21"), ("scaling_ratio", "1.94")):
        assert value in line_with(out, label, value)
    header = line_with(out, "level", "out tok/s")
    assert "TTFT ms p50 / p99" in header and "out tokens" in header and "errors" in header
    assert all(cell in line_with(out, "c=1 ") for cell in ("140 (139-141)", "31.5 / 33.0", "64", "0.0%"))
    assert all(cell in line_with(out, "c=2 ") for cell in ("272 (270-274)", "42.5 / 45.0", "25.0%"))
    assert "1x" in line_with(out, "HTTP 500: out of memory")


def test_show_a_grill_run_and_an_interrupted_one(db):
    grill = runs("show", "2", "--db", str(db))
    assert grill.returncode == 0 and "score" in grill.stdout and "11.5 (11-12)" in line_with(grill.stdout, "score")
    assert "sandbox: killed after 10 s" in grill.stdout and "- (not run through a swaplab router)" in grill.stdout
    prefill = runs("show", "3", "--db", str(db))
    assert prefill.stdout.startswith("Run 3: prefill of smollm2, interrupted") and "ended" not in prefill.stdout
    assert "c=1 in=8192" in prefill.stdout


def test_show_json_is_the_whole_run(db):
    result = runs("show", "1", "--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    assert run["model"] == "smollm2" and run["requested_model"] == "smollm2-135m" and run["config_hash"] == "3f2a9c1e"
    assert run["parameters"]["concurrency"] == [1, 2]
    assert run["summary"]["levels"][1]["output_tokens_per_second"] == {"mean": 272.0, "min": 270.0, "max": 274.0, "n": 2}
    assert len(run["requests"]) == 10 and run["requests"][0]["warmup"] is True
    assert run["requests"][-1]["error"] == "HTTP 500: out of memory"


def one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"swaplab: {message}"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_an_unknown_id_is_one_line_and_exit_2(db):
    one_line_error(runs("show", "99", "--db", str(db)), f"no run 99 in {db}")
    one_line_error(runs("show", "99", "--db", str(db), "--json"), f"no run 99 in {db}")


def test_a_missing_or_unreadable_store_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "nothing-here.db"
    one_line_error(runs("list", "--db", str(missing)), f"no swaplab database at {missing}")
    one_line_error(runs("show", "1", "--db", str(missing)), f"no swaplab database at {missing}")
    assert not missing.exists()  # reading never creates the file
    garbage = tmp_path / "notes.md"
    garbage.write_text("# not a database\n" * 200)
    one_line_error(runs("list", "--db", str(garbage)), f"cannot read {garbage}: file is not a database")
    one_line_error(runs("show", "1", "--db", str(garbage)), f"cannot read {garbage}: file is not a database")
    future = tmp_path / "future.db"
    connect(future).close()
    with closing(sqlite3.connect(future)) as plain:
        plain.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    one_line_error(runs("list", "--db", str(future)), f"{future} has schema version {SCHEMA_VERSION + 1}, newer than this swaplab")


def test_no_runs_yet(tmp_path):
    missing = tmp_path / "default.db"
    result = runs("list", env={"SWAPLAB_DB": str(missing)})
    assert result.returncode == 0 and result.stdout.startswith(f"No runs recorded yet ({missing} does not exist")
    assert not missing.exists()
    one_line_error(runs("show", "1", env={"SWAPLAB_DB": str(missing)}), "no run 1: no runs recorded yet")
    connect(tmp_path / "empty.db").close()
    empty = runs("list", "--db", str(tmp_path / "empty.db"))
    assert empty.returncode == 0 and empty.stdout.strip() == f"No runs in {tmp_path / 'empty.db'}."


def test_piped_at_80_columns_no_figure_is_cut(db):
    # Captured output is a pipe: no terminal to fit, so nothing is folded or cropped.
    listed = runs("list", "--db", str(db), env={"COLUMNS": "80"})
    assert listed.returncode == 0, listed.stderr
    assert "…" not in listed.stdout
    first = line_with(listed.stdout, "throughput")
    for cell in ("smollm2-135m (smollm2)", "llama.cpp b6000", "272 tok/s at c=2", "9 (1 failed)", "completed"):
        assert cell in first, (cell, first)
    assert "interrupted" in line_with(listed.stdout, "TTFT 625 ms at c=1 in=8192")
    shown = runs("show", "1", "--db", str(db), env={"COLUMNS": "80"})
    assert "…" not in shown.stdout
    assert "errors" in line_with(shown.stdout, "level", "out tok/s", "TTFT ms p50 / p99")
    assert "25.0%" in line_with(shown.stdout, "c=2", "272 (270-274)", "42.5 / 45.0")


def test_list_json_is_one_run_per_line_oldest_first(db):
    result = runs("list", "--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    listed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [run["kind"] for run in listed] == ["throughput", "grill", "prefill"]
    assert listed[0]["requested_model"] == "smollm2-135m" and listed[0]["request_count"] == 9
    assert listed[0]["summary"]["scaling_ratio"] == 1.94  # decoded, not a string of JSON
    assert result.stderr == f"3 from {db}\n"
