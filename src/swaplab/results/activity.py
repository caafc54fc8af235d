"""The activity table: one row per request the router proxied, and the ways to read it."""

from __future__ import annotations

import dataclasses
import operator
import os
import sqlite3
import time
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swaplab.errors import SwaplabError
from swaplab.results.store import connect, default_path, transaction

if TYPE_CHECKING:  # rich is imported by the commands that print, not by the router
    from rich.console import Console
    from rich.table import Table


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
    if isinstance(db, sqlite3.Connection):
        return _recent(db, model, limit)
    with closing(connect(db)) as connection:
        return _recent(connection, model, limit)


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
        rows.append(entry)
    return rows


def activity_table(rows: list[dict[str, Any]], *, title: str | None = None) -> Table:
    """A rich table of activity rows, in the order given."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("time", no_wrap=True)
    table.add_column("model", no_wrap=True)
    table.add_column("path", no_wrap=True)
    table.add_column("status", justify="right")
    table.add_column("tokens in/out", justify="right", no_wrap=True)
    table.add_column("TTFT ms", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("error", overflow="fold")
    today = time.strftime("%Y-%m-%d")
    for row in rows:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["time"]))
        model = row["model"] if row["peer"] is None else f"{row['peer']}/{row['model']}"
        if row["requested_model"] and row["requested_model"] not in (row["model"], model):
            model += f" ({row['requested_model']})"
        status = str(row["status"])
        if row["client_disconnected"]:
            status += " gone"  # the client left before the end
        error = row["error"] or ""
        table.add_row(
            stamp.removeprefix(today + " "),
            model,
            row["path"],
            status,
            f"{_number(row['prompt_tokens'])}/{_number(row['completion_tokens'])}",
            _number(row["ttft_ms"]),
            _number(row["tokens_per_second"], "{:.1f}"),
            _duration(row["duration_ms"]),
            error,
            style="red" if row["status"] >= 400 or error else None,
        )
    return table


def _number(value: float | None, form: str = "{:.0f}") -> str:
    return "-" if value is None else form.format(value)


def _duration(milliseconds: float) -> str:
    if milliseconds < 10_000:
        return f"{milliseconds:.0f} ms"
    return f"{milliseconds / 1000:.1f} s"


def show_activity(db: str | None = None, model: str | None = None, limit: int = 20, console: Console | None = None) -> int:
    """`swaplab activity`: print the latest requests, oldest of them first; returns the exit code."""
    from rich.console import Console

    path = Path(db) if db else default_path()
    console = console or Console()
    if not path.exists():
        if db:
            raise SwaplabError(f"no swaplab database at {path}")
        console.print(f"No activity recorded yet ({path} does not exist: `swaplab serve` creates it).")
        return 0
    rows = recent_activity(path, model=model, limit=limit)
    if not rows:
        console.print(f"No activity{f' for {model}' if model else ''} in {path}.")
        return 0
    rows.reverse()
    console.print(activity_table(rows, title=f"Last {len(rows)} requests in {path}"))
    return 0
