"""`swaplab activity` as a real process on a real database."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing

import aiohttp

from observed_proxy import RelayProxy
from procs import SwaplabProcess, free_port
from swaplab.results.activity import ActivityRecord
from swaplab.results.writer import ActivityWriter
from swaplab.results.store import SCHEMA_VERSION, connect


def activity(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swaplab", "activity", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_shows_rows_written_through_the_writer(tmp_path):
    db = tmp_path / "swaplab.db"
    with ActivityWriter(db) as writer:
        writer.submit(ActivityRecord(
            time=1_800_000_000.0, model="smollm2", path="/v1/chat/completions", status=200, duration_ms=431.2,
            requested_model="smollm2-135m", prompt_tokens=31, completion_tokens=24, cached_tokens=30,
            ttft_ms=38.6, tokens_per_second=141.93,
        ))
        writer.submit(ActivityRecord(
            time=1_800_000_005.0, model="gemma3-270m", path="/v1/completions", status=502, duration_ms=12.0,
            error="the backend stopped mid-stream: boom",
        ))
    result = activity("--db", str(db))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(line for line in lines if "smollm2" in line)
    second = next(line for line in lines if "gemma3-270m" in line)
    assert lines.index(first) < lines.index(second)  # oldest first, the latest at the bottom
    for cell in ("smollm2 (smollm2-135m)", "/v1/chat/completions", "200", "31/24", "39", "141.9", "431 ms"):
        assert cell in first, (cell, first)
    for cell in ("502", "-/-", "12 ms", "the backend stopped mid-stream: boom"):
        assert cell in second, (cell, second)

    only = activity("--db", str(db), "--model", "smollm2-135m")
    assert "smollm2" in only.stdout and "gemma3-270m" not in only.stdout
    latest = activity("--db", str(db), "--limit", "1")
    assert "gemma3-270m" in latest.stdout and "smollm2" not in latest.stdout


def test_a_session_column_only_when_a_row_names_a_session(tmp_path):
    db = tmp_path / "swaplab.db"
    row = {"model": "smollm2", "path": "/v1/chat/completions", "status": 200, "duration_ms": 40.0}
    with ActivityWriter(db) as writer:
        writer.submit(ActivityRecord(time=1_800_000_000.0, **row))

    def header(lines: list[str]) -> str:
        return next(line for line in lines if "┃ time" in line)

    assert "┃ session" not in header(activity("--db", str(db)).stdout.splitlines())
    with ActivityWriter(db) as writer:
        writer.submit(ActivityRecord(time=1_800_000_001.0, session_id="chat-7f3a", **row))
    lines = activity("--db", str(db)).stdout.splitlines()
    assert "┃ session" in header(lines)
    [without, with_session] = [line for line in lines if "smollm2" in line]
    assert "chat-7f3a" in with_session and "chat-7f3a" not in without and " - " in without


async def test_shows_a_request_that_just_went_through_the_relay(tmp_path):
    port = free_port()
    sim = SwaplabProcess(["sim", "--port", str(port), "--model", "sim-a"], tmp_path / "sim.log")
    db = tmp_path / "swaplab.db"
    try:
        sim.wait_http(f"http://127.0.0.1:{port}/health")
        with ActivityWriter(db) as writer:
            async with RelayProxy(f"http://127.0.0.1:{port}", model="sim-a", sink=writer.submit) as proxy:
                async with aiohttp.ClientSession() as session:
                    body = {"model": "sim-a", "prompt": "one two three four", "max_tokens": 9, "stream": True,
                            "stream_options": {"include_usage": True}}
                    async with session.post(f"{proxy.url}/v1/completions", json=body) as response:
                        assert response.status == 200
                        await response.read()
    finally:
        sim.close()
    result = activity("--db", str(db))
    [row] = [line for line in result.stdout.splitlines() if "sim-a" in line]
    assert "/v1/completions" in row and "200" in row and "4/9" in row


def test_an_empty_or_missing_store(tmp_path):
    missing = tmp_path / "nothing-here.db"
    result = activity(env={"SWAPLAB_DB": str(missing)})
    assert result.returncode == 0 and "No activity recorded yet" in result.stdout
    assert not missing.exists()  # reading never creates the file
    result = activity("--db", str(missing))
    assert result.returncode == 2 and result.stderr.strip() == f"swaplab: no swaplab database at {missing}"
    connect(tmp_path / "empty.db").close()
    result = activity("--db", str(tmp_path / "empty.db"), "--model", "x")
    assert result.returncode == 0 and "No activity for x" in result.stdout


def test_a_store_from_a_newer_swaplab_is_refused_in_one_line(tmp_path):
    db = tmp_path / "future.db"
    connect(db).close()
    with closing(sqlite3.connect(db)) as plain:
        plain.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    result = activity("--db", str(db))
    assert result.returncode == 2
    assert result.stderr.startswith(f"swaplab: {db} has schema version {SCHEMA_VERSION + 1}, newer than this swaplab")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def busy_store(path) -> None:
    """Rows whose cells are long: a session, an error, a long model name."""
    with ActivityWriter(path) as writer:
        writer.submit(ActivityRecord(
            time=1_800_000_000.0, model="qwen3-coder-30b-a3b-instruct", path="/v1/chat/completions", status=200,
            duration_ms=12_431.2, requested_model="coder-assistant", prompt_tokens=31_000, completion_tokens=2_400,
            cached_tokens=30_000, ttft_ms=1_838.6, tokens_per_second=141.93, session_id="chat-7f3a-long-session",
        ))
        writer.submit(ActivityRecord(
            time=1_800_000_005.0, model="gemma3-270m", path="/v1/completions", status=502, duration_ms=12.0,
            error="the backend stopped mid-stream: connection reset by peer",
        ))


def test_piped_at_80_columns_no_cell_is_cut(tmp_path):
    db = tmp_path / "swaplab.db"
    busy_store(db)
    result = activity("--db", str(db), env={"COLUMNS": "80"})  # captured: stdout is a pipe
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    [first] = [line for line in result.stdout.splitlines() if "qwen3-coder-30b-a3b-instruct (coder-assistant)" in line]
    for cell in ("chat-7f3a-long-session", "31000/2400", "1839", "141.9", "12.4 s"):
        assert cell in first, (cell, first)
    assert "the backend stopped mid-stream: connection reset by peer" in result.stdout
    assert f"in {db}" in result.stdout.splitlines()[0]  # the store it read, in the title


def test_json_is_one_object_per_request_oldest_first_and_the_store_on_stderr(tmp_path):
    import json

    db = tmp_path / "swaplab.db"
    busy_store(db)
    result = activity("--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["model"] for row in rows] == ["qwen3-coder-30b-a3b-instruct", "gemma3-270m"]
    assert rows[0]["session_id"] == "chat-7f3a-long-session" and rows[1]["status"] == 502
    assert result.stderr == f"2 from {db}\n"
    empty = activity("--db", str(db), "--json", "--model", "nope")
    assert (empty.returncode, empty.stdout) == (0, "") and f"No activity for nope in {db}" in empty.stderr
