"""Bench and grill runs in the store: one `runs` row per run, one `requests` row per request it sent.

A run is written whole, in one transaction, when it ends (`save_run`): a run that fails
or is interrupted before that leaves nothing behind, and a reader never sees half of one.
Names, as in the activity table: `model` is the id the server resolved the name to;
`requested_model` is the name the user asked for (`--model`) when it differs, an alias.
Readers match either, so results asked for by an alias count for the model
(`runs_for_models`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import PurePath
from typing import Any, Protocol

from swaplab import __version__
from swaplab.results.store import connect, transaction

Database = str | os.PathLike[str] | sqlite3.Connection | None
"""A path, an open connection, or None for the default store (`$SWAPLAB_DB` or the data directory)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """What a run was: what it measured, against what, how, and what it found."""

    kind: str  # "throughput" | "prefill" | "prefix-cache" | "grill" | ...
    target_url: str
    model: str  # the model id, as the server resolved the name asked for
    started_at: float  # unix seconds
    requested_model: str | None = None  # the name asked for (an alias), when it differs from `model`
    backend_kind: str | None = None  # as the server reports itself: "llama.cpp", "vllm", "sglang", "sim"
    backend_version: str | None = None
    config_hash: str | None = None  # the router's hash of the model's config entry; None when not through swaplab
    host: str | None = dataclasses.field(default_factory=socket.gethostname)
    swaplab_version: str = __version__
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # every setting, JSON-ready
    ended_at: float | None = None
    warmup_discarded: int = 0  # warm-up repetitions run and left out of the summary
    summary: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the figures reported, JSON-ready
    status: str = "completed"  # "completed" | "failed" | "interrupted"


@dataclasses.dataclass(frozen=True, slots=True)
class RequestRow:
    """One request of a run, as the client saw it; None where it learned nothing."""

    rep: int  # repetition number
    level: str  # "c=4", "rate=2.0", "in=8192", a grill task name, ...
    seq: int  # order within its rep and level
    sent_at: float | None = None  # unix seconds
    first_token_at: float | None = None  # first chunk carrying content, reasoning or a tool call
    end_at: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    prompt_tokens: int | None = None  # the server's own counts
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None  # None when the request succeeded
    warmup: bool = False
    data: Mapping[str, Any] | None = None  # extras, JSON-ready: ITL list, transcript reference, ...


class ServedModel(Protocol):
    """What a run knows of the server it measured (`swaplab.client.ServerInfo` is one)."""

    @property
    def url(self) -> str: ...
    @property
    def model(self) -> str: ...  # the name asked for
    @property
    def model_id(self) -> str: ...  # the id it resolved to
    @property
    def backend_kind(self) -> str | None: ...
    @property
    def backend_version(self) -> str | None: ...
    @property
    def config_hash(self) -> str | None: ...


def served_run(
    kind: str, server: ServedModel, *, started_at: float, ended_at: float, parameters: Mapping[str, Any],
    summary: Mapping[str, Any], all_failed: bool, warmup_discarded: int = 0,
) -> Run:
    """The record of a bench or grill run against `server`: what it measured, named as the store names it."""
    return Run(
        kind=kind,
        target_url=server.url,
        model=server.model_id,
        requested_model=server.model if server.model != server.model_id else None,
        backend_kind=server.backend_kind,
        backend_version=server.backend_version,
        config_hash=server.config_hash,
        parameters=parameters,
        started_at=started_at,
        ended_at=ended_at,
        warmup_discarded=warmup_discarded,
        summary=summary,
        status="failed" if all_failed else "completed",
    )


RUN_COLUMNS = tuple(field.name for field in dataclasses.fields(Run))
REQUEST_COLUMNS = tuple(field.name for field in dataclasses.fields(RequestRow))
_JSON_RUN_COLUMNS = ("parameters", "summary")
_INSERT_RUN = f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' for _ in RUN_COLUMNS)})"
_INSERT_REQUEST = (
    f"INSERT INTO requests (run_id, {', '.join(REQUEST_COLUMNS)}) "
    f"VALUES (?, {', '.join('?' for _ in REQUEST_COLUMNS)})"
)
# Counts of measured requests (warm-up left out), read with every run.
_SELECT_RUNS = (
    "SELECT runs.*, "
    "(SELECT count(*) FROM requests WHERE run_id = runs.id AND NOT warmup) AS request_count, "
    "(SELECT count(*) FROM requests WHERE run_id = runs.id AND NOT warmup AND error IS NOT NULL) AS error_count "
    "FROM runs"
)


# -- writing ---------------------------------------------------------------------------


