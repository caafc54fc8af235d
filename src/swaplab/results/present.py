"""`swaplab runs list` and `swaplab runs show`: recorded runs as rich tables, or as JSON.

Summaries are written by their producers (bench, grill); this module reads them by
shape, not by kind: a figure over repetitions is `{mean, min, max}`, a latency
`{p50, p90, p99, mean}`, a bench summary has `levels`, and any summary may carry a
`headline`, the one phrase `runs list` shows for it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swaplab.errors import SwaplabError
from swaplab.results.runs import get_run, list_runs
from swaplab.results.store import connect, default_path

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# How a level's own keys name it, in the order they are joined ("c=1 in=8192").
LEVEL_NAMES = (("concurrency", "c"), ("rate", "rate"), ("input_tokens", "in"))
# Headers for the figures bench writes per level; other keys are shown under their own name.
FIGURE_HEADERS = {
    "output_tokens_per_second": "out tok/s",
    "requests_per_second": "req/s",
    "ttft_ms": "TTFT ms",
    "tpot_ms": "TPOT ms",
    "itl_ms": "ITL ms",
    "e2e_ms": "E2E ms",
    "prefill_tokens_per_second": "prefill tok/s",
    "achieved_input_tokens": "in tokens",
    "achieved_output_tokens": "out tokens",
    "error_rate": "errors",
}
MOST_ERRORS_SHOWN = 5


# -- the commands ------------------------------------------------------------------------


def list_command(
    db: str | None = None, *, model: str | None = None, kind: str | None = None, limit: int = 20,
    console: Console | None = None,
) -> int:
    """`swaplab runs list`: the latest runs, the most recent at the bottom; returns the exit code."""
    from rich.console import Console

    console = console or Console()
    path = _existing_store(db)
    if path is None:
        console.print(f"No runs recorded yet ({default_path()} does not exist: `swaplab bench` and `swaplab grill` create it).")
        return 0
    with _reading(path) as connection:
        runs = list_runs(connection, model=model, kind=kind, limit=limit)
    if not runs:
        console.print(f"No {kind + ' ' if kind else ''}runs{f' for {model}' if model else ''} in {path}.")
        return 0
    runs.reverse()
    console.print(runs_table(runs, title=f"Last {len(runs)} runs in {path}"))
    return 0


def show_command(db: str | None, run_id: int, *, as_json: bool = False, console: Console | None = None) -> int:
    """`swaplab runs show ID`: one run's metadata, parameters, summary per level and errors; returns the exit code."""
    from rich.console import Console

    path = _existing_store(db)
    if path is None:
        raise SwaplabError(f"no run {run_id}: no runs recorded yet ({default_path()} does not exist)")
    with _reading(path) as connection:
        run = get_run(connection, run_id)
    if run is None:
        raise SwaplabError(f"no run {run_id} in {path} (`swaplab runs list` shows the ids)")
    if as_json:
        print(json.dumps(run, indent=2, ensure_ascii=False))
        return 0
    console = console or Console()
    for number, renderable in enumerate(run_details(run)):
        if number > 1:  # a blank line before each titled section
            console.print()
        console.print(renderable)
    return 0


def _existing_store(db: str | None) -> Path | None:
    """The store to read; None when the default one does not exist yet. Reading never creates a file."""
    path = Path(db) if db else default_path()
    if path.exists():
        return path
    if db:
        raise SwaplabError(f"no swaplab database at {path}")
    return None


@contextmanager
def _reading(path: Path) -> Iterator[sqlite3.Connection]:
    try:
        with closing(connect(path)) as connection:
            yield connection
    except sqlite3.DatabaseError as error:
        raise SwaplabError(f"cannot read {path}: {error} (is it a swaplab database?)") from None


# -- what they print -----------------------------------------------------------------------


