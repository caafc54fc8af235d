"""The SQLite store (real files): migrations, the activity table, the writer, and the metrics page."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import closing

import pytest
from prometheus_client.parser import text_string_to_metric_families
from procs import wait_until

from swaplab.results import store
from swaplab.results.activity import ActivityRecord, insert_activity, recent_activity
from swaplab.results.store import MIGRATIONS, SCHEMA_VERSION, StoreVersionError, connect, schema_version
from swaplab.results.writer import ActivityWriter
from swaplab.metrics import Metrics


def record(number: int = 0, **fields) -> ActivityRecord:
    values = dict(
        time=1_800_000_000.0 + number, model="smollm2", path="/v1/chat/completions", status=200,
        duration_ms=120.0 + number, prompt_tokens=31, completion_tokens=number, ttft_ms=20.0,
    )
    return ActivityRecord(**{**values, **fields})


def rows_in(path) -> list[int]:
    """completion_tokens of every row, in insertion order (the tests number their records with it)."""
    with closing(sqlite3.connect(path)) as connection:
        return [row[0] for row in connection.execute("SELECT completion_tokens FROM activity ORDER BY id")]


# -- the file and its migrations -------------------------------------------------------


def test_a_new_store_is_current_and_in_wal_mode(tmp_path):
    path = tmp_path / "deep" / "swaplab.db"
    with closing(connect(path)) as connection:
        assert schema_version(connection) == SCHEMA_VERSION
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = [row["name"] for row in connection.execute("PRAGMA table_info(activity)")]
    assert columns == [
        "id", "time", "model", "requested_model", "peer", "path", "status", "prompt_tokens", "completion_tokens",
        "cached_tokens", "ttft_ms", "duration_ms", "tokens_per_second", "client_disconnected", "error",
        "session_id", "capture_id", "metadata", "waited_for", "resp_content_type", "prompt_per_second",
        "draft_tokens", "draft_accepted_tokens",
    ]


def test_default_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPLAB_DB", str(tmp_path / "elsewhere.db"))
    with closing(connect()) as connection:
        insert_activity(connection, [record(3)])
    assert rows_in(tmp_path / "elsewhere.db") == [3]


def test_a_file_from_before_the_store_is_migrated_keeping_its_tables(tmp_path):
    path = tmp_path / "old.db"
    with closing(sqlite3.connect(path)) as old:  # version 0: somebody's plain SQLite file
        old.execute("CREATE TABLE notes (text TEXT)")
        old.execute("INSERT INTO notes VALUES ('kept')")
        old.commit()
    with closing(connect(path)) as connection:
        assert schema_version(connection) == SCHEMA_VERSION
        assert connection.execute("SELECT text FROM notes").fetchone()[0] == "kept"
        insert_activity(connection, [record(1)])
    assert rows_in(path) == [1]


def test_an_older_version_is_upgraded_step_by_step_with_its_rows(tmp_path):
    path = tmp_path / "v1.db"
    with closing(connect(path)) as connection:
        insert_activity(connection, [record(7)])
    # What a later swaplab will do: append a migration.
    newer = (*MIGRATIONS, ("ALTER TABLE activity ADD COLUMN note TEXT", "UPDATE activity SET note = 'migrated'"))
    with closing(connect(path, migrations=newer)) as connection:
        assert schema_version(connection) == len(MIGRATIONS) + 1
        assert connection.execute("SELECT completion_tokens, note FROM activity").fetchone()[:] == (7, "migrated")


def test_a_version_3_store_gains_session_and_capture_ids_keeping_its_rows(tmp_path):
    path = tmp_path / "v3.db"
    with closing(connect(path, migrations=MIGRATIONS[:3])) as connection:  # the schema before migration 4
        assert schema_version(connection) == 3
        connection.execute(
            "INSERT INTO activity (time, model, path, status, duration_ms, completion_tokens) "
            "VALUES (1800000000.0, 'smollm2', '/v1/chat/completions', 200, 80.0, 5)"
        )
    with closing(connect(path)) as connection:
        assert schema_version(connection) == SCHEMA_VERSION
        insert_activity(connection, [record(6, session_id="chat-42", capture_id=2**40 + 1)])
    old, new = sorted(recent_activity(path), key=lambda row: row["id"])
    assert (old["completion_tokens"], old["session_id"], old["capture_id"]) == (5, None, None)
    assert (new["completion_tokens"], new["session_id"], new["capture_id"]) == (6, "chat-42", 2**40 + 1)


def test_a_version_4_store_gains_metadata_keeping_its_rows(tmp_path):
    path = tmp_path / "v4.db"
    with closing(connect(path, migrations=MIGRATIONS[:4])) as connection:  # the schema before migration 5
        connection.execute(
            "INSERT INTO activity (time, model, path, status, duration_ms, session_id) "
            "VALUES (1800000000.0, 'smollm2', '/v1/chat/completions', 200, 80.0, 'chat-1')"
        )
    with closing(connect(path)) as connection:
        assert schema_version(connection) == SCHEMA_VERSION
        insert_activity(connection, [record(6, metadata='{"selector": "pool"}')])
    old, new = sorted(recent_activity(path), key=lambda row: row["id"])
    assert (old["session_id"], old["metadata"]) == ("chat-1", None)
    assert new["metadata"] == {"selector": "pool"}  # read back as the object


def test_a_version_5_store_gains_waited_for_keeping_its_rows(tmp_path):
    path = tmp_path / "v5.db"
    with closing(connect(path, migrations=MIGRATIONS[:5])) as connection:  # the schema before migration 6
        connection.execute(
            "INSERT INTO activity (time, model, path, status, duration_ms, metadata) "
            "VALUES (1800000000.0, 'smollm2', '/v1/chat/completions', 200, 80.0, '{\"selector\": \"pool\"}')"
        )
    with closing(connect(path)) as connection:
        assert schema_version(connection) == SCHEMA_VERSION
        insert_activity(connection, [record(6, waited_for="wake")])
    old, new = sorted(recent_activity(path), key=lambda row: row["id"])
    assert (old["metadata"], old["waited_for"]) == ({"selector": "pool"}, None)
    assert new["waited_for"] == "wake"


def test_a_failing_migration_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "v1.db"
    connect(path).close()
    broken = (*MIGRATIONS, ("CREATE TABLE half_done (x INTEGER)", "THIS IS NOT SQL"))
    with pytest.raises(sqlite3.OperationalError):
        connect(path, migrations=broken)
    with closing(sqlite3.connect(path)) as plain:
        assert plain.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert plain.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchone() is None


def test_a_newer_file_is_refused(tmp_path):
    path = tmp_path / "future.db"
    connect(path).close()
    with closing(sqlite3.connect(path)) as plain:
        plain.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreVersionError, match=rf"schema version {SCHEMA_VERSION + 1}, newer than this swaplab"):
        connect(path)


def test_recent_activity_newest_first_filtered_by_id_or_requested_name(tmp_path):
    path = tmp_path / "a.db"
    with closing(connect(path)) as connection:
        insert_activity(connection, [
            record(1),
            record(2, model="gemma", requested_model="gemma3-270m"),
            record(3, client_disconnected=True, error="boom"),
            record(4, model="llama", peer="box", requested_model="box/llama"),
        ])
    rows = recent_activity(path, limit=3)
    assert [row["completion_tokens"] for row in rows] == [4, 3, 2]
    assert rows[1]["client_disconnected"] is True and rows[1]["error"] == "boom"
    assert [row["completion_tokens"] for row in recent_activity(path, model="gemma3-270m")] == [2]
    assert [row["completion_tokens"] for row in recent_activity(path, model="smollm2")] == [3, 1]
    assert rows[0]["peer"] == "box" and set(rows[0]) >= {"id", "time", "ttft_ms", "tokens_per_second"}


# -- the writer ------------------------------------------------------------------------


def test_the_writer_writes_in_batches(tmp_path):
    path = tmp_path / "a.db"
    writer = ActivityWriter(path, batch_size=500, flush_interval=60)
    for number in range(1200):  # queued before the thread starts: one drain sees them all
        writer.submit(record(number))
    with writer:
        assert writer.flush(timeout=10)
        assert (writer.batches, writer.written) == (3, 1200)  # 500 + 500 + 200, one transaction each
    assert rows_in(path) == list(range(1200))


def test_close_flushes_what_the_interval_has_not(tmp_path):
    path = tmp_path / "a.db"
    writer = ActivityWriter(path, batch_size=1000, flush_interval=60)
    writer.start()
    for number in range(10):
        writer.submit(record(number))
    # Not an ordering: nothing is due to happen, this is the time a premature write gets to show.
    time.sleep(0.2)
    assert rows_in(path) == []  # neither the batch size nor the interval was reached
    writer.close()
    assert rows_in(path) == list(range(10))
    assert writer.written == 10 and writer.dropped == 0


def test_a_stalled_database_drops_the_oldest_and_never_blocks(tmp_path, monkeypatch):
    path = tmp_path / "a.db"
    connect(path).close()
    # The writer waits on the lock until this test commits, however slow the machine: its batch
    # neither fails nor lands before then (with the store's 5 s busy timeout, a 5 s stall of this
    # test would fail the batch of 1 and 2).
    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 600_000)
    metrics = Metrics()
    writer = ActivityWriter(path, batch_size=2, max_pending=5, flush_interval=60, on_drop=metrics.records_dropped)
    stall = sqlite3.connect(path, isolation_level=None)
    stall.execute("BEGIN IMMEDIATE")  # another writer holds the lock: the store's writes wait
    with writer:
        writer.submit(record(1))
        writer.submit(record(2))  # a full batch: the writer takes both and waits on the lock
        wait_until(lambda: writer.pending == 0, 5, "the writer to take the full batch")
        assert writer.pending == 0
        # Eight submits while the lock is held. One that waited on the disk would wait for
        # this test's COMMIT, which comes only after they all returned: it would never return.
        submitting = threading.Thread(
            target=lambda: [writer.submit(record(number)) for number in range(3, 11)], daemon=True
        )
        submitting.start()
        submitting.join(timeout=30)
        assert not submitting.is_alive(), "a submit waited on the stalled disk"
        assert (writer.batches, writer.dropped_failed) == (0, 0)  # and the disk has answered nothing yet
        assert writer.dropped_full == 3 and writer.pending == 5
        stall.execute("COMMIT")
        assert writer.flush(timeout=10)
    stall.close()
    assert rows_in(path) == [1, 2, 6, 7, 8, 9, 10]  # 3, 4 and 5 were the oldest waiting
    dropped = {s.name: s.value for f in text_string_to_metric_families(metrics.render()[0].decode()) for s in f.samples}
    assert dropped["swaplab:activity_records_dropped_total"] == 3


def test_a_store_that_cannot_be_opened_fails_at_start(tmp_path):
    path = tmp_path / "future.db"
    connect(path).close()
    with closing(sqlite3.connect(path)) as plain:
        plain.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    with pytest.raises(StoreVersionError):
        ActivityWriter(path).start()
    assert not [t for t in threading.enumerate() if t.name == "swaplab-activity"]


# -- the metrics page --------------------------------------------------------------------


def samples(metrics: Metrics) -> dict[tuple, float]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def test_metrics_render_what_the_router_and_fleet_report():
    metrics = Metrics()
    metrics.observe_request(record(5, ttft_ms=30.0, duration_ms=400.0, prompt_tokens=31, completion_tokens=5))
    metrics.observe_request(record(7, duration_ms=2000.0, ttft_ms=None, prompt_tokens=None, completion_tokens=None,
                                   client_disconnected=True))
    metrics.observe_request(record(0, status=503, model="gemma"))
    metrics.observe_request(record(9, model="llama", peer="box", completion_tokens=9))
    metrics.backend_started("smollm2", 3.2, ok=True)
    metrics.backend_started("gemma", 120.0, ok=False)
    metrics.swap()
    metrics.swap()
    metrics.queue_wait("smollm2", 0.0)
    metrics.queue_wait("gemma", 4.0)
    metrics.peer_availability("box", "llama", True)
    metrics.peer_availability("box", "retired", False)
    metrics.backend_state("smollm2", up=True)
    metrics.backend_state("gemma", up=False)
    got = samples(metrics)

    def value(name, **labels):
        return got[(name, tuple(sorted(labels.items())))]

    assert value("swaplab:requests_total", model="smollm2", status="200") == 2
    assert value("swaplab:requests_total", model="gemma", status="503") == 1
    assert value("swaplab:requests_total", model="box/llama", status="200") == 1
    assert value("swaplab:prompt_tokens_total", model="smollm2") == 31
    assert value("swaplab:generation_tokens_total", model="smollm2") == 5
    assert value("swaplab:generation_tokens_total", model="box/llama") == 9
    assert value("swaplab:client_disconnects_total", model="smollm2") == 1
    assert value("swaplab:time_to_first_token_seconds_count", model="smollm2") == 1
    assert value("swaplab:time_to_first_token_seconds_bucket", model="smollm2", le="0.04") == 1
    assert value("swaplab:time_to_first_token_seconds_bucket", model="smollm2", le="0.02") == 0
    assert value("swaplab:e2e_request_latency_seconds_count", model="smollm2") == 2
    assert value("swaplab:e2e_request_latency_seconds_sum", model="smollm2") == pytest.approx(2.4)
    assert value("swaplab:backend_starts_total", model="smollm2", outcome="ok") == 1
    assert value("swaplab:backend_starts_total", model="gemma", outcome="failed") == 1
    assert value("swaplab:backend_start_seconds_sum", model="smollm2") == pytest.approx(3.2)
    assert ("swaplab:backend_start_seconds_count", (("model", "gemma"),)) not in got
    assert value("swaplab:swaps_total") == 2
    assert value("swaplab:queue_wait_seconds_count", model="gemma") == 1
    assert value("swaplab:queue_wait_seconds_bucket", model="smollm2", le="0.001") == 1
    assert value("swaplab:peer_model_available", peer="box", model="llama") == 1
    assert value("swaplab:peer_model_available", peer="box", model="retired") == 0
    assert value("swaplab:backend_up", model="smollm2") == 1
    assert value("swaplab:backend_up", model="gemma") == 0
    assert samples(Metrics()).get(("swaplab:swaps_total", ())) == 0  # each Metrics has its own registry
