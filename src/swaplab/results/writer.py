"""Recording activity off the request path: `submit` only appends to a queue; a thread writes batches.

A request never waits on the disk. If the disk stalls long enough for the queue to
fill, the oldest records are dropped (and counted) rather than holding anyone up.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from swaplab.results.activity import ActivityRecord, insert_activity
from swaplab.results.loads import LoadRecord, insert_loads
from swaplab.results.store import connect, default_path

log = logging.getLogger("swaplab.results")


class ActivityWriter:
    """Batches activity records into the store from a dedicated thread.

    `submit` is meant to be called from one thread (the router's event loop); `flush`
    and `close` block, so async code calls them through `asyncio.to_thread`.
    """

    def __init__(
        self,
        db: str | Path | None = None,
        *,
        max_pending: int = 10_000,
        batch_size: int = 500,
        flush_interval: float = 0.5,
        on_drop: Callable[[int], None] | None = None,
        on_written: Callable[[range], None] | None = None,
    ):
        self.path = Path(db) if db is not None else default_path()
        self.max_pending = max_pending
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.on_drop = on_drop
        self.on_written = on_written
        """Called from the writing thread with the row ids of each batch written (the live feed's `activity`)."""
        self.written = 0
        self.batches = 0  # transactions committed
        self.dropped_full = 0  # oldest records pushed out of a full queue
        self.dropped_failed = 0  # records in batches the database refused
        # (sequence number, record); deque appends and pops are atomic across threads.
        self._pending: deque[tuple[int, ActivityRecord]] = deque()
        self._loads: deque[LoadRecord] = deque()
        """Finished starts and wakes (fleet/loadclock.py): a handful an hour, written with the next batch."""
        self._submitted = 0
        self._settled = 0  # every record up to this sequence number is written or dropped
        self._settled_changed = threading.Condition()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_failed

    @property
    def pending(self) -> int:
        """Records queued and not yet taken by the writing thread."""
        return len(self._pending)

    def start(self) -> None:
        """Open (and migrate) the store, then start writing; a store that cannot be opened raises here."""
        opened = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(opened, failure), name="swaplab-activity", daemon=True)
        self._thread.start()
        opened.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]

    def submit(self, record: ActivityRecord) -> None:
        """Queue one record; never blocks."""
        if len(self._pending) >= self.max_pending:
            try:
                self._pending.popleft()
            except IndexError:  # the writer emptied it meanwhile
                pass
            else:
                self.dropped_full += 1
                if self.on_drop is not None:
                    self.on_drop(1)
        self._submitted += 1
        self._pending.append((self._submitted, record))
        if len(self._pending) >= self.batch_size:
            self._wake.set()

    def submit_load(self, record: LoadRecord) -> None:
        """Queue one start's or wake's timings; never blocks."""
        self._loads.append(record)
        self._wake.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is written (or dropped); False on timeout."""
        target = self._submitted
        self._wake.set()
        with self._settled_changed:
            return self._settled_changed.wait_for(
                lambda: self._settled >= target or not self._running(), timeout
            ) and self._settled >= target

    def close(self, timeout: float | None = 30.0) -> None:
        """Write what is queued, then stop the thread."""
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("activity writer still busy after %s s; %d records not written", timeout, len(self._pending))
            self._thread = None

    def __enter__(self) -> ActivityWriter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, opened: threading.Event, failure: list[BaseException]) -> None:
        try:
            connection = connect(self.path)
        except BaseException as error:
            failure.append(error)
            opened.set()
            return
        opened.set()
        try:
            while True:
                self._wake.wait(self.flush_interval)
                self._wake.clear()
                closing = self._closing  # read before draining: nothing submitted before close is left behind
                self._drain(connection)
                if closing:
                    return
        finally:
            connection.close()
            with self._settled_changed:
                self._settled_changed.notify_all()

    def _drain(self, connection: sqlite3.Connection) -> None:
        loads = []
        while self._loads:
            loads.append(self._loads.popleft())
        if loads:
            try:
                insert_loads(connection, loads)
            except sqlite3.Error as error:
                log.warning("could not record %d load timings in %s: %s", len(loads), self.path, error)
        while self._pending:
            batch: list[tuple[int, ActivityRecord]] = []
            while len(batch) < self.batch_size:
                try:
                    batch.append(self._pending.popleft())
                except IndexError:
                    break
            if batch:
                self._write(connection, batch)

    def _write(self, connection: sqlite3.Connection, batch: list[tuple[int, ActivityRecord]]) -> None:
        try:
            count = insert_activity(connection, (record for _, record in batch))
            self.written += count
            self.batches += 1
            if self.on_written is not None and count:
                # One transaction's rows take consecutive ids: SQLite lets no other writer in meanwhile.
                last = connection.execute("SELECT last_insert_rowid()").fetchone()[0]
                try:
                    self.on_written(range(last - count + 1, last + 1))
                except Exception:  # a listener must never stop the writer
                    log.exception("telling of %d recorded requests failed", count)
        except sqlite3.Error as error:
            log.warning("could not record %d requests in %s: %s", len(batch), self.path, error)
            self.dropped_failed += len(batch)
            if self.on_drop is not None:
                self.on_drop(len(batch))
        with self._settled_changed:
            # Records dropped from a full queue all precede what this batch held.
            self._settled = batch[-1][0]
            self._settled_changed.notify_all()
