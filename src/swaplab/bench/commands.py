"""The `swaplab bench` commands: what cli.py calls, with their console output."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from swaplab.bench.compare import MIN_EFFECT, compare_runs, sentences
from swaplab.bench.overhead import save_selftest, timed_measure
from swaplab.bench.report import ProgressBar, report_document, show_outcome
from swaplab.bench.run import BenchSettings, execute
from swaplab.bench.selftest import SelftestReport, SelftestSettings
from swaplab.results.report import check_report_path, write_report
from swaplab.results.store import default_path

if TYPE_CHECKING:
    from rich.console import Console


def run_command(settings: BenchSettings, *, json_path: str | None = None, console: Console | None = None) -> int:
    """`swaplab bench throughput|prefill|prefix-cache`: run, store, print; 0, or 1 when every request failed."""
    from rich.console import Console

    console = console or Console()
    check_report_path(json_path)
    with ProgressBar(console) as progress:
        outcome = asyncio.run(execute(settings, progress))
    if json_path:
        write_report(json_path, report_document(outcome))
    show_outcome(outcome, console, db_path=str(settings.db or default_path()), json_path=json_path)
    return 0 if outcome.run.status == "completed" else 1


def compare_command(
    db: str | None, a: int, b: int, *, min_effect: float = MIN_EFFECT, console: Console | None = None
) -> int:
    """`swaplab bench compare A B`: one verdict per level, then the overall one."""
    from rich.console import Console

    console = console or Console()
    for line in sentences(compare_runs(db, a, b, min_effect=min_effect)):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def selftest_command(
    db: str | None, settings: SelftestSettings, *, json_path: str | None = None, console: Console | None = None
) -> int:
    """`swaplab bench selftest`: measure the client against a sim, store it, print the comparison."""
    from rich.console import Console

    console = console or Console()
    check_report_path(json_path)
    with console.status(f"selftest: {settings.streams} streams from a sim, {settings.rounds} pairs of rounds"):
        report, started_at, ended_at = asyncio.run(timed_measure(settings))
    run_id = save_selftest(db, report, started_at=started_at, ended_at=ended_at)
    summary = report.summary()
    if json_path:
        write_report(json_path, {"run_id": run_id, "settings": asdict(settings), **summary})
    console.print(selftest_table(report, summary))
    console.print(
        f"The client adds {summary['client_overhead_ms']:.2f} ms to TTFT p50 over the raw reader "
        f"(median over {settings.rounds} back-to-back pairs of rounds) and keeps {summary['client_stream_rate_ratio']:.1%} of the sim's per-stream token rate. "
        f"Stored as run {run_id} in {db or default_path()}; bench reports on this host quote it as client_overhead_ms.",
        highlight=False,
    )
    return 0 if summary["failed"] == 0 else 1


def selftest_table(report: SelftestReport, summary: dict[str, Any]):
    """The sim's configured figures, the raw reader's and the client's, side by side."""
    from rich.table import Table

    settings = report.settings
    table = Table(
        title=f"selftest: {settings.streams} concurrent streams, sim at {settings.ttft_ms:g} ms TTFT and "
        f"{settings.tokens_per_second:g} tok/s per stream, {settings.output_tokens} tokens each, "
        f"{settings.rounds} pairs of rounds",
        title_justify="left",
    )
    table.add_column("")
    table.add_column("sim (configured)", justify="right")
    table.add_column("raw aiohttp reader", justify="right")
    table.add_column("swaplab client", justify="right")
    table.add_column("client / raw", justify="right")
    raw_ttft, client_ttft = summary["raw_ttft_ms"], summary["client_ttft_ms"]
    raw_tpot, client_tpot = summary["raw_tpot_ms"], summary["client_tpot_ms"]
    table.add_row(
        "TTFT p50 ms", f"{settings.ttft_ms:.2f}", f"{raw_ttft['p50']:.2f}", f"{client_ttft['p50']:.2f}",
        f"{client_ttft['p50'] / raw_ttft['p50']:.4f}",
    )
    table.add_row(
        "TTFT p99 ms", f"{settings.ttft_ms:.2f}", f"{raw_ttft['p99']:.2f}", f"{client_ttft['p99']:.2f}",
        f"{client_ttft['p99'] / raw_ttft['p99']:.4f}",
    )
    table.add_row(
        "TPOT p50 ms", f"{summary['ideal_tpot_ms']:.3f}", f"{raw_tpot['p50']:.3f}", f"{client_tpot['p50']:.3f}",
        f"{client_tpot['p50'] / raw_tpot['p50']:.4f}",
    )
    table.add_row(
        "tok/s, all streams", f"{summary['ideal_aggregate_tokens_per_second']:.0f}",
        f"{summary['raw_aggregate_tokens_per_second']:.0f}", f"{summary['client_aggregate_tokens_per_second']:.0f}",
        f"{summary['client_aggregate_tokens_per_second'] / summary['raw_aggregate_tokens_per_second']:.4f}",
    )
    return table
