"""A bench run's figures from its request rows: pure functions, the same for a fresh run and a stored one.

Rows are dicts with the `requests` table's columns (`RequestRow` fields). Warm-up rows
never count. Failed rows count only in the error rate. A figure per repetition (tok/s,
mean TTFT) is reported as mean with min-max over reps; latencies are distributions over
every successful request of the level's measured reps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from swaplab.bench.workloads import Level, Workload
from swaplab.results.stats import distribution, spread

Row = Mapping[str, Any]
# An achieved length further than this from the one asked for flags its level.
LENGTH_TOLERANCE = 0.05
# The figure `bench compare` tests, per kind: (key in per_rep, what it is, higher is better).
HEADLINE_METRIC = {
    "throughput": ("output_tokens_per_second", "output tok/s", True),
    "prefill": ("ttft_ms_mean", "mean TTFT ms", False),
    "prefix-cache": ("ttft_ms_mean", "mean TTFT ms", False),
}


def measured(rows: Iterable[Row], level: str) -> list[Row]:
    return [row for row in rows if row["level"] == level and not row["warmup"]]


def by_rep(rows: Iterable[Row]) -> dict[int, list[Row]]:
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row["rep"]].append(row)
    return dict(sorted(groups.items()))


def per_rep(rows: Sequence[Row]) -> dict[str, list[float]]:
    """Figures of each measured repetition of one level's rows, in rep order.

    Output tok/s and request/s are over the level's wall time in that rep: from the
    first request sent to the last one ended, failed ones included (they took time).
    """
    figures: dict[str, list[float]] = defaultdict(list)
    for rep_rows in by_rep(rows).values():
        succeeded = [row for row in rep_rows if row["error"] is None]
        started = min(row["sent_at"] for row in rep_rows)
        ended = max(row["end_at"] for row in rep_rows)
        wall = ended - started
        if wall > 0:
            figures["output_tokens_per_second"].append(sum(row["completion_tokens"] or 0 for row in succeeded) / wall)
            figures["requests_per_second"].append(len(succeeded) / wall)
        ttfts = [row["ttft_ms"] for row in succeeded if row["ttft_ms"] is not None]
        if ttfts:
            figures["ttft_ms_mean"].append(math.fsum(ttfts) / len(ttfts))
        prefill_rates = [
            row["prompt_tokens"] / (row["ttft_ms"] / 1000)
            for row in succeeded
            if row["ttft_ms"] and row["prompt_tokens"] is not None
        ]
        if prefill_rates:
            figures["prefill_tokens_per_second"].append(math.fsum(prefill_rates) / len(prefill_rates))
    return dict(figures)


def level_figures(level: Level, rows: Iterable[Row]) -> dict[str, Any]:
    """Everything reported for one level, from its rows (warm-up rows are skipped here)."""
    rows = measured(rows, level.name)
    succeeded = [row for row in rows if row["error"] is None]
    reps = per_rep(rows)
    figures: dict[str, Any] = level.naming()
    figures["output_tokens_per_second"] = spread(reps.get("output_tokens_per_second", []))
    figures["requests_per_second"] = spread(reps.get("requests_per_second", []))
    figures["ttft_ms"] = distribution(_present(row["ttft_ms"] for row in succeeded))
    figures["tpot_ms"] = distribution(_present(row["tpot_ms"] for row in succeeded))
    figures["itl_ms"] = distribution(gap for row in succeeded for gap in (row["data"] or {}).get("itl_ms", ()))
    figures["e2e_ms"] = distribution(_present(row["e2e_ms"] for row in succeeded))
    figures["achieved_input_tokens"] = spread(_present(row["prompt_tokens"] for row in succeeded))
    figures["achieved_output_tokens"] = spread(_present(row["completion_tokens"] for row in succeeded))
    cached = list(_present(row["cached_tokens"] for row in succeeded))
    if cached:
        figures["cached_tokens"] = spread(cached)
    if "prefill_tokens_per_second" in reps:
        figures["prefill_tokens_per_second"] = spread(reps["prefill_tokens_per_second"])
    server_rates = [(row["data"] or {}).get("server_tokens_per_second") for row in succeeded]
    server_tpots = [1000 / rate for rate in server_rates if rate]
    if server_tpots:
        figures["server_tpot_ms"] = distribution(server_tpots)  # the server's own timings, to check ours against
    figures["measured_requests"] = len(rows)
    figures["failed_requests"] = len(rows) - len(succeeded)
    figures["error_rate"] = (len(rows) - len(succeeded)) / len(rows) if rows else None
    return figures


def length_flags(figures: Mapping[str, Any]) -> list[str]:
    """Why a level's achieved lengths can't be trusted: any request more than 5% off what was asked."""
    flags = []
    for key, wanted_key, what in (
        ("achieved_input_tokens", "input_tokens", "prompt"),
        ("achieved_output_tokens", "output_tokens", "output"),
    ):
        achieved, wanted = figures[key], figures[wanted_key]
        if achieved["n"] == 0:
            continue
        worst = max(abs(achieved["min"] - wanted), abs(achieved["max"] - wanted))
        if worst > LENGTH_TOLERANCE * wanted:
            flags.append(
                f"{figures['level']}: {what} lengths {_range(achieved)} tokens, asked for {wanted} "
                f"(off by more than {LENGTH_TOLERANCE:.0%})"
            )
    return flags


def summarize(workload: Workload, rows: Sequence[Row], *, reps: int, warmup: int, client_overhead_ms: float | None) -> dict[str, Any]:
    """The run's summary (what the store keeps and the report shows), levels with their per-rep figures."""
    levels = []
    flags: list[str] = []
    for level in workload.levels:
        figures = level_figures(level, rows)
        figures["per_rep"] = per_rep(measured(rows, level.name))
        flags += length_flags(figures)
        levels.append(figures)
    summary: dict[str, Any] = {
        "reps": reps,
        "warmup_discarded": warmup,
        "client_overhead_ms": client_overhead_ms,
        "levels": levels,
    }
    if workload.kind == "throughput":
        summary.update(_scaling(levels))
    if workload.kind == "prefix-cache":
        summary.update(_cache(levels))
        cached_tokens = levels[1].get("cached_tokens")
        if cached_tokens and cached_tokens["max"] == 0:
            flags.append("cached: the server reported 0 cached tokens for every request; is its prefix cache on?")
    if flags:
        summary["flags"] = flags
    summary["headline"] = headline(workload.kind, summary)
    return summary


