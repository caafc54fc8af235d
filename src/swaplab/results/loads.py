"""The `loads` table: each start's and wake's duration, stage by stage, so the next one's ETA
rests on this machine's history (fleet/loadclock.py reads it back at start)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

KEEP_PER_HISTORY = 10
"""Rows read back per model, kind and command: the most recent ones."""


@dataclass(frozen=True)
class LoadRecord:
    model: str
    kind: str
    """"start" or "wake"."""
    identity: str
    """The command's digest: the loads of one command are one history."""
    seconds: float
    """From spawn (or the wake call) to ready."""
    stages: tuple[tuple[str, float], ...]
    """Each stage's duration, in the order they came."""
    finished_at: float
    """Unix time."""


def insert_loads(connection: sqlite3.Connection, records: Iterable[LoadRecord]) -> int:
    rows = [
        (r.finished_at, r.model, r.kind, r.identity, r.seconds, json.dumps([list(stage) for stage in r.stages]))
        for r in records
    ]
    with connection:
        connection.executemany(
            "INSERT INTO loads (finished_at, model, kind, identity, seconds, stages) VALUES (?, ?, ?, ?, ?, ?)", rows
        )
    return len(rows)


def recent_loads(connection: sqlite3.Connection, keep: int = KEEP_PER_HISTORY) -> list[LoadRecord]:
    """The most recent `keep` loads of every model, kind and command, oldest first."""
    rows = connection.execute(
        """
        SELECT finished_at, model, kind, identity, seconds, stages FROM (
            SELECT *, ROW_NUMBER() OVER (PARTITION BY model, kind, identity ORDER BY finished_at DESC) AS newest
            FROM loads
        ) WHERE newest <= ? ORDER BY finished_at
        """,
        (keep,),
    ).fetchall()
    records = []
    for finished_at, model, kind, identity, seconds, stages in rows:
        try:
            parsed = tuple((str(name), float(duration)) for name, duration in json.loads(stages))
        except (ValueError, TypeError):
            continue  # a row some other writer mangled is no history
        records.append(LoadRecord(model, kind, identity, seconds, parsed, finished_at))
    return records
