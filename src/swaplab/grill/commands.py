"""The `swaplab grill` commands: what cli.py calls, with their console output."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import TYPE_CHECKING

from swaplab.results.report import check_report_path, report_header, write_report
from swaplab.results.store import default_path

if TYPE_CHECKING:
    from rich.console import Console

    from swaplab.grill.runner import GrillOutcome, GrillSettings


def run(args: argparse.Namespace) -> int:
    """Dispatch `swaplab grill run | selfcheck | compare`."""
    if args.grill_command == "compare":
        return compare_command(args.db, args.a, args.b)
    if args.grill_command == "selfcheck":
        from swaplab.grill.selfcheck import selfcheck_command

        return selfcheck_command(args.suite)
    from swaplab.grill.runner import GrillSettings

    settings = GrillSettings(
        url=args.url,
        model=args.model,
        suites=args.suite,
        reps=args.reps,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        tasks=[name.strip() for name in (args.tasks or "").split(",") if name.strip()],
        needle_lengths=args.needle_lengths,
        needle_depths=args.needle_depths,
        transcripts=args.transcripts,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        db=args.db,
    )
    return run_command(settings, json_path=args.json)


def run_command(settings: GrillSettings, *, json_path: str | None = None, console: Console | None = None) -> int:
    """`swaplab grill run`: grade, store, print; 0, or 1 when every request failed."""
    from rich.console import Console

    from swaplab.grill.report import ProgressBar, show_outcome
    from swaplab.grill.runner import execute

    console = console or Console()
    check_report_path(json_path)
    with ProgressBar(console) as progress:
        outcome = asyncio.run(execute(settings, progress))
    if json_path:
        write_report(json_path, report_document(outcome))
    show_outcome(outcome, console, db_path=str(settings.db or default_path()), json_path=json_path)
    return 0 if outcome.run.status == "completed" else 1


def report_document(outcome: GrillOutcome) -> dict:
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


def compare_command(db: str | None, a: int, b: int, *, console: Console | None = None) -> int:
    """`swaplab grill compare A B`: one verdict per figure."""
    from rich.console import Console

    from swaplab.grill.compare import compare_runs, sentences

    console = console or Console()
    for line in sentences(*compare_runs(db, a, b)):
        console.print(line, highlight=False, soft_wrap=True)
    return 0
