"""The performance section from bench runs: the numbers behind each chart, and the same numbers as tables.

Reads the bench's stored summaries (docs/results.md, "The summary"): `levels`, each named
by `level` and `concurrency` / `rate` / `input_tokens`, with `output_tokens_per_second`
as a spread over repetitions and `ttft_ms` as a distribution; a prefix-cache run adds
`uncached_ttft_ms`, `cached_ttft_ms` and `cache_ttft_ratio` (spreads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swaplab.catalog.figures import backend, central, number, spread_range, spread_text, when

BENCH_KINDS = ("throughput", "prefill", "prefix-cache")
# Charts stay legible with this many runs; older runs are listed in the tables all the same.
RUNS_PER_CHART = 6


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Chart:
    key: str
    """`throughput`, `throughput-rate`, `prefill` or `prefix-cache`: also the chart's place in the page."""
    title: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    bars: bool = False
    """Grouped bars (prefix cache: uncached and cached per run) instead of lines."""
    log_x: bool = False
    categories: tuple[str, ...] = ()
    """Bars: the name of each group, at x = 0, 1, 2, ..."""


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    grouped: int = 1
    """Leading columns that name a group of rows (the run): shown on the group's first row only."""


@dataclass(frozen=True)
class Performance:
    charts: tuple[Chart, ...] = ()
    tables: tuple[Table, ...] = ()
    best_tokens_per_second: float | None = None
    best_at: str = ""
    left_out: int = 0
    """Bench runs not shown because they did not complete."""


def run_label(run: Mapping[str, Any]) -> str:
    """`#12 2026-09-04 10:22 sglang 0.5.2`: a run as charts and tables name it."""
    label = f"#{run['id']} {when(run.get('started_at'))}"
    engine = backend(run)
    return label if engine == "-" else f"{label} {engine}"


def performance(runs: Sequence[Mapping[str, Any]]) -> Performance:
    """Charts and tables from a model's bench runs (oldest first); runs that did not complete are left out."""
    bench = [run for run in runs if run.get("kind") in BENCH_KINDS]
    completed = [run for run in bench if run.get("status", "completed") == "completed"]
    by_kind = {kind: [run for run in completed if run["kind"] == kind] for kind in BENCH_KINDS}
    charts: list[Chart] = []
    tables: list[Table] = []
    throughput = by_kind["throughput"]
    for key, axis in (("concurrency", "concurrency"), ("rate", "request rate (requests/s)")):
        chosen = [run for run in throughput if any(key in level for level in _levels(run))]
        if chosen:
            charts.append(_throughput_chart(chosen, key, axis))
    if throughput:
        tables.append(_throughput_table(throughput))
    if by_kind["prefill"]:
        charts.append(_prefill_chart(by_kind["prefill"]))
        tables.append(_prefill_table(by_kind["prefill"]))
    if by_kind["prefix-cache"]:
        charts.append(_prefix_cache_chart(by_kind["prefix-cache"]))
        tables.append(_prefix_cache_table(by_kind["prefix-cache"]))
    best, best_at = None, ""
    for run in throughput:
        for level in _levels(run):
            rate = central(level.get("output_tokens_per_second"))
            if rate is not None and (best is None or rate > best):
                best, best_at = rate, f"{_level_name(level)} in run #{run['id']}"
    return Performance(
        charts=tuple(charts), tables=tuple(tables), best_tokens_per_second=best, best_at=best_at,
        left_out=len(bench) - len(completed),
    )


