"""How the store's contents are shown: runs and their levels as rich tables, the activity table.

What `swaplab runs` and `swaplab activity` print, and what bench and grill reuse (the
levels table, the model's name). Summaries are written by their producers (bench,
grill); this module reads them by shape, not by kind: a figure over repetitions is `{mean, min, max}`, a latency
`{p50, p90, p99, mean}`, a bench summary has `levels`, and any summary may carry a
`headline`, the one phrase `runs list` shows for it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


# -- runs ---------------------------------------------------------------------------------------


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
    lmeval = summary.pop("lmeval", None)
    if isinstance(levels, list) and levels and all(isinstance(level, Mapping) for level in levels):
        shown.append(levels_table(levels, title="Per level"))
    if isinstance(lmeval, Mapping):
        shown.append(lmeval_table(lmeval))
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


def lmeval_table(lmeval: Mapping[str, Any]) -> Table:
    """A grill run's lm-eval tasks: a row per task and metric, the score ± lm-eval's standard error, n, the
    spread over repetitions and where the task's data came from."""
    from rich.table import Table

    limit = lmeval.get("limit")
    title = f"lm-eval ({lmeval.get('api', '?')} API" + (f", --limit {limit}" if limit else "") + ")"
    table = Table(title=title, title_justify="left")
    for column, justify in (("task", "left"), ("metric", "left"), ("score", "right"), ("± stderr", "right"),
                            ("n", "right"), ("reps (min-max)", "right"), ("data", "left")):
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for name, task in (lmeval.get("tasks") or {}).items():
        for figure in (task.get("metrics") or {}).values():
            reps = figure.get("reps") or []
            spread = "-" if len(reps) < 2 else f"{len(reps)} ({min(reps):.3f}-{max(reps):.3f})"
            stderr = figure.get("stderr")
            shown_metric = figure["metric"] + (f" ({figure['filter']})" if figure.get("filter") not in (None, "none") else "")
            table.add_row(name, shown_metric, f"{figure['value']:.3f}", "-" if stderr is None else f"{stderr:.3f}",
                          str(task.get("n") or "-"), spread, str(task.get("source") or "-"))
    if lmeval.get("answers"):
        rate = lmeval.get("truncation_rate") or 0.0
        table.caption = (f"{lmeval['truncated']} of {lmeval['answers']} answers truncated in their thinking "
                         f"({rate:.1%}), scored as failures")
    return table


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


# -- activity ---------------------------------------------------------------------------------


def _ttft_tags(row: dict[str, Any]) -> list[str]:
    tags = [row["waited_for"]] if row.get("waited_for") else []
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            metadata = None
    if isinstance(metadata, dict) and metadata.get("context") == "restored":
        tags.append("restored")
    return tags


def activity_table(rows: list[dict[str, Any]], *, title: str | None = None) -> Table:
    """A rich table of activity rows, in the order given; a session column when any row names one.

    A request that waited for its model's cold start or wake says so beside its TTFT: `12034 (start)`;
    one whose prompt came from a restored context (kvCache) says `(restored)`.
    """
    from rich.table import Table

    sessions = any(row.get("session_id") for row in rows)
    table = Table(title=title, title_justify="left")
    table.add_column("time", no_wrap=True)
    if sessions:
        table.add_column("session", overflow="fold")
    table.add_column("model", no_wrap=True)
    table.add_column("path", no_wrap=True)
    table.add_column("status", justify="right")
    table.add_column("tokens in/out", justify="right", no_wrap=True)
    table.add_column("TTFT ms", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("error", overflow="fold")
    today = time.strftime("%Y-%m-%d")
    for row in rows:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["time"]))
        model = row["model"] if row["peer"] is None else f"{row['peer']}/{row['model']}"
        if row["requested_model"] and row["requested_model"] not in (row["model"], model):
            model += f" ({row['requested_model']})"
        status = str(row["status"])
        if row["client_disconnected"]:
            status += " gone"  # the client left before the end
        error = row["error"] or ""
        table.add_row(
            stamp.removeprefix(today + " "),
            *([row.get("session_id") or "-"] if sessions else []),
            model,
            row["path"],
            status,
            f"{_or_dash(row['prompt_tokens'])}/{_or_dash(row['completion_tokens'])}",
            _or_dash(row["ttft_ms"]) + "".join(f" ({tag})" for tag in _ttft_tags(row)),
            _or_dash(row["tokens_per_second"], "{:.1f}"),
            _duration(row["duration_ms"]),
            error,
            style="red" if row["status"] >= 400 or error else None,
        )
    return table


def _or_dash(value: float | None, form: str = "{:.0f}") -> str:
    return "-" if value is None else form.format(value)


def _duration(milliseconds: float) -> str:
    if milliseconds < 10_000:
        return f"{milliseconds:.0f} ms"
    return f"{milliseconds / 1000:.1f} s"


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
