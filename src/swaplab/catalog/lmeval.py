"""The lm-eval table (Task, Metric, Score ± stderr, n, Reps, API, Limit, Run) from grill runs in the store.

A grill run with the `lmeval` suite carries, in its summary, lm-eval's own figures
(`grill.lmeval.summary_of`): `api`, `limit`, `answers`, `truncated`, `truncation_rate`,
`logs` (file names in the run's `log` folder) and `tasks`, each with `source`, `n` and
`metrics` keyed `metric,filter`: {metric, filter, value, reps, spread, stderr}. The
table shows, per task and metric, the latest run that scored it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from swaplab.catalog.figures import when
from swaplab.catalog.history import GRILL_KIND, log_href

SAMPLES_SUFFIX = ".samples.jsonl"


@dataclass(frozen=True)
class LmevalRow:
    task: str
    metric: str
    """The metric, with lm-eval's filter in brackets unless it is `none`: `exact_match (last-number)`."""
    score: str
    stderr: str
    """lm-eval's standard error of one repetition, `-` when it gave none."""
    n: str
    reps: str
    """`2 (0.150–0.150)`: how many repetitions, and the lowest and highest score among them; `1` for one."""
    api: str
    limit: str
    source: str
    """Where the task's data came from, local paths shortened to file names: `local: two_digit_addition.jsonl`."""
    source_full: str
    run_id: int
    started: str
    status: str
    truncation: str | None
    """`5.0% of answers truncated (2/40)` when the run truncated any, else None."""
    samples_href: str | None
    """A link to lm-eval's per-sample log of the task (its first repetition), when the run's log folder is linkable."""
    previous: str | None
    """`0.100 in run #3`: the score in the run before, when an older run scored it too."""


class _Scoring(NamedTuple):
    """One run's figures for one task and metric."""

    run: Mapping[str, Any]
    lmeval: Mapping[str, Any]
    task: Mapping[str, Any]
    figure: Mapping[str, Any]


def lmeval_rows(runs: Sequence[Mapping[str, Any]]) -> list[LmevalRow]:
    """One row per (task, metric) any grill run scored, from the latest run that scored it, sorted by both."""
    scorings: dict[tuple[str, str], list[_Scoring]] = {}  # oldest run first, as `runs` are
    for run in runs:
        lmeval = (run.get("summary") or {}).get("lmeval") if run.get("kind") == GRILL_KIND else None
        if not isinstance(lmeval, Mapping) or not isinstance(lmeval.get("tasks"), Mapping):
            continue
        for name, task in lmeval["tasks"].items():
            metrics = task.get("metrics") if isinstance(task, Mapping) else None
            if not isinstance(metrics, Mapping):
                continue
            for key, figure in metrics.items():
                if isinstance(figure, Mapping):
                    scoring = _Scoring(run, lmeval, task, figure)
                    scorings.setdefault((str(name), metric_label(key, figure)), []).append(scoring)
    return [_row(name, metric, scorings[name, metric]) for name, metric in sorted(scorings)]


def _row(name: str, metric: str, scorings: Sequence[_Scoring]) -> LmevalRow:
    run, lmeval, task, figure = scorings[-1]
    before = scorings[-2] if len(scorings) > 1 else None
    source = str(task.get("source") or "")
    return LmevalRow(
        task=name,
        metric=metric,
        score=_decimals(figure.get("value")),
        stderr=_decimals(figure.get("stderr")),
        n=str(task["n"]) if isinstance(task.get("n"), int) else "-",
        reps=_reps(figure.get("reps")),
        api=str(lmeval.get("api") or "-"),
        limit="all" if lmeval.get("limit") is None else str(lmeval["limit"]),
        source=short_source(source) if source else "-",
        source_full=source,
        run_id=run["id"],
        started=when(run.get("started_at")),
        status=run.get("status", "completed"),
        truncation=_truncation(lmeval),
        samples_href=_samples_href(run, lmeval, name),
        previous=f"{_decimals(before.figure.get('value'))} in run #{before.run['id']}" if before else None,
    )


def metric_label(key: str, figure: Mapping[str, Any]) -> str:
    """`exact_match (last-number)` from the key `exact_match,last-number`; `acc` for `acc,none`."""
    name, _, key_filter = key.partition(",")
    metric = str(figure.get("metric") or name)
    filter_name = str(figure.get("filter") or key_filter)
    return metric if filter_name in ("", "none") else f"{metric} ({filter_name})"


def short_source(source: str) -> str:
    """`local: a.jsonl, b.jsonl` for `local: /abs/a.jsonl, /abs/b.jsonl`; a hub dataset as it is."""
    kind, separator, where = source.partition(": ")
    if kind != "local" or not separator:
        return source
    return "local: " + ", ".join(PurePosixPath(path).name for path in where.split(", "))


def _decimals(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:.3f}"


def _reps(reps: Any) -> str:
    values = [value for value in reps if isinstance(value, (int, float))] if isinstance(reps, list) else []
    if not values:
        return "-"
    if len(values) == 1:
        return "1"
    return f"{len(values)} ({min(values):.3f}–{max(values):.3f})"


def _truncation(lmeval: Mapping[str, Any]) -> str | None:
    rate = lmeval.get("truncation_rate")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
        return None
    truncated, answers = lmeval.get("truncated"), lmeval.get("answers")
    counts = f" ({truncated}/{answers})" if isinstance(truncated, int) and isinstance(answers, int) else ""
    return f"{rate:.1%} of answers truncated{counts}"


def _samples_href(run: Mapping[str, Any], lmeval: Mapping[str, Any], task: str) -> str | None:
    # The suite names a task's sample log `lmeval-rep1-TASK.samples.jsonl`, with characters unsafe in a
    # file name replaced: such a task gets no link here; the run history links the run's whole folder.
    folder = (run.get("summary") or {}).get("log")
    logs = lmeval.get("logs")
    if not isinstance(folder, str) or not folder or not isinstance(logs, list):
        return None
    for name in logs:
        if isinstance(name, str) and name.endswith(f"-{task}{SAMPLES_SUFFIX}"):
            return log_href(f"{folder.rstrip('/')}/{name}")
    return None
