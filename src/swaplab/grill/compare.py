"""`swaplab grill compare A B`: two stored grill runs, score against score, with the bench's statistics.

The figure is tasks passed per repetition, read back from the runs' stored task rows,
so the comparison sees every repetition rather than the means. `stats.compare` decides:
"indistinguishable" unless the data separate them (the seed's 20.0 vs 19.67, with a
three-point spread inside each arm, is indistinguishable; so is any n = 1 pair).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swaplab.errors import SwaplabError
from swaplab.grill.summary import SCORED_ROUNDS, per_rep_scores
from swaplab.results.runs import get_run
from swaplab.results.stats import Comparison, compare

GRILL_KIND = "grill"


@dataclass(frozen=True)
class FigureComparison:
    figure: str  # "score (r1-r4)", "r2", "R5 complete", ...
    a: list[int]
    b: list[int]
    comparison: Comparison


def compare_runs(db: str | None, a_id: int, b_id: int) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """The total score first, then every round both runs have, then every lm-eval task and metric both scored;
    raises SwaplabError when they can't be compared."""
    a, b = _load(db, a_id), _load(db, b_id)
    a_rounds = _rounds(a)
    b_rounds = _rounds(b)
    shared = [name for name in a_rounds if name in b_rounds]
    tasks = _lmeval_comparisons(a, b)
    if not shared and tasks:
        return a, b, tasks
    if not shared:
        raise SwaplabError(
            f"grill runs {a_id} and {b_id} share no round ({', '.join(a_rounds) or 'none'} vs {', '.join(b_rounds) or 'none'})"
        )
    figures = []
    scored = [name for name in shared if name in SCORED_ROUNDS]
    if len(scored) > 1:
        figures.append(_figure(f"score ({', '.join(scored)})", a, b, scored))
    figures += [_figure("R5 complete" if name == "R5" else name, a, b, [name]) for name in shared]
    return a, b, [*figures, *tasks]


def _lmeval_comparisons(a: dict[str, Any], b: dict[str, Any]) -> list[Any]:
    if not ((a.get("summary") or {}).get("lmeval") and (b.get("summary") or {}).get("lmeval")):
        return []
    from swaplab.grill.lmeval import compare_tasks  # no lm-eval import: the comparison is over stored rows

    return compare_tasks(a, b)


def sentences(a: dict[str, Any], b: dict[str, Any], figures: list[FigureComparison]) -> list[str]:
    """What the comparison says, one line per figure."""
    lines = [f"A = run {a['id']} ({_about(a)}), B = run {b['id']} ({_about(b)})"]
    for figure in figures:
        if not isinstance(figure, FigureComparison):  # an lm-eval task: a score over samples, not reps
            lines.append(_task_sentence(figure))
            continue
        comparison = figure.comparison
        shown = f"{figure.figure}: A {_values(figure.a)} vs B {_values(figure.b)}"
        if comparison.different:
            interval = f" (95% CI {_signed(comparison.difference_low)} to {_signed(comparison.difference_high)})"
            lines.append(f"{shown}: B - A = {_signed(comparison.difference)}{interval}, different: {comparison.reason}")
        else:
            lines.append(f"{shown}: indistinguishable: {comparison.reason}")
    return lines


def _task_sentence(task: Any) -> str:
    over = f"{task.n} samples both ran, paired" if task.paired else f"about {task.n} samples a side, unpaired"
    shown = (f"lm-eval {task.figure}: A {task.a:.3f} vs B {task.b:.3f}: B - A = {task.difference:+.3f} "
             f"(95% CI {task.low:+.3f} to {task.high:+.3f}, {over})")
    return f"{shown}, different" if task.different else f"{shown}: indistinguishable (the interval holds 0)"


def _figure(name: str, a: dict[str, Any], b: dict[str, Any], rounds: list[str]) -> FigureComparison:
    a_scores = list(per_rep_scores(a["requests"], rounds).values())
    b_scores = list(per_rep_scores(b["requests"], rounds).values())
    return FigureComparison(name, a_scores, b_scores, compare(a_scores, b_scores))


def _load(db: str | None, run_id: int) -> dict[str, Any]:
    run = get_run(db, run_id)
    if run is None:
        raise SwaplabError(f"no run {run_id} in the store (`swaplab runs list --kind grill` lists them)")
    if run["kind"] != GRILL_KIND:
        raise SwaplabError(f"run {run_id} is a {run['kind']} run, not a grill run: `swaplab bench compare` compares those")
    return run


def _rounds(run: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for request in run["requests"]:
        name = (request.get("data") or {}).get("round")
        if name and name != "needle" and not name.startswith("lmeval:") and name not in seen:
            seen.append(name)
    return seen


def _about(run: dict[str, Any]) -> str:
    summary = run.get("summary") or {}
    return f"{run['requested_model'] or run['model']}, {summary.get('headline', '-')}"


def _values(values: list[int]) -> str:
    return "[" + ", ".join(str(value) for value in values) + "]"


def _signed(value: float | None) -> str:
    return "?" if value is None else f"{value:+.2f}"
