"""A grill run's figures from its task outcomes: pure functions over plain data.

The shape is the one docs/results.md ("Grill runs") documents and the catalogue's run
history reads. Every figure is per repetition first, then a spread (mean, min, max, n)
over the repetitions: a single run is never quoted as if it were the model's score.

What counts where, as the seed's table counts it:
- `score` / `total`: the rounds r1, r2, r3 (code) and r4 (short agent tasks), the
  seed's "20/23". A run with none of those (humaneval only) scores humaneval instead.
- `r5`: the long agent tasks, reported apart as complete and LOOPED ("R5 6/6").
- `needle`: a grid of cells, never folded into the score.
- `humaneval`: a round of its own, pass@1 over the 164 problems.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from swaplab.grill.outcome import ERROR, FAIL, INCONCLUSIVE, LOOPED, PASS, TRUNCATED, TaskOutcome
from swaplab.results.stats import spread

ROUND_ORDER = ("r1", "r2", "r3", "r4", "R5", "humaneval", "needle")
SCORED_ROUNDS = ("r1", "r2", "r3", "r4")
# A needle cell over several repetitions shows its worst common result: a cell that
# failed once is not a pass, and a wrong answer outranks an unfinished thought.
NEEDLE_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, TRUNCATED: 1, FAIL: 2, ERROR: 2, LOOPED: 2}


def summarize(
    outcomes: Iterable[tuple[int, TaskOutcome]], *, suites: Sequence[str], reps: int, log: str | None = None,
    lmeval: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's summary from (rep, outcome) pairs, reps numbered from 1; `lmeval` is the lm-eval suite's
    own (`grill.lmeval.summary_of`), kept as it is."""
    by_rep: dict[int, list[TaskOutcome]] = defaultdict(list)
    for rep, outcome in outcomes:
        by_rep[rep].append(outcome)
    rep_numbers = list(range(1, reps + 1))
    everything = [outcome for rep in rep_numbers for outcome in by_rep[rep]]
    present = {outcome.round for outcome in everything}
    rounds = [name for name in ROUND_ORDER if name in present and name != "needle"]
    summary: dict[str, Any] = {"suites": list(suites), "reps": reps}

    task_counts = {name: _task_count(everything, name) for name in rounds}
    scored = [name for name in SCORED_ROUNDS if name in present] or [name for name in ("humaneval",) if name in present]
    if scored:
        summary["score"] = spread(_passed(by_rep[rep], scored) for rep in rep_numbers)
        summary["total"] = sum(task_counts[name] for name in scored)
    summary["rounds"] = [
        {"round": name, "score": spread(_passed(by_rep[rep], [name]) for rep in rep_numbers), "total": task_counts[name]}
        for name in rounds
    ]
    summary["truncated"] = spread(_count(by_rep[rep], TRUNCATED) for rep in rep_numbers)
    summary["errors"] = spread(_count(by_rep[rep], ERROR) for rep in rep_numbers)

    if "r4" in present:
        summary["tok_per_step"] = spread(
            value for rep in rep_numbers if (value := _tokens_per_step(by_rep[rep], "r4")) is not None
        )
        summary["r4_output_tokens"] = spread(_sum(by_rep[rep], "r4", "output_tokens") for rep in rep_numbers)
        summary["r4_wall_seconds"] = spread(_sum(by_rep[rep], "r4", "wall_seconds") for rep in rep_numbers)
    if "R5" in present:
        summary["r5"] = {
            "complete": spread(_passed(by_rep[rep], ["R5"]) for rep in rep_numbers),
            "looped": spread(_count(by_rep[rep], LOOPED, "R5") for rep in rep_numbers),
            "total": task_counts["R5"],
        }
    if "needle" in present:
        summary["needle"] = needle_grid(outcome for outcome in everything if outcome.round == "needle")
    if lmeval:
        summary["lmeval"] = dict(lmeval)
    if log:
        summary["log"] = log
    summary["headline"] = headline(summary)
    return summary


