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

from swaplab.catalog.figures import backend, central, number, repetitions, spread_text, when

GRILL_KIND = "grill"


@dataclass(frozen=True)
class GrillRow:
    run_id: int
    started: str
    model: str
    """The name the run was recorded under (an id or an alias)."""
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
    score, total = summary.get("score"), summary.get("total")
    score_text = spread_text(score)
    if score_text != "-" and total is not None:
        mean, _, spread = score_text.partition(" ")
        score_text = f"{mean}/{total}" + (f" {spread}" if spread else "")
    elif score_text == "-" and isinstance(summary.get("headline"), str):
        score_text = summary["headline"]
    log = summary.get("log") if isinstance(summary.get("log"), str) else ""
    return GrillRow(
        run_id=run["id"],
        started=when(run.get("started_at")),
        model=run.get("model", ""),
        backend=backend(run),
        status=run.get("status", "completed"),
        score=score_text,
        score_mean=central(score),
        reps=repetitions(score) or summary.get("reps"),
        rounds=_rounds(summary.get("rounds")),
        tok_per_step=spread_text(summary.get("tok_per_step")),
        r5=_r5(summary.get("r5")),
        log=log,
        log_href=_log_href(log),
    )


def latest_score(rows: Sequence[GrillRow]) -> GrillRow | None:
    """The most recent completed run with a score."""
    scored = [row for row in rows if row.score_mean is not None and row.status == "completed"]
    return scored[-1] if scored else None


def _rounds(rounds: Any) -> str:
    """`r1 7/8 · r2 3/5 · r3 5/5`."""
    if not isinstance(rounds, list):
        return ""
    parts = []
    for item in rounds:
        if isinstance(item, Mapping) and central(item.get("score")) is not None:
            total = f"/{item['total']}" if item.get("total") is not None else ""
            parts.append(f"{item.get('round', '?')} {number(central(item['score']))}{total}")
    return " · ".join(parts)


def _r5(r5: Any) -> str:
    """`6/6 complete, 0/6 looped` (means over repetitions, with their spread)."""
    if not isinstance(r5, Mapping):
        return "-"
    total = f"/{r5['total']}" if r5.get("total") is not None else ""
    parts = []
    for key in ("complete", "looped"):
        if central(r5.get(key)) is not None:
            value = spread_text(r5[key])
            mean, _, spread = value.partition(" ")
            parts.append(f"{mean}{total} {key}" + (f" {spread}" if spread else ""))
    return ", ".join(parts) or "-"


def _log_href(log: str) -> str | None:
    if log.startswith(("http://", "https://")):
        return log
    if log.startswith("/"):
        return "file://" + quote(log)
    return None
