"""The SQLite file every part of swaplab records into: where it lives, its schema, its migrations.

One file holds the router's activity and the bench and grill runs with their requests,
so a reader can join them with plain SQL. The schema version is SQLite's own
`PRAGMA user_version`; `MIGRATIONS` takes a file from version N-1 to N.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

import platformdirs

from swaplab.errors import SwaplabError
from swaplab.ownfolder import make_folders

# Overrides the default location for every command and the router (tests use it too).
DB_ENVIRONMENT_VARIABLE = "SWAPLAB_DB"
BUSY_TIMEOUT_MS = 5000

# Migration N (1-based) takes a file from schema version N-1 to N. Append new
# migrations at the end; never edit one that has shipped: files in the wild ran it.
Migration = Sequence[str]
MIGRATIONS: tuple[Migration, ...] = (
    # 1: every request the router proxied.
    (
        """
        CREATE TABLE activity (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,                  -- unix seconds when the request arrived
            model TEXT NOT NULL,                 -- the model id, aliases resolved (a peer's own name for peers)
            requested_model TEXT,                -- the name the client sent, alias or id
            peer TEXT,                           -- the peer that served it; NULL when local
            path TEXT NOT NULL,
            status INTEGER NOT NULL,
            prompt_tokens INTEGER,               -- NULL when the upstream reported no usage
            completion_tokens INTEGER,
            cached_tokens INTEGER,
            ttft_ms REAL,                        -- first streamed chunk; NULL when not streamed
            duration_ms REAL NOT NULL,
            tokens_per_second REAL,              -- decode rate
            client_disconnected INTEGER NOT NULL DEFAULT 0,
            error TEXT
        )
        """,
        "CREATE INDEX activity_by_time ON activity (time)",
        "CREATE INDEX activity_by_model ON activity (model, time)",
    ),
    # 2: bench and grill runs, and every request they sent (swaplab.results.runs).
    (
        """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL,                  -- throughput | prefill | prefix-cache | grill | ...
            target_url TEXT NOT NULL,            -- the router or backend the run was sent to
            model TEXT NOT NULL,                 -- the name the user asked for (--model): an id or an alias
            alias TEXT,                          -- the other name: the id the server resolved it to, when different
            backend_kind TEXT,                   -- llama.cpp | vllm | sglang | sim | ..., as the server reports it
            backend_version TEXT,
            config_hash TEXT,                    -- the router's config entry hash; NULL when not run through swaplab
            host TEXT,                           -- the machine the client ran on
            swaplab_version TEXT NOT NULL,
            parameters TEXT NOT NULL DEFAULT '{}',  -- JSON: every setting the run was made with
            started_at REAL NOT NULL,            -- unix seconds
            ended_at REAL,
            warmup_discarded INTEGER NOT NULL DEFAULT 0,  -- warm-up repetitions run and left out of the summary
            summary TEXT NOT NULL DEFAULT '{}',  -- JSON: the figures the run reported
            status TEXT NOT NULL                 -- completed | failed | interrupted
        )
        """,
        "CREATE INDEX runs_by_model ON runs (model, started_at)",
        "CREATE INDEX runs_by_alias ON runs (alias, started_at)",
        "CREATE INDEX runs_by_kind ON runs (kind, started_at)",
        "CREATE INDEX runs_by_time ON runs (started_at)",
        """
        CREATE TABLE requests (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            rep INTEGER NOT NULL,                -- repetition (warm-up ones carry warmup = 1)
            level TEXT NOT NULL,                 -- c=4 | rate=2.0 | in=8192 | a grill task | ...
            seq INTEGER NOT NULL,                -- order within the rep and level
            sent_at REAL,                        -- unix seconds
            first_token_at REAL,                 -- first chunk carrying content, reasoning or a tool call
            end_at REAL,
            ttft_ms REAL,
            tpot_ms REAL,                        -- (e2e - ttft) / (completion_tokens - 1)
            e2e_ms REAL,
            prompt_tokens INTEGER,               -- as the server counted them
            completion_tokens INTEGER,
            cached_tokens INTEGER,
            reasoning_tokens INTEGER,
            finish_reason TEXT,
            error TEXT,                          -- NULL when the request succeeded
            warmup INTEGER NOT NULL DEFAULT 0,
            data TEXT                            -- JSON extras: ITL list, transcript reference, ...
        )
        """,
        "CREATE INDEX requests_by_run ON requests (run_id, rep, level, seq)",
    ),
    # 3: runs name their model as the activity table does: `model` is the id the server
    # resolved, `requested_model` the name asked for when it differs. Version 2 had them the
    # other way round, the resolved id in a column called `alias`; its rows are swapped here.
    (
        "ALTER TABLE runs RENAME COLUMN alias TO requested_model",
        "UPDATE runs SET model = requested_model, requested_model = model WHERE requested_model IS NOT NULL",
        "DROP INDEX runs_by_alias",
        "CREATE INDEX runs_by_requested_model ON runs (requested_model, started_at)",
    ),
    # 4: the client's session id (`ui.activity.session_id`) and the id of the request's
    # capture in the router's memory (`captureBuffer`, `GET /api/captures/{id}`). Older
    # rows have neither.
    (
        "ALTER TABLE activity ADD COLUMN session_id TEXT",
        "ALTER TABLE activity ADD COLUMN capture_id INTEGER",
    ),
    # 5: llama-swap's metadata of a request (`{"selector": ID}` when a selector routed it),
    # a JSON object. Older rows have none.
    ("ALTER TABLE activity ADD COLUMN metadata TEXT",),
    # 6: what a queued request waited for: `start` (a cold start) or `wake` (a sleeping
    # model woken); NULL when its model was ready. Older rows have none.
    ("ALTER TABLE activity ADD COLUMN waited_for TEXT",),
    # 7: what llama-swap's activity view shows that rows did not keep: the response's
    # Content-Type, the server's prefill rate, speculative decoding's drafted and accepted
    # tokens. Older rows have none.
    (
        "ALTER TABLE activity ADD COLUMN resp_content_type TEXT",
        "ALTER TABLE activity ADD COLUMN prompt_per_second REAL",
        "ALTER TABLE activity ADD COLUMN draft_tokens INTEGER",
        "ALTER TABLE activity ADD COLUMN draft_accepted_tokens INTEGER",
    ),
    # 8: how long each start and wake took, stage by stage: the ETA of the next one
    # (results/loads.py, fleet/loadclock.py).
    (
        """
        CREATE TABLE loads (
            id INTEGER PRIMARY KEY,
            finished_at REAL NOT NULL,           -- unix seconds when the model was ready
            model TEXT NOT NULL,
            kind TEXT NOT NULL,                  -- start | wake
            identity TEXT NOT NULL,              -- digest of the command: another command, another history
            seconds REAL NOT NULL,               -- spawn (or wake call) to ready
            stages TEXT NOT NULL                 -- JSON [[stage, seconds], ...] in order
        )
        """,
        "CREATE INDEX loads_by_model ON loads (model, kind, identity, finished_at)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


class StoreVersionError(SwaplabError):
    """The file was written by a newer swaplab than this one."""


def default_path() -> Path:
    """`$SWAPLAB_DB`, else `swaplab.db` in the user's data directory."""
    override = os.environ.get(DB_ENVIRONMENT_VARIABLE)
    if override:
        return Path(override)
    return Path(platformdirs.user_data_dir("swaplab")) / "swaplab.db"


