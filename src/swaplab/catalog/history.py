"""The run history table (Run, Score, tok/step, R5, Log) from grill runs in the store.

The grill's run summary, as the catalogue reads it (docs/results.md, "Grill runs"):
`score` and `tok_per_step` are spreads over repetitions ({mean, min, max, n}) or plain
numbers, `total` the number of tasks scored, `rounds` a list of {round, score, total},
`r5` {complete, looped, total} (complete and looped again spreads or numbers), `log`
where the transcripts are (a URL or a path), `headline` the phrase `runs list` shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from swaplab.catalog.figures import backend, central, repetitions, spread_range, spread_text, when

GRILL_KIND = "grill"


@dataclass(frozen=True)
class GrillRow:
    run_id: int
    started: str
    model: str
    """The name the run asked for (an id or an alias)."""
    backend: str
    status: str
    score: str
    score_mean: float | None
    reps: int | None
    rounds: str
    tok_per_step: str
    r5: str
    log: str
    log_href: str | None
    """A link for `log` when it is a URL or an absolute path; relative paths are shown, not linked."""


def grill_rows(runs: Sequence[Mapping[str, Any]]) -> list[GrillRow]:
    """One row per grill run, oldest first, as the seed's table has them."""
    return [grill_row(run) for run in runs if run.get("kind") == GRILL_KIND]


def grill_row(run: Mapping[str, Any]) -> GrillRow:
    summary = run.get("summary") or {}
    score = summary.get("score")
    score_text = out_of(score, summary.get("total"))
    lmeval = summary.get("lmeval")
    if score_text == "-" and isinstance(lmeval, Mapping) and isinstance(lmeval.get("tasks"), Mapping):
        count = len(lmeval["tasks"])  # its scores are the lm-eval section's, below
        score_text = f"lm-eval: {count} task{'s' if count != 1 else ''}"
    elif score_text == "-" and isinstance(summary.get("headline"), str):
        score_text = summary["headline"]
    log = summary.get("log") if isinstance(summary.get("log"), str) else ""
    return GrillRow(
        run_id=run["id"],
        started=when(run.get("started_at")),
        model=run.get("requested_model") or run.get("model", ""),
        backend=backend(run),
        status=run.get("status", "completed"),
        score=score_text,
        score_mean=central(score),
        reps=repetitions(score) or summary.get("reps"),
        rounds=_rounds(summary.get("rounds")),
        tok_per_step=spread_text(summary.get("tok_per_step")),
        r5=_r5(summary.get("r5")),
        log=log,
        log_href=log_href(log),
    )


def latest_score(rows: Sequence[GrillRow]) -> GrillRow | None:
    """The most recent completed run with a score."""
    scored = [row for row in rows if row.score_mean is not None and row.status == "completed"]
    return scored[-1] if scored else None


def out_of(value: Any, total: Any) -> str:
    """A count over repetitions against its maximum: `22/23`, `20.0/23 (19–21)`; `-` when absent."""
    mean = central(value)
    if mean is None:
        return "-"
    of = f"/{total}" if total is not None else ""
    bounds = spread_range(value)
    if bounds is None:
        return f"{_count(mean)}{of}"
    return f"{mean:.1f}{of} ({_count(bounds[0])}–{_count(bounds[1])})"


def _count(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _rounds(rounds: Any) -> str:
    """`r1 7/8 · r2 3.0/5 (2–4) · r3 5/5`."""
    if not isinstance(rounds, list):
        return ""
    parts = [
        f"{item.get('round', '?')} {out_of(item['score'], item.get('total'))}"
        for item in rounds
        if isinstance(item, Mapping) and central(item.get("score")) is not None
    ]
    return " · ".join(parts)


def _r5(r5: Any) -> str:
    """`6/6 complete, 0/6 looped` (means over repetitions, with their spread)."""
    if not isinstance(r5, Mapping):
        return "-"
    parts = [f"{out_of(r5[key], r5.get('total'))} {key}" for key in ("complete", "looped") if central(r5.get(key)) is not None]
    return ", ".join(parts) or "-"


def log_href(log: str) -> str | None:
    """A link for a log that is a URL or an absolute path; None for a relative path, which can only be shown."""
    if log.startswith(("http://", "https://")):
        return log
    if log.startswith("/"):
        return "file://" + quote(log)
    return None
