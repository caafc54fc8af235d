"""What grill shows: a progress bar while a run runs, the summary tables after, the JSON report,
the selfcheck's table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from swaplab.grill.outcome import PASS, TaskOutcome
from swaplab.grill.runner import GrillOutcome, Observer
from swaplab.grill.selfcheck import Check
from swaplab.grill.summary import out_of
from swaplab.results.present import lmeval_table, model_name
from swaplab.results.report import report_header

RESULT_STYLE = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
# What the selfcheck proves of each suite's tasks.
PROVED = {
    "code": "reference passes the hidden tests, the known-wrong answer fails them",
    "humaneval": "canonical solution passes, an empty body fails",
    "agent": "reference trajectory solves the task, an empty one does not",
    "needle": "fact once at its depth; the scorer finds it and refuses other cells' facts",
}


class ProgressBar(Observer):
    """A rich progress bar over every task attempt, with the passes so far."""

    def __init__(self, console: Console):
        self.passed = 0
        self.done = 0
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[passed]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._task = self._progress.add_task("starting", total=None, passed="")

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()

    def planned(self, total: int) -> None:
        self._progress.reset(self._task, total=total, passed="")

    def phase(self, description: str) -> None:
        self._progress.update(self._task, description=description)

    def task_started(self, rep: int, suite: str, task: str) -> None:
        self._progress.update(self._task, description=f"rep {rep} · {suite} · {task}")

    def task_done(self, rep: int, outcome: TaskOutcome) -> None:
        self.done += 1
        self.passed += outcome.status == PASS
        self._progress.update(self._task, advance=1, passed=f"{self.passed}/{self.done} passed")


def show_outcome(outcome: GrillOutcome, console: Console, *, db_path: str, json_path: str | None) -> None:
    """The summary tables and where everything went."""
    run, summary = outcome.run, outcome.summary
    about = f"grill of {model_name(run.model, run.requested_model)} at {run.target_url}"
    backend = " ".join(part for part in (run.backend_kind, run.backend_version) if part)
    if backend:
        about += f", {backend}"
    console.print(about, style="bold", highlight=False)
    lmeval = summary.get("lmeval")
    for table in (rounds_table(summary), tasks_table(outcome), needle_table(summary),
                  lmeval_table(lmeval) if lmeval else None):
        if table is not None:
            console.print(table)
    if lmeval:
        console.print(f"lm-eval's per-sample log and results: {', '.join(lmeval.get('logs', [])[:4])}"
                      + (" ..." if len(lmeval.get("logs", [])) > 4 else "") + f" in {outcome.transcripts}",
                      highlight=False, soft_wrap=True)
    reps = summary["reps"]
    if summary.get("rounds") or summary.get("needle"):
        console.print(
            f"{reps} rep{'s' if reps != 1 else ''} at temperature {summary['temperature']:g}, "
            f"{summary['max_tokens']} tokens per answer: scores are mean/total (min-max) over reps.",
            highlight=False,
        )
    if lmeval:
        chosen = lmeval.get("temperature")
        console.print(
            f"lm-eval: {reps} rep{'s' if reps != 1 else ''}, "
            + (f"temperature {chosen:g}" if chosen is not None else "each task's own generation settings")
            + "; score is the mean over reps, ± lm-eval's standard error of one rep.",
            highlight=False,
        )
    if summary.get("isolation"):
        console.print(f"Sandbox: {summary['isolation']}.", highlight=False)
    for note in outcome.notes:
        console.print(f"[yellow]{note}[/yellow]", highlight=False)
    console.print(
        f"Stored as run {outcome.run_id} in {db_path}; transcripts in {outcome.transcripts}"
        + (f"; JSON in {json_path}" if json_path else "") + ".",
        highlight=False,
    )


def rounds_table(summary: Mapping[str, Any]) -> Table | None:
    """Score per round, the total, tok/step, R5 complete/looped: the seed's figures; None when
    no round ran (a needle-only run), rather than a table of headers."""
    table = Table()
    table.add_column("round")
    table.add_column("score", justify="right")
    for round_ in summary.get("rounds", ()):
        table.add_row(round_["round"], out_of(round_["score"], round_["total"]))
    if "score" in summary:
        table.add_row("[bold]total[/bold]", f"[bold]{out_of(summary['score'], summary['total'])}[/bold]", end_section=True)
    r5 = summary.get("r5")
    if r5:
        table.add_row("R5 complete", out_of(r5["complete"], r5["total"]))
        table.add_row("R5 looped", out_of(r5["looped"], r5["total"]))
    if summary.get("tok_per_step", {}).get("n"):
        table.add_row("r4 tok/step", out_of(summary["tok_per_step"], None))
    if summary.get("truncated", {}).get("max"):
        table.add_row("truncated (budget ran out)", out_of(summary["truncated"], None))
    if summary.get("errors", {}).get("max"):
        table.add_row("[red]request errors[/red]", out_of(summary["errors"], None))
    return table if table.row_count else None


def tasks_table(outcome: GrillOutcome) -> Table | None:
    """Every task that failed in some repetition, with why (the first failure's detail)."""
    failures: dict[tuple[str, str], list[TaskOutcome]] = {}
    attempts: dict[tuple[str, str], int] = {}
    for _, task in outcome.outcomes:
        if task.round == "needle":
            continue
        key = (task.round, task.task)
        attempts[key] = attempts.get(key, 0) + 1
        if not task.passed:
            failures.setdefault(key, []).append(task)
    if not failures:
        return None
    table = Table(title="tasks that failed", title_justify="left")
    for column in ("round", "task", "failed", "first reason"):
        table.add_column(column, overflow="fold")
    for (round_, name), failed in failures.items():
        first = failed[0]
        table.add_row(round_, name, f"{len(failed)}/{attempts[(round_, name)]}", f"{first.status}: {first.detail}"[:160])
    return table


def needle_table(summary: Mapping[str, Any]) -> Table | None:
    """The needle grid: a row per haystack length, a column per depth."""
    cells = summary.get("needle")
    if not cells:
        return None
    depths = sorted({cell["depth"] for cell in cells})
    table = Table(title="needle (passes/reps)", title_justify="left")
    table.add_column("context tokens", justify="right")
    for depth in depths:
        table.add_column(f"depth {depth:g}", justify="center")
    for length in sorted({cell["context_tokens"] for cell in cells}):
        row = {cell["depth"]: cell for cell in cells if cell["context_tokens"] == length}
        shown = []
        for depth in depths:
            cell = row.get(depth)
            if cell is None:
                shown.append("-")
                continue
            style = RESULT_STYLE.get(cell["result"], "")
            shown.append(f"[{style}]{cell['result']} {cell['passed']}/{cell['n']}[/{style}]")
        table.add_row(f"{length:,}", *shown)
    return table


def report_document(outcome: GrillOutcome) -> dict[str, Any]:
    """The run as one self-contained JSON document: what ran, the summary, every task attempt."""
    return {
        **report_header(outcome.run, outcome.run_id),
        "summary": outcome.summary,
        "transcripts": str(outcome.transcripts),
        "tasks": [
            {
                "rep": rep, "suite": task.suite, "round": task.round, "task": task.task, "status": task.status,
                "detail": task.detail, "steps": task.steps, "output_tokens": task.output_tokens,
                "wall_seconds": round(task.wall_seconds, 3), "extra": task.extra,
            }
            for rep, task in outcome.outcomes
        ],
    }


def selfcheck_table(checks: Sequence[tuple[str, list[Check]]]) -> Table:
    """A line per suite (with its proofs, in the order run): its tasks, how many proved themselves, what was checked."""
    table = Table(title="grill selfcheck", title_justify="left")
    for column in ("suite", "tasks", "proved", "what was checked"):
        table.add_column(column)
    for suite, proofs in checks:
        proved = sum(check.ok for check in proofs)
        style = "green" if proved == len(proofs) else "red"
        table.add_row(suite, str(len(proofs)), f"[{style}]{proved}/{len(proofs)}[/{style}]", PROVED[suite])
    return table
