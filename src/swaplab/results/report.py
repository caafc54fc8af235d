"""The JSON report a bench or grill run writes with `--json FILE`: its path checked before the
run, one header for every kind, the file written whole; and the run from the command line
(`run_and_show`: progress, report, outcome), the same for both."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich.console import Console

from swaplab.errors import SwaplabError
from swaplab.results.console import command_console
from swaplab.results.runs import Run
from swaplab.results.store import default_path


def check_report_path(path: str | None) -> None:
    """Refuse a `--json` file whose folder does not exist; checked before the run, so a typo
    can't cost a finished measurement its report."""
    if path and not Path(path).resolve().parent.is_dir():
        raise SwaplabError(f"--json {path}: directory {Path(path).resolve().parent} does not exist")


def report_header(run: Run, run_id: int) -> dict[str, Any]:
    """The top of every run's report: which run, what it measured, against what, with which settings.

    `model` is the name asked for and `model_id` the id it resolved to; `alias` is that id
    again when the two differ (else null), as grill reports have always carried it.
    """
    return {
        "run_id": run_id,
        "kind": run.kind,
        "target_url": run.target_url,
        "model": run.requested_model or run.model,
        "model_id": run.model,
        "alias": run.model if run.requested_model else None,
        "backend_kind": run.backend_kind,
        "backend_version": run.backend_version,
        "config_hash": run.config_hash,
        "host": run.host,
        "swaplab_version": run.swaplab_version,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "status": run.status,
        "parameters": dict(run.parameters),
    }


class Outcome(Protocol):
    """What a bench or grill run ends with: at least the run it stores."""

    run: Run


Measured = TypeVar("Measured", bound=Outcome)
Progress = TypeVar("Progress")


def run_and_show(
    measure: Callable[[Progress], Awaitable[Measured]],
    progress_bar: Callable[[Console], AbstractContextManager[Progress]],
    document: Callable[[Measured], Mapping[str, Any]],
    show: Callable[..., None],
    *,
    db: str | None,
    json_path: str | None,
) -> int:
    """A bench or grill run from the command line: the `--json` path checked first, the run
    under its progress bar, the report written, the outcome shown; 0, or 1 when every request
    failed."""
    check_report_path(json_path)
    console = command_console()
    with progress_bar(console) as progress:
        outcome = asyncio.run(measure(progress))
    if json_path:
        write_report(json_path, document(outcome))
    show(outcome, console, db_path=str(db or default_path()), json_path=json_path)
    return 0 if outcome.run.status == "completed" else 1


def write_report(path: str, document: Mapping[str, Any]) -> None:
    """Write the report under a temporary name, then rename it into place: never a half-written file."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(document, indent=2, default=str) + "\n")
    partial.replace(target)
