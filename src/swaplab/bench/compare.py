"""`swaplab bench compare A B`: two stored runs, level by level, on the figure their kind is judged by.

The figure is taken per repetition from the stored requests (output tok/s for
throughput, mean TTFT for prefill and prefix-cache, plus the cache's TTFT ratio), and
`swaplab.results.stats.compare` decides: "indistinguishable" unless the data separate them.

One more rule on top: a difference smaller than MIN_EFFECT (1%) is not claimed, however
significant. A deterministic backend (the sim, a quiet GPU) repeats itself to 0.01%, so
two runs of one config can differ "significantly" by 0.03% of timer and scheduling
noise; the seed calls backends within a few percent "a wash", and reps agreeing to
0.1% "agree".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from swaplab.bench.summary import HEADLINE_METRIC, measured, per_rep
from swaplab.errors import SwaplabError
from swaplab.results.present import model_name
from swaplab.results.runs import get_run
from swaplab.results.stats import Comparison, compare

NAMING_KEYS = ("input_tokens", "output_tokens", "concurrency", "rate")
MIN_EFFECT = 0.01  # B/A within 1% of 1 is never called a difference


@dataclass(frozen=True)
class LevelComparison:
    level: str
    figure: str  # what was compared, in words
    a: list[float]  # per-rep values of run A
    b: list[float]
    comparison: Comparison


@dataclass(frozen=True)
class RunComparison:
    a: dict[str, Any]  # the runs as get_run returns them
    b: dict[str, Any]
    levels: list[LevelComparison]
    differences: list[str]  # settings in which the runs' levels differ

    @property
    def verdict(self) -> str:
        """"different" when any level is; else "indistinguishable"."""
        return "different" if any(level.comparison.different for level in self.levels) else "indistinguishable"


def compare_runs(db: str | None, a_id: int, b_id: int, *, min_effect: float = MIN_EFFECT) -> RunComparison:
    """Compare run B against run A; raises SwaplabError when they can't be compared."""
    a, b = _load(db, a_id), _load(db, b_id)
    if a["kind"] != b["kind"]:
        raise SwaplabError(f"run {a_id} is {a['kind']} and run {b_id} is {b['kind']}: compare runs of one kind")
    if a["kind"] not in HEADLINE_METRIC:
        raise SwaplabError(f"runs of kind {a['kind']!r} have no bench figure to compare")
    key, figure, _ = HEADLINE_METRIC[a["kind"]]
    a_levels = {level["level"]: level for level in a["summary"].get("levels", [])}
    b_levels = {level["level"]: level for level in b["summary"].get("levels", [])}
    shared = [name for name in a_levels if name in b_levels]
    if not shared:
        raise SwaplabError(
            f"runs {a_id} and {b_id} have no level in common ({', '.join(a_levels)} vs {', '.join(b_levels)})"
        )
    differences = [
        f"{name} {key_name}: {a_levels[name].get(key_name)} vs {b_levels[name].get(key_name)}"
        for name in shared
        for key_name in NAMING_KEYS
        if a_levels[name].get(key_name) != b_levels[name].get(key_name)
    ]
    compared = []
    a_reps = {name: per_rep(measured(a["requests"], name)) for name in shared}
    b_reps = {name: per_rep(measured(b["requests"], name)) for name in shared}
    for name in shared:
        compared.append(compare_level(name, figure, a_reps[name].get(key, []), b_reps[name].get(key, []), min_effect))
    if a["kind"] == "prefix-cache" and {"uncached", "cached"} <= set(shared):
        compared.append(compare_level("cache", "uncached/cached TTFT ratio", _ratios(a_reps), _ratios(b_reps), min_effect))
    return RunComparison(a, b, compared, differences)


def compare_level(name: str, figure: str, a: list[float], b: list[float], min_effect: float) -> LevelComparison:
    """`stats.compare` on one figure's per-rep values, with the MIN_EFFECT rule on top."""
    if not a or not b:
        missing = "A" if not a else "B"
        raise SwaplabError(f"level {name}: run {missing} has no successful measured request to compare")
    comparison = compare(a, b)
    if comparison.different and comparison.ratio is not None and abs(comparison.ratio - 1) < min_effect:
        comparison = replace(
            comparison,
            verdict="indistinguishable",
            reason=f"{comparison.reason}, a difference under {min_effect:.0%}: too small to claim",
        )
    return LevelComparison(name, figure, a, b, comparison)


def _ratios(reps: dict[str, dict[str, list[float]]]) -> list[float]:
    uncached = reps["uncached"].get("ttft_ms_mean", [])
    cached = reps["cached"].get("ttft_ms_mean", [])
    return [u / c for u, c in zip(uncached, cached) if c > 0]


def _load(db: str | None, run_id: int) -> dict[str, Any]:
    run = get_run(db, run_id)
    if run is None:
        raise SwaplabError(f"no run {run_id} in the store (`swaplab runs list` shows the ids)")
    return run


def sentences(result: RunComparison) -> list[str]:
    """The comparison in plain lines: which runs, then one verdict per level."""
    lines = [f"A = {_about(result.a)}", f"B = {_about(result.b)}"]
    if result.differences:
        lines.append("Note: the runs' levels differ in " + "; ".join(result.differences))
    for level in result.levels:
        comparison = level.comparison
        lines.append(
            f"{level.level} ({level.figure} per rep): A {_values(level.a)}, B {_values(level.b)}: "
            f"{comparison.verdict}; {comparison.reason}"
        )
    lines.append(f"Verdict: {result.verdict}.")
    return lines


def _about(run: dict[str, Any]) -> str:
    model = model_name(run["model"], run.get("requested_model"))
    backend = " ".join(part for part in (run.get("backend_kind"), run.get("backend_version")) if part)
    return f"run {run['id']}, {run['kind']} of {model} at {run['target_url']}" + (f", {backend}" if backend else "")


def _values(values: list[float]) -> str:
    mean = sum(values) / len(values)
    return f"{_figure(mean)} ({_figure(min(values))}-{_figure(max(values))}, n={len(values)})"


def _figure(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
