"""`swaplab activity` and `swaplab runs list|show`: what the store holds, printed."""

from __future__ import annotations

import argparse

DB_HELP = "the swaplab database (default: $SWAPLAB_DB or the user's data directory)"


JSON_LINES_HELP = "print JSON Lines: one object per {what}, oldest first (the store's path on stderr)"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab activity` and `swaplab runs list|show`, with their arguments."""
    activity = commands.add_parser("activity", help="print the requests the router proxied most recently")
    activity.add_argument("--model", help="only this model (id or the name the client sent)")
    activity.add_argument("--limit", type=int, default=20, help="how many requests (default 20)")
    activity.add_argument("--db", help=DB_HELP)
    activity.add_argument("--json", action="store_true", help=JSON_LINES_HELP.format(what="request"))

    runs = commands.add_parser("runs", help="list or show recorded bench and grill runs")
    actions = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the latest runs, the most recent at the bottom")
    listing.add_argument("--model", help="only runs of this model (recorded under it as id or alias)")
    listing.add_argument("--kind", help="only runs of this kind (throughput, prefill, prefix-cache, grill, ...)")
    listing.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    listing.add_argument("--db", help=DB_HELP)
    listing.add_argument("--json", action="store_true", help=JSON_LINES_HELP.format(what="run"))
    show = actions.add_parser("show", help="one run: metadata, parameters, summary per level, errors")
    show.add_argument("id", type=int, help="the run's id, as `swaplab runs list` shows it")
    show.add_argument("--db", help=DB_HELP)
    show.add_argument("--json", action="store_true", help="print the run and all its requests as JSON")


def main(args: argparse.Namespace) -> int:
    """Run `swaplab activity` or `swaplab runs list|show`; returns the exit code."""
    if args.command == "activity":
        return _activity(args.db, model=args.model, limit=args.limit, as_json=args.json)
    if args.runs_command == "list":
        return _list_runs(args.db, model=args.model, kind=args.kind, limit=args.limit, as_json=args.json)
    return _show_run(args.db, args.id, as_json=args.json)


def _activity(db: str | None, *, model: str | None, limit: int, as_json: bool = False) -> int:
    """The latest requests, the oldest of them first."""
    from swaplab.results.activity import recent_activity
    from swaplab.results.present import activity_table

    return _latest(
        db, lambda connection: recent_activity(connection, model=model, limit=limit),
        absent="No activity recorded yet ({path} does not exist: `swaplab serve` creates it).",
        empty=f"No activity{f' for {model}' if model else ''} in {{path}}.",
        table=lambda rows, path: activity_table(rows, title=f"Last {len(rows)} requests in {path}"),
        as_json=as_json,
    )


def _list_runs(db: str | None, *, model: str | None, kind: str | None, limit: int, as_json: bool = False) -> int:
    """The latest runs, the most recent at the bottom."""
    from swaplab.results.present import runs_table
    from swaplab.results.runs import list_runs

    return _latest(
        db, lambda connection: list_runs(connection, model=model, kind=kind, limit=limit),
        absent="No runs recorded yet ({path} does not exist: `swaplab bench` and `swaplab grill` create it).",
        empty=f"No {kind + ' ' if kind else ''}runs{f' for {model}' if model else ''} in {{path}}.",
        table=lambda runs, path: runs_table(runs, title=f"Last {len(runs)} runs in {path}"),
        as_json=as_json,
    )


def _latest(db: str | None, query, *, absent: str, empty: str, table, as_json: bool = False) -> int:
    """Read the newest rows of the store with `query` and print them oldest first, or say why
    there are none (`absent`, `empty`: texts where `{path}` stands for the store's path; a
    replace, not `str.format`, since a model name may hold braces). `as_json`: one JSON
    object per row on stdout, and the store read (or why there are none) on stderr."""
    import json

    from swaplab.results.console import command_console
    from swaplab.results.store import default_path, existing_store, reading

    console = command_console(stderr=as_json)
    path = existing_store(db)
    if path is None:
        console.print(absent.replace("{path}", str(default_path())), highlight=False)
        return 0
    with reading(path) as connection:
        rows = query(connection)
    if not rows:
        console.print(empty.replace("{path}", str(path)), highlight=False)
        return 0
    rows.reverse()
    if as_json:
        console.print(f"{len(rows)} from {path}", highlight=False, soft_wrap=True)
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
        return 0
    console.print(table(rows, path))
    return 0


def _show_run(db: str | None, run_id: int, *, as_json: bool) -> int:
    """One run's metadata, parameters, summary per level and errors, or all of it as JSON."""
    import json

    from swaplab.errors import SwaplabError
    from swaplab.results.console import command_console
    from swaplab.results.present import run_details
    from swaplab.results.runs import get_run
    from swaplab.results.store import default_path, existing_store, reading

    path = existing_store(db)
    if path is None:
        raise SwaplabError(f"no run {run_id}: no runs recorded yet ({default_path()} does not exist)")
    with reading(path) as connection:
        run = get_run(connection, run_id)
    if run is None:
        raise SwaplabError(f"no run {run_id} in {path} (`swaplab runs list` shows the ids)")
    if as_json:
        print(json.dumps(run, indent=2, ensure_ascii=False))
        return 0
    console = command_console()
    for number, renderable in enumerate(run_details(run)):
        if number > 1:  # a blank line before each titled section
            console.print()
        console.print(renderable)
    return 0