def needle_grid(outcomes: Iterable[TaskOutcome]) -> list[dict[str, Any]]:
    """One cell per (depth, length), its worst result over the repetitions, with the passes counted."""
    cells: dict[tuple[float, int], list[str]] = defaultdict(list)
    for outcome in outcomes:
        key = (float(outcome.extra["depth"]), int(outcome.extra["context_tokens"]))
        cells[key].append(outcome.status)
    grid = []
    for (depth, context_tokens), statuses in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0])):
        worst = max(statuses, key=lambda status: NEEDLE_SEVERITY.get(status, 2))
        result = worst if worst in (PASS, INCONCLUSIVE) else FAIL
        if worst == TRUNCATED:
            result = INCONCLUSIVE
        grid.append({
            "depth": depth, "context_tokens": context_tokens, "result": result,
            "passed": statuses.count(PASS), "n": len(statuses),
        })
    return grid


def headline(summary: Mapping[str, Any]) -> str:
    """`20.0/23 (19-21), R5 6/6`: the phrase `runs list` shows for a grill run."""
    parts = []
    score = summary.get("score")
    if isinstance(score, Mapping) and score.get("mean") is not None:
        parts.append(out_of(score, summary.get("total")))
    r5 = summary.get("r5")
    if isinstance(r5, Mapping) and r5["complete"].get("mean") is not None:
        parts.append(f"R5 {_figure(r5['complete']['mean'])}/{r5['total']}")
        if r5["looped"]["mean"]:
            parts.append(f"looped {_figure(r5['looped']['mean'])}")
    needle = summary.get("needle")
    if needle:
        counts = Counter(cell["result"] for cell in needle)
        parts.append(f"needle {counts[PASS]}/{len(needle)}")
    lmeval = summary.get("lmeval")
    for name, task in (lmeval.get("tasks") or {}).items() if isinstance(lmeval, Mapping) else ():
        for figure in list((task.get("metrics") or {}).values())[:1]:  # a task's first metric
            parts.append(f"{name} {figure['metric']} {figure['value']:.3f}")
    return ", ".join(parts) or "no tasks"


def out_of(value: Mapping[str, Any], total: int | None) -> str:
    """`20.0/23 (19-21)` over several reps, `20/23` for one, as the seed writes scores."""
    of = f"/{total}" if total is not None else ""
    if value.get("n", 0) <= 1:
        return f"{_figure(value['mean'])}{of}"
    if value["min"] == value["max"]:
        return f"{value['mean']:.1f}{of}"
    return f"{value['mean']:.1f}{of} ({_figure(value['min'])}-{_figure(value['max'])})"


def per_rep_scores(requests: Sequence[Mapping[str, Any]], rounds: Sequence[str] | None = None) -> dict[int, int]:
    """Tasks passed per repetition, from a stored run's request rows (what `grill compare` compares)."""
    counted = tuple(rounds) if rounds else SCORED_ROUNDS
    scores: dict[int, int] = {}
    for request in requests:
        data = request.get("data") or {}
        if request.get("warmup") or data.get("round") not in counted:
            continue
        scores.setdefault(request["rep"], 0)
        scores[request["rep"]] += data.get("status") == PASS
    return dict(sorted(scores.items()))


def _task_count(outcomes: Sequence[TaskOutcome], round_name: str) -> int:
    return len({outcome.task for outcome in outcomes if outcome.round == round_name})


def _passed(outcomes: Sequence[TaskOutcome], rounds: Sequence[str]) -> int:
    return sum(outcome.passed for outcome in outcomes if outcome.round in rounds)


def _count(outcomes: Sequence[TaskOutcome], status: str, round_name: str | None = None) -> int:
    return sum(outcome.status == status for outcome in outcomes if round_name in (None, outcome.round))


def _sum(outcomes: Sequence[TaskOutcome], round_name: str, attribute: str) -> float:
    return sum(getattr(outcome, attribute) for outcome in outcomes if outcome.round == round_name)


def _tokens_per_step(outcomes: Sequence[TaskOutcome], round_name: str) -> float | None:
    """Output tokens over tool-calling steps across the round's tasks, as the seed's "162 tok-per-step"."""
    steps = _sum(outcomes, round_name, "steps")
    return _sum(outcomes, round_name, "output_tokens") / steps if steps else None


def _figure(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