def _levels(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    levels = (run.get("summary") or {}).get("levels") or []
    return [level for level in levels if isinstance(level, Mapping)]


def _level_name(level: Mapping[str, Any]) -> str:
    if level.get("level") is not None:
        return str(level["level"])
    for key, short in (("concurrency", "c"), ("rate", "rate"), ("input_tokens", "in")):
        if level.get(key) is not None:
            return f"{short}={level[key]}"
    return "-"


def _point(x: Any, figure: Any) -> Point | None:
    y = central(figure)
    if not isinstance(x, (int, float)) or isinstance(x, bool) or y is None:
        return None
    bounds = spread_range(figure)
    return Point(float(x), float(y), *(bounds or (None, None)))


def _latest(runs: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    return runs[-RUNS_PER_CHART:]


def _throughput_chart(runs: Sequence[Mapping[str, Any]], key: str, axis: str) -> Chart:
    series = []
    for run in _latest(runs):
        points = [_point(level.get(key), level.get("output_tokens_per_second")) for level in _levels(run)]
        points = sorted((point for point in points if point is not None), key=lambda point: point.x)
        if points:
            series.append(Series(run_label(run), tuple(points)))
    return Chart(
        key="throughput" if key == "concurrency" else "throughput-rate",
        title=f"Output tok/s vs {axis.split(' (')[0]}",
        x_label=axis, y_label="output tokens/s", series=tuple(series), log_x=key == "concurrency",
    )


def _throughput_table(runs: Sequence[Mapping[str, Any]]) -> Table:
    rows = []
    for run in runs:
        summary = run.get("summary") or {}
        lengths = f"{_first(run, 'input_tokens')} → {_first(run, 'output_tokens')}"
        for level in _levels(run):
            rows.append((
                run_label(run), lengths, _level_name(level), spread_text(level.get("output_tokens_per_second")),
                _percentiles(level.get("ttft_ms")), _percentiles(level.get("tpot_ms")), _error_rate(level),
            ))
        ratio = summary.get("scaling_ratio")
        if central(ratio) is not None:
            scaling = summary.get("scaling") or "highest / lowest"
            rows.append((run_label(run), lengths, f"scaling {scaling}", f"{_ratio(ratio)}", "", "", ""))
    return Table(
        "Throughput",
        ("Run", "Tokens in → out", "Level", "Output tok/s", "TTFT ms p50 / p99", "TPOT ms p50 / p99", "Errors"),
        tuple(rows), grouped=2,
    )


def _prefill_chart(runs: Sequence[Mapping[str, Any]]) -> Chart:
    series = []
    for run in _latest(runs):
        points = [_point(level.get("input_tokens"), level.get("ttft_ms")) for level in _levels(run)]
        points = sorted((point for point in points if point is not None), key=lambda point: point.x)
        if points:
            series.append(Series(run_label(run), tuple(points)))
    return Chart("prefill", "TTFT vs prompt length", "prompt tokens", "mean TTFT (ms)", tuple(series), log_x=True)


def _prefill_table(runs: Sequence[Mapping[str, Any]]) -> Table:
    rows = []
    for run in runs:
        for level in _levels(run):
            ttft = level.get("ttft_ms") or {}
            rows.append((
                run_label(run), number(level.get("input_tokens")), number(central(ttft)), _percentiles(ttft),
                spread_text(level.get("prefill_tokens_per_second")), _error_rate(level),
            ))
    return Table(
        "Prefill", ("Run", "Prompt tokens", "Mean TTFT ms", "TTFT ms p50 / p99", "Prefill tok/s", "Errors"), tuple(rows)
    )


def _prefix_cache_chart(runs: Sequence[Mapping[str, Any]]) -> Chart:
    uncached, cached = [], []
    for index, run in enumerate(_latest(runs)):
        summary = run.get("summary") or {}
        for figures, key in ((uncached, "uncached_ttft_ms"), (cached, "cached_ttft_ms")):
            point = _point(index, summary.get(key))
            if point is not None:
                figures.append(point)
    categories = []
    for run in _latest(runs):
        ratio = central((run.get("summary") or {}).get("cache_ttft_ratio"))
        categories.append(f"#{run['id']} {when(run.get('started_at'))}" + (f" ({ratio:.2f}x)" if ratio else ""))
    return Chart(
        "prefix-cache", "Prefix-cache TTFT", "run (cached speed-up)", "mean TTFT (ms)",
        (Series("uncached", tuple(uncached)), Series("cached", tuple(cached))), bars=True, categories=tuple(categories),
    )


def _prefix_cache_table(runs: Sequence[Mapping[str, Any]]) -> Table:
    rows = []
    for run in runs:
        summary = run.get("summary") or {}
        rows.append((
            run_label(run), _first(run, "input_tokens"), spread_text(summary.get("uncached_ttft_ms")),
            spread_text(summary.get("cached_ttft_ms")), _ratio(summary.get("cache_ttft_ratio")),
        ))
    return Table("Prefix cache", ("Run", "Prompt tokens", "Uncached TTFT ms", "Cached TTFT ms", "Speed-up"), tuple(rows))


def _first(run: Mapping[str, Any], key: str) -> str:
    """A setting shared by the run's levels (lengths), from the first level that has it."""
    for level in _levels(run):
        if level.get(key) is not None:
            return number(level[key])
    return "-"


def _percentiles(distribution: Any) -> str:
    if not isinstance(distribution, Mapping) or distribution.get("p50") is None:
        return "-"
    return f"{number(distribution['p50'])} / {number(distribution.get('p99'))}"


def _ratio(value: Any) -> str:
    text = spread_text(value)
    return "-" if text == "-" else f"{text.split(' ')[0]}x" + (f" {text.split(' ', 1)[1]}" if " " in text else "")


def _error_rate(level: Mapping[str, Any]) -> str:
    rate = level.get("error_rate")
    return f"{rate:.1%}" if isinstance(rate, (int, float)) else "-"