def runs_table(runs: list[dict[str, Any]], *, title: str | None = None) -> Table:
    """A rich table of runs (as `list_runs` returns them), in the order given."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    # On a narrow terminal the long names fold; the id and the result never vanish.
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("time", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("model", overflow="fold", min_width=7)
    table.add_column("backend", overflow="fold", min_width=7)
    table.add_column("result", overflow="fold", min_width=12)
    table.add_column("requests", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for run in runs:
        table.add_row(
            str(run["id"]),
            _time(run["started_at"]),
            run["kind"],
            model_name(run["model"], run["requested_model"]),
            _backend(run),
            headline(run),
            _request_counts(run),
            run["status"],
            style=None if run["status"] == "completed" else "red",
        )
    return table


def run_details(run: dict[str, Any]) -> list[Any]:
    """What `runs show` prints for a run from `get_run`: renderables, top to bottom."""
    from rich.table import Table
    from rich.text import Text

    shown: list[Any] = [Text(f"Run {run['id']}: {run['kind']} of {model_name(run['model'], run['requested_model'])}, {run['status']}", style="bold")]
    about = Table.grid(padding=(0, 2))
    about.add_column(style="dim")
    about.add_column()
    about.add_row("target", run["target_url"])
    about.add_row("backend", _backend(run))
    about.add_row("config hash", run["config_hash"] or "- (not run through a swaplab router)")
    about.add_row("host", run["host"] or "-")
    about.add_row("swaplab", run["swaplab_version"])
    about.add_row("started", _time(run["started_at"], seconds=True))
    if run["ended_at"] is not None:
        about.add_row("ended", f"{_time(run['ended_at'], seconds=True)} ({_elapsed(run['ended_at'] - run['started_at'])})")
    about.add_row("warm-up", f"{run['warmup_discarded']} repetition{'s' if run['warmup_discarded'] != 1 else ''} run and discarded")
    warmup_requests = len(run["requests"]) - run["request_count"]
    about.add_row(
        "requests",
        f"{run['request_count']} measured, {run['error_count']} failed"
        + (f"; {warmup_requests} warm-up" if warmup_requests else ""),
    )
    shown.append(about)

    if run["parameters"]:
        shown.append(_key_values("Parameters", run["parameters"]))
    summary = dict(run["summary"])
    levels = summary.pop("levels", None)
    summary.pop("headline", None)
    if isinstance(levels, list) and levels and all(isinstance(level, Mapping) for level in levels):
        shown.append(levels_table(levels, title="Per level"))
    if summary:
        shown.append(_key_values("Summary", summary))
    errors = Counter(request["error"] for request in run["requests"] if request["error"] and not request["warmup"])
    if errors:
        listing = Table(title="Errors", title_justify="left", show_header=False, box=None, padding=(0, 2))
        listing.add_column(justify="right")
        listing.add_column(overflow="fold", style="red")
        for message, count in errors.most_common(MOST_ERRORS_SHOWN):
            listing.add_row(f"{count}x", message)
        if len(errors) > MOST_ERRORS_SHOWN:
            listing.add_row("", f"... and {len(errors) - MOST_ERRORS_SHOWN} other messages")
        shown.append(listing)
    return shown


def levels_table(levels: list[Mapping[str, Any]], *, title: str | None = None) -> Table:
    """One row per level, one column per figure the levels carry, in the order they first appear."""
    from rich.table import Table

    naming = {"level", *(key for key, _ in LEVEL_NAMES)}
    figures: list[str] = []
    for level in levels:
        figures += [key for key in level if key not in naming and key not in figures]
    table = Table(title=title, title_justify="left")
    table.add_column("level", no_wrap=True)
    for key in figures:
        header = FIGURE_HEADERS.get(key, key)
        if any(_is_distribution(level.get(key)) for level in levels):
            header += " p50 / p99"
        table.add_column(header, justify="right")
    for level in levels:
        table.add_row(level_name(level), *(_cell(level.get(key), percent=key == "error_rate") for key in figures))
    return table


def level_name(level: Mapping[str, Any]) -> str:
    """"c=4", "rate=2.0", "c=1 in=8192": how a level is named in tables and in the `requests.level` column."""
    if "level" in level:
        return str(level["level"])
    parts = [f"{short}={level[key]}" for key, short in LEVEL_NAMES if level.get(key) is not None]
    return " ".join(parts) or "-"


def headline(run: Mapping[str, Any]) -> str:
    """The run's key figure in a phrase: the summary's own `headline`, else the peak tok/s or the last TTFT."""
    summary = run["summary"]
    if isinstance(summary.get("headline"), str):
        return summary["headline"]
    levels = [level for level in summary.get("levels") or () if isinstance(level, Mapping)]
    rated = [level for level in levels if _central(level.get("output_tokens_per_second")) is not None]
    if rated:
        best = max(rated, key=lambda level: _central(level["output_tokens_per_second"]))
        return f"{_number(_central(best['output_tokens_per_second']))} tok/s at {level_name(best)}"
    timed = [level for level in levels if _central(level.get("ttft_ms")) is not None]
    if timed:
        return f"TTFT {_number(_central(timed[-1]['ttft_ms']))} ms at {level_name(timed[-1])}"
    if "score" in summary:
        return f"score {_cell(summary['score'])}"
    return "-"


def model_name(model: str, requested_model: str | None) -> str:
    """How a run's model is shown: the name asked for, with the id it resolved to in parentheses when different."""
    if requested_model and requested_model != model:
        return f"{requested_model} ({model})"
    return model


# -- cells ------------------------------------------------------------------------------------


def _is_spread(value: Any) -> bool:
    return isinstance(value, Mapping) and "mean" in value and "min" in value and "max" in value


def _is_distribution(value: Any) -> bool:
    return isinstance(value, Mapping) and "p50" in value


def _central(value: Any) -> float | None:
    """The number a figure stands for: itself, a spread's mean, a distribution's p50 (and its mean over reps)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if _is_distribution(value):
        return _central(value["p50"])
    if _is_spread(value):
        return _central(value["mean"])
    return None


def _cell(value: Any, *, percent: bool = False) -> str:
    """A figure as a table cell: 812 (798-830) for a spread, 38.6 / 52.1 for p50 / p99."""
    form = (lambda number: f"{number:.1%}") if percent else _number
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return form(value)
    if _is_distribution(value):
        return " / ".join(_cell(value.get(key), percent=percent) for key in ("p50", "p99"))
    if _is_spread(value):
        mean, low, high = value["mean"], value["min"], value["max"]
        if mean is None:
            return "-"
        if low is None or high is None or low == high:
            return form(mean)
        return f"{form(mean)} ({form(low)}-{form(high)})"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _number(value: float) -> str:
    if isinstance(value, int) or (value.is_integer() and abs(value) < 1e6):
        return f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _key_values(title: str, values: Mapping[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in values.items():
        table.add_row(key, _cell(value))
    return table


def _backend(run: Mapping[str, Any]) -> str:
    parts = [part for part in (run["backend_kind"], run["backend_version"]) if part]
    return " ".join(parts) or "-"


def _request_counts(run: Mapping[str, Any]) -> str:
    if run["error_count"]:
        return f"{run['request_count']} ({run['error_count']} failed)"
    return str(run["request_count"])


def _time(stamp: float, *, seconds: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M" + (":%S" if seconds else ""), time.localtime(stamp))


def _elapsed(seconds: float) -> str:
    if seconds < 60:
        return f"took {seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"took {minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"took {hours} h {minutes} min"
