"""What bench shows: a live progress bar with tok/s, the results table, the JSON report, the selftest's table."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict
from time import perf_counter
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from swaplab.bench.run import BenchOutcome, Observer
from swaplab.bench.selftest import SelftestReport
from swaplab.client import RequestResult
from swaplab.results.present import levels_table, model_name
from swaplab.results.report import report_header

# The columns of the end-of-run table, per kind (the store keeps every figure).
SHOWN = {
    "throughput": (
        "output_tokens_per_second", "requests_per_second", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
        "achieved_input_tokens", "achieved_output_tokens", "error_rate",
    ),
    "prefill": (
        "ttft_ms", "prefill_tokens_per_second", "e2e_ms", "achieved_input_tokens", "achieved_output_tokens",
        "cached_tokens", "error_rate",
    ),
    "prefix-cache": (
        "ttft_ms", "cached_tokens", "e2e_ms", "achieved_input_tokens", "achieved_output_tokens", "error_rate",
    ),
}
RATE_WINDOW_SECONDS = 2.0


class ProgressBar(Observer):
    """A rich progress bar over all requests of the run, with the tokens per second arriving now."""

    def __init__(self, console: Console):
        self.tokens = 0  # token-bearing chunks so far, counted by the client's event loop
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            LiveRate(self),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._task = self._progress.add_task("starting", total=None)

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()

    def planned(self, total_requests: int) -> None:
        self._progress.reset(self._task, total=total_requests)

    def phase(self, description: str) -> None:
        self._progress.update(self._task, description=description)

    def request_done(self, result: RequestResult) -> None:
        self._progress.advance(self._task)

    def token(self) -> None:
        self.tokens += 1


class LiveRate(ProgressColumn):
    """Token-bearing chunks per second over the last RATE_WINDOW_SECONDS: a live view only
    (the report's tok/s come from the server's usage)."""

    def __init__(self, bar: ProgressBar):
        super().__init__()
        self._bar = bar
        self._samples: deque[tuple[float, int]] = deque()

    def render(self, task: Task) -> Text:
        now = perf_counter()
        samples = self._samples
        samples.append((now, self._bar.tokens))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_SECONDS:
            samples.popleft()
        since, count = samples[0]
        rate = (self._bar.tokens - count) / (now - since) if now > since else 0.0
        return Text(f"{rate:,.0f} tok/s")


def show_outcome(outcome: BenchOutcome, console: Console, *, db_path: str, json_path: str | None) -> None:
    """The results table and what the run means, after it."""
    summary = outcome.summary
    run = outcome.run
    about = f"{run.kind} of {model_name(run.model, run.requested_model)} at {run.target_url}"
    backend = " ".join(part for part in (run.backend_kind, run.backend_version) if part)
    if backend:
        about += f", {backend}"
    shown = [{key: level[key] for key in ("level", *SHOWN[run.kind]) if key in level} for level in summary["levels"]]
    console.print(levels_table(shown, title=about))
    reps = summary["reps"]
    console.print(
        f"{reps} rep{'s' if reps != 1 else ''} after {summary['warmup_discarded']} warm-up run"
        f"{'s' if summary['warmup_discarded'] != 1 else ''} (discarded): rates are mean (min-max) over reps, "
        "latencies p50 / p99 over every successful request; failed requests count only in errors."
    )
    for line in interpretation(run.kind, summary):
        console.print(line)
    for flag in summary.get("flags", ()):
        console.print(f"[yellow]flagged: {flag}[/yellow]")
    overhead = summary.get("client_overhead_ms")
    if overhead is not None:
        console.print(f"Client overhead: {overhead:.2f} ms of TTFT p50, from {summary['client_overhead_source']}.")
    console.print(f"Stored as run {outcome.run_id} in {db_path}" + (f"; JSON report in {json_path}" if json_path else "") + ".")


def interpretation(kind: str, summary: Mapping[str, Any]) -> list[str]:
    """The figures a kind is read by, in sentences."""
    lines = []
    if kind == "throughput" and summary.get("scaling_ratio", {}).get("mean") is not None:
        ratio = summary["scaling_ratio"]
        lines.append(f"Scaling {summary['scaling']}: {_spread(ratio, 'x', 2)} output tok/s.")
    if kind == "prefix-cache":
        lines.append(
            f"TTFT uncached {_spread(summary['uncached_ttft_ms'], ' ms')}, cached {_spread(summary['cached_ttft_ms'], ' ms')}: "
            f"{_spread(summary['cache_ttft_ratio'], 'x', 2)} faster. Judge the cache by the ratio, the backend by the absolutes."
        )
    for level in summary["levels"]:
        server = level.get("server_tpot_ms")
        if server and server.get("p50") and level["tpot_ms"].get("p50"):
            lines.append(
                f"{level['level']}: TPOT p50 {level['tpot_ms']['p50']:.2f} ms measured, "
                f"{server['p50']:.2f} ms by the server's own timings."
            )
    return lines


def report_document(outcome: BenchOutcome) -> dict[str, Any]:
    """The self-contained JSON report: the run, how it was made, every figure, every request."""
    return {
        **report_header(outcome.run, outcome.run_id),
        **outcome.summary,
        "requests": [asdict(row) for row in outcome.rows],
    }


def selftest_table(report: SelftestReport, summary: Mapping[str, Any]) -> Table:
    """The sim's configured figures, the raw reader's and the client's, side by side."""
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


def _spread(figure: Mapping[str, Any], unit: str = "", digits: int = 0) -> str:
    mean, low, high = figure.get("mean"), figure.get("min"), figure.get("max")
    if mean is None:
        return "-"
    form = f"{{:.{digits}f}}"
    text = form.format(mean) + unit
    if low is not None and high is not None and low != high:
        text += f" ({form.format(low)}-{form.format(high)})"
    return text
