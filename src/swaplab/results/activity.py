"""The activity table: one row per request the router proxied, and the ways to read it."""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from typing import Any

from swaplab.results.store import connect, transaction


@dataclasses.dataclass(frozen=True, slots=True)
class ActivityRecord:
    """What the router learned about one proxied request."""

    time: float  # unix seconds when the request arrived
    model: str  # the model id, aliases resolved; for a peer, the peer's own model name
    path: str
    status: int
    duration_ms: float
    requested_model: str | None = None  # the name the client sent, alias or id
    peer: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    tokens_per_second: float | None = None  # decode rate
    client_disconnected: bool = False
    error: str | None = None
    session_id: str | None = None  # the client's session (`ui.activity.session_id` headers)
    capture_id: int | None = None  # the id its capture is kept under in the router's memory (`captureBuffer`)
    metadata: str | None = None  # llama-swap's annotations of the request, a JSON object: {"selector": ID}
    waited_for: str | None = None  # `start` or `wake` when the request waited for its model to get ready
    resp_content_type: str | None = None  # the upstream's Content-Type
    prompt_per_second: float | None = None  # prefill rate, the server's own (llama.cpp's timings)
    draft_tokens: int | None = None  # speculative decoding: tokens drafted, as the server reports them
    draft_accepted_tokens: int | None = None  # and accepted


COLUMNS = tuple(field.name for field in dataclasses.fields(ActivityRecord))
_row_of = operator.attrgetter(*COLUMNS)
_INSERT = f"INSERT INTO activity ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"


def insert_activity(connection: sqlite3.Connection, records: Iterable[ActivityRecord]) -> int:
    """Write `records` in one transaction; returns how many."""
    rows = [_row_of(record) for record in records]
    with transaction(connection):
        connection.executemany(_INSERT, rows)
    return len(rows)


Database = str | os.PathLike[str] | sqlite3.Connection | None


def recent_activity(db: Database = None, model: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The latest `limit` rows, newest first, as JSON-ready dicts; `model` matches the id or the name the client sent.

    `db` is a path, an open connection, or None for the default store.
    """
    with opened(db) as connection:
        return _recent(connection, model, limit)


@contextmanager
def opened(db: Database) -> Iterator[sqlite3.Connection]:
    """The caller's connection as it is, or the store at a path opened (and migrated) for the block, then closed."""
    if isinstance(db, sqlite3.Connection):
        yield db
        return
    with closing(connect(db)) as connection:
        yield connection


def _recent(connection: sqlite3.Connection, model: str | None, limit: int) -> list[dict[str, Any]]:
    query = f"SELECT id, {', '.join(COLUMNS)} FROM activity"
    parameters: list[Any] = []
    if model is not None:
        query += " WHERE model = ? OR requested_model = ?"
        parameters += [model, model]
    query += " ORDER BY time DESC, id DESC LIMIT ?"
    parameters.append(limit)
    cursor = connection.execute(query, parameters)
    names = [column[0] for column in cursor.description]  # whatever the connection's row_factory
    rows = []
    for row in cursor:
        entry = dict(zip(names, row))
        entry["client_disconnected"] = bool(entry["client_disconnected"])
        if entry["metadata"] is not None:
            entry["metadata"] = json.loads(entry["metadata"])
        rows.append(entry)
    return rows


def capture_of_row(db: Database, row_id: int) -> int | None:
    """The capture id an activity row keeps (llama-swap's page asks for a capture by the row's id)."""
    with opened(db) as connection:
        found = connection.execute("SELECT capture_id FROM activity WHERE id = ?", (row_id,)).fetchone()
    return found[0] if found is not None else None