def existing_store(db: str | os.PathLike[str] | None) -> Path | None:
    """The store a reader opens: `db`, which must exist, else the default one if it exists (None when not).

    Reading never creates a file: a command that only reads says there is nothing yet.
    """
    if db:
        path = Path(db)
        if not path.is_file():
            raise SwaplabError(f"no swaplab database at {path}")
        return path
    path = default_path()
    return path if path.is_file() else None


@contextmanager
def reading(path: Path) -> Iterator[sqlite3.Connection]:
    """The store at `path`, open for reading; a file that is not one raises SwaplabError saying so."""
    try:
        with closing(connect(path)) as connection:
            yield connection
    except sqlite3.DatabaseError as error:
        raise SwaplabError(f"cannot read {path}: {error} (is it a swaplab database?)") from None


def connect(path: str | os.PathLike[str] | None = None, *, migrations: Sequence[Migration] = MIGRATIONS) -> sqlite3.Connection:
    """Open (creating if needed) the store at `path` or the default one, migrated to the current schema.

    The connection is in autocommit mode: write batches inside `with transaction(connection):`.
    """
    target = Path(path) if path is not None else default_path()
    make_folders(target.parent)  # the ones it makes 0700: the store holds what clients asked
    create_private(target)
    connection = sqlite3.connect(target, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        connection.row_factory = sqlite3.Row
        # WAL: readers (`swaplab activity`, the UI) never block the router's writes.
        # NORMAL is durable across application crashes in WAL mode and needs no fsync per commit.
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        migrate(connection, migrations, name=str(target))
    except BaseException:
        connection.close()
        raise
    return connection


def create_private(target: Path) -> None:
    """Create the store's file readable and writable by its owner only (0600), if it does not exist yet.

    It holds what clients asked and were answered; SQLite would create it 0644. Its `-wal` and
    `-shm` files take the database file's mode, so they are private too. A file that exists
    keeps the mode its owner gave it.
    """
    if str(target) == ":memory:":
        return
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def schema_version(connection: sqlite3.Connection) -> int:
    return connection.execute("PRAGMA user_version").fetchone()[0]


def migrate(connection: sqlite3.Connection, migrations: Sequence[Migration] = MIGRATIONS, *, name: str = "the store") -> int:
    """Apply the migrations the file lacks, each in its own transaction; returns the final version.

    Two processes opening an old file at once are safe: each step re-reads the version
    under a write lock and skips what the other already did.
    """
    latest = len(migrations)
    version = schema_version(connection)
    if version > latest:
        raise StoreVersionError(
            f"{name} has schema version {version}, newer than this swaplab understands ({latest}); "
            "upgrade swaplab, or point --db at another file"
        )
    while version < latest:
        connection.execute("BEGIN IMMEDIATE")
        try:
            version = schema_version(connection)
            if version < latest:
                for statement in migrations[version]:
                    connection.execute(statement)
                version += 1
                # user_version is part of the file header, so it commits or rolls back with the step.
                connection.execute(f"PRAGMA user_version = {version}")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
    return version


@contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """`with transaction(connection):` runs the block as one write transaction."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