def _scaling(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Output tok/s at the highest level over the lowest, per rep (the seed's "3.47x")."""
    if len(levels) < 2:
        return {}
    low, high = levels[0], levels[-1]
    ratios = [
        b / a
        for a, b in zip(low["per_rep"].get("output_tokens_per_second", []), high["per_rep"].get("output_tokens_per_second", []))
        if a > 0
    ]
    return {"scaling_ratio": spread(ratios), "scaling": f"{high['level']} / {low['level']}"}


def _cache(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Both absolutes and their ratio: the cache is judged by the ratio, the backend by the absolutes."""
    uncached, cached = levels[0]["per_rep"].get("ttft_ms_mean", []), levels[1]["per_rep"].get("ttft_ms_mean", [])
    ratios = [a / b for a, b in zip(uncached, cached) if b > 0]
    return {
        "uncached_ttft_ms": spread(uncached),
        "cached_ttft_ms": spread(cached),
        "cache_ttft_ratio": spread(ratios),
    }


def headline(kind: str, summary: Mapping[str, Any]) -> str:
    """The run's key figure in a phrase, for `runs list`."""
    levels = summary["levels"]
    if kind == "throughput":
        best = max(levels, key=lambda level: level["output_tokens_per_second"]["mean"] or 0)
        text = f"{_figure(best['output_tokens_per_second']['mean'])} tok/s at {best['level']}"
        ratio = (summary.get("scaling_ratio") or {}).get("mean")
        if ratio is not None:
            text += f", {ratio:.2f}x {summary['scaling']}"
        return text
    if kind == "prefill":
        last = levels[-1]
        rate = (last.get("prefill_tokens_per_second") or {}).get("mean")
        return f"TTFT {_figure(last['ttft_ms']['mean'])} ms at {last['level']}" + (
            f" ({_figure(rate)} tok/s prefill)" if rate else ""
        )
    if kind == "prefix-cache":
        ratio = summary["cache_ttft_ratio"]["mean"]
        return (
            f"TTFT {_figure(summary['cached_ttft_ms']['mean'])} ms cached vs "
            f"{_figure(summary['uncached_ttft_ms']['mean'])} ms uncached"
            + (f" ({ratio:.2f}x)" if ratio else "")
        )
    return "-"


def stored_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary as the store keeps it: per-rep lists stay in the requests they come from."""
    return {**summary, "levels": [{key: value for key, value in level.items() if key != "per_rep"} for level in summary["levels"]]}


def _present(values: Iterable[Any]) -> Iterable[Any]:
    return (value for value in values if value is not None)


def _range(figure: Mapping[str, Any]) -> str:
    low, high = figure["min"], figure["max"]
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"
