"""The client-overhead figure every bench report carries, and where it comes from.

`swaplab bench selftest` stores its measurement as a run of kind "selftest". A bench run
quotes the latest one made on this host by this swaplab version; when there is none (or
with `--selftest`), it first measures a quick one (64 streams, 32 tokens, three pairs of
rounds: about five seconds) and stores that. The figure describes the machine and the
client, not the target, so it need not be re-measured before every run; a stale one is
one command away from fresh.
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict, dataclass
from typing import Protocol

from swaplab import __version__
from swaplab.bench.selftest import SIM_MODEL, SelftestReport, SelftestSettings, measure
from swaplab.results.runs import Run, list_runs, save_run

QUICK = SelftestSettings(streams=64, output_tokens=32, rounds=3)


class _Phases(Protocol):
    def phase(self, description: str) -> None: ...


@dataclass(frozen=True)
class OverheadFigure:
    milliseconds: float | None  # what the client adds to TTFT p50 at the selftest's concurrency
    run_id: int | None  # the selftest run it comes from
    source: str  # in words, for reports


async def client_overhead(db: str | None, *, fresh: bool = False, observer: _Phases | None = None) -> OverheadFigure:
    """The latest stored selftest's figure for this host and version; measured (and stored) first if none."""
    if not fresh:
        stored = latest_selftest(db)
        if stored is not None:
            return _figure(stored["id"], stored["summary"], stored["started_at"])
    if observer is not None:
        observer.phase("measuring the client's own overhead (selftest)")
    report, started_at, ended_at = await timed_measure(QUICK)
    run_id = save_selftest(db, report, started_at=started_at, ended_at=ended_at)
    return _figure(run_id, report.summary(), started_at)


async def timed_measure(settings: SelftestSettings) -> tuple[SelftestReport, float, float]:
    started_at = time.time()
    report = await measure(settings)
    return report, started_at, time.time()


def latest_selftest(db: str | None) -> dict | None:
    """The newest completed selftest run of this host and swaplab version, or None."""
    host = socket.gethostname()
    for run in list_runs(db, kind="selftest", limit=100):
        if run["host"] == host and run["swaplab_version"] == __version__ and run["status"] == "completed":
            return run
    return None


def save_selftest(db: str | None, report: SelftestReport, *, started_at: float, ended_at: float) -> int:
    """Store a selftest as a run of kind "selftest"; its summary carries `client_overhead_ms`."""
    summary = report.summary()
    run = Run(
        kind="selftest",
        target_url="swaplab sim (started by the selftest)",
        model=SIM_MODEL,
        backend_kind="swaplab-sim",
        backend_version=__version__,
        parameters=asdict(report.settings),
        started_at=started_at,
        ended_at=ended_at,
        summary=summary,
        status="completed" if summary["failed"] == 0 else "failed",
    )
    return save_run(db, run)


def _figure(run_id: int, summary: dict, started_at: float) -> OverheadFigure:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started_at))
    return OverheadFigure(summary.get("client_overhead_ms"), run_id, f"selftest run {run_id} ({when})")