def save_run(db: Database, run: Run, requests: Iterable[RequestRow] = ()) -> int:
    """Write the run and its requests in one transaction; returns the run's id.

    `requests` may be a generator: if iterating it raises, nothing of the run is written.
    """
    if not run.kind or not run.model:
        raise ValueError("a run needs a kind and a model")
    values = [_json(getattr(run, name)) if name in _JSON_RUN_COLUMNS else getattr(run, name) for name in RUN_COLUMNS]
    with _opened(db) as connection, transaction(connection):
        run_id = connection.execute(_INSERT_RUN, values).lastrowid
        connection.executemany(_INSERT_REQUEST, (_request_values(run_id, request) for request in requests))
    return run_id


def _request_values(run_id: int, request: RequestRow) -> list[Any]:
    values: list[Any] = [run_id]
    for name in REQUEST_COLUMNS:
        value = getattr(request, name)
        if name == "data":
            value = None if value is None else _json(value)
        elif name == "warmup":
            value = int(bool(value))
        values.append(value)
    return values


def _json(value: Any) -> str:
    """JSON that any reader accepts: NaN and infinities become null, paths and dataclasses plain values."""
    return json.dumps(_finite(value), default=_plain, ensure_ascii=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _finite(dataclasses.asdict(value))
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable: {value!r}")


# -- reading ---------------------------------------------------------------------------


def list_runs(db: Database = None, *, model: str | None = None, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The latest `limit` runs, newest first, without their requests; `model` matches the id or the name asked for.

    Each is a dict of the `runs` columns (parameters and summary decoded) plus
    `request_count` and `error_count` (warm-up requests left out).
    """
    conditions: list[str] = []
    parameters: list[Any] = []
    if model is not None:
        conditions.append("(model = ? OR requested_model = ?)")
        parameters += [model, model]
    if kind is not None:
        conditions.append("kind = ?")
        parameters.append(kind)
    query = _SELECT_RUNS + (f" WHERE {' AND '.join(conditions)}" if conditions else "")
    query += " ORDER BY started_at DESC, id DESC LIMIT ?"
    parameters.append(limit)
    with _opened(db) as connection:
        return [_run_dict(row) for row in _rows(connection, query, parameters)]


def get_run(db: Database, run_id: int) -> dict[str, Any] | None:
    """One run as `list_runs` gives it, plus `requests` (every request, warm-up included, in the order written); None if unknown."""
    with _opened(db) as connection:
        runs = _rows(connection, _SELECT_RUNS + " WHERE id = ?", [run_id])
        if not runs:
            return None
        run = _run_dict(runs[0])
        requests = _rows(connection, "SELECT * FROM requests WHERE run_id = ? ORDER BY id", [run_id])
    run["requests"] = [_request_dict(row) for row in requests]
    return run


def runs_for_models(db: Database, names: Iterable[str], kind: str | Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Runs of any of `names` (an id and its aliases), as model or as the name asked for, oldest first, without requests.

    `kind` narrows them to one kind or several (`("throughput", "prefill")`).
    """
    wanted = sorted(set(names))
    if not wanted:
        return []
    marks = ", ".join("?" for _ in wanted)
    query = _SELECT_RUNS + f" WHERE (model IN ({marks}) OR requested_model IN ({marks}))"
    parameters: list[Any] = [*wanted, *wanted]
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else sorted(set(kind))
        query += f" AND kind IN ({', '.join('?' for _ in kinds)})"
        parameters += kinds
    query += " ORDER BY started_at, id"
    with _opened(db) as connection:
        return [_run_dict(row) for row in _rows(connection, query, parameters)]


def recorded_models(db: Database = None) -> list[str]:
    """Every name runs were recorded under (ids and the names asked for), sorted: ids that may survive only in results."""
    query = "SELECT model FROM runs UNION SELECT requested_model FROM runs WHERE requested_model IS NOT NULL ORDER BY 1"
    with _opened(db) as connection:
        return [row["model"] for row in _rows(connection, query, [])]


@contextmanager
def _opened(db: Database) -> Iterator[sqlite3.Connection]:
    if isinstance(db, sqlite3.Connection):
        yield db
        return
    with closing(connect(db)) as connection:
        yield connection


def _rows(connection: sqlite3.Connection, query: str, parameters: list[Any]) -> list[dict[str, Any]]:
    cursor = connection.execute(query, parameters)
    names = [column[0] for column in cursor.description]  # whatever the connection's row_factory
    return [dict(zip(names, row)) for row in cursor]


def _run_dict(row: dict[str, Any]) -> dict[str, Any]:
    for name in _JSON_RUN_COLUMNS:
        row[name] = json.loads(row[name]) if row[name] else {}
    return row


def _request_dict(row: dict[str, Any]) -> dict[str, Any]:
    row["warmup"] = bool(row["warmup"])
    row["data"] = json.loads(row["data"]) if row["data"] else None
    return row
