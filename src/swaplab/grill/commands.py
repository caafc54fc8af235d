"""`swaplab grill run|selfcheck|compare`: typed settings from the arguments, the library call, what it printed."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from swaplab.argtypes import float_list, int_list

if TYPE_CHECKING:
    from swaplab.grill.runner import GrillSettings

SUITES = ("code", "agent", "needle", "humaneval", "lmeval")
DB_HELP = "the swaplab database runs are stored in (default: $SWAPLAB_DB or the user's data directory)"


def _suites(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in SUITES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"suites are {', '.join(SUITES)}; got {text!r}")
    return names


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab grill run|selfcheck|compare` and their arguments."""
    grill = commands.add_parser(
        "grill", help="grade a served model: code, agentic tool use, long-context recall, lm-eval tasks"
    )
    actions = grill.add_subparsers(dest="grill_command", required=True, metavar="ACTION")

    run = actions.add_parser("run", help="run suites against a model and store the scores")
    run.add_argument("--url", default="http://127.0.0.1:8080", help="a swaplab router or a backend (default: the local router)")
    run.add_argument("--model", help="model id or alias (default: the only model the server has)")
    run.add_argument("--suite", type=_suites, default=["code", "agent", "needle"], help="comma-separated (default code,agent,needle)")
    run.add_argument("--reps", type=int, default=3, help="repetitions; every score is over these (default 3)")
    run.add_argument("--temperature", type=float, help="sampling temperature (default: the model's metadata, else 0.2)")
    run.add_argument("--max-tokens", type=int, default=2048, help="answer budget per request (default 2048)")
    run.add_argument("--tasks", help="only these tasks, comma-separated names; with --suite lmeval, lm-eval task "
                     "names or task YAML files")
    run.add_argument("--limit", type=int, help="lmeval: the first N samples of each task (lm-eval's --limit; default all)")
    run.add_argument("--lmeval-api", choices=("chat", "completions"), default="chat",
                     help="lmeval: the endpoint lm-eval asks (default chat: the model's chat template applies)")
    run.add_argument("--lmeval-include", action="append", default=[], metavar="DIR",
                     help="lmeval: a folder of task YAML files the task names may come from (repeatable)")
    run.add_argument("--needle-lengths", type=int_list, default=[], help="haystack lengths in tokens (default: 1024 up to the context)")
    run.add_argument("--needle-depths", type=float_list, default=[0.1, 0.5, 0.9], help="fact depths (default 0.1,0.5,0.9)")
    run.add_argument("--transcripts", metavar="DIR", help="where transcripts go (default: next to the database)")
    run.add_argument("--api-key", help="bearer token for the server (default: $OPENAI_API_KEY)")
    run.add_argument("--db", help=DB_HELP)
    run.add_argument("--json", metavar="FILE", help="also write the run's summary and outcomes as JSON")

    selfcheck = actions.add_parser("selfcheck", help="prove the suite: references pass, known-wrong answers fail")
    selfcheck.add_argument("--suite", type=_suites, default=[s for s in SUITES if s != "lmeval"],
                           help="comma-separated (default: all but lmeval, whose tasks are lm-eval's own)")

    compare = actions.add_parser("compare", help="compare two stored grill runs: a difference with its interval, or indistinguishable")
    compare.add_argument("a", type=int, help="run id of A (the baseline)")
    compare.add_argument("b", type=int, help="run id of B")
    compare.add_argument("--db", help=DB_HELP)


def main(args: argparse.Namespace) -> int:
    """Run one `swaplab grill` command; returns the exit code."""
    if args.grill_command == "compare":
        return _compare(args.db, args.a, args.b)
    if args.grill_command == "selfcheck":
        if "lmeval" in args.suite:
            print("swaplab grill selfcheck: lmeval's tasks are lm-eval's own, proved by lm-eval; selfcheck the others")
            return 2
        return _selfcheck(args.suite)
    return _run(_grill_settings(args), json_path=args.json)


def _grill_settings(args: argparse.Namespace) -> GrillSettings:
    import os

    from swaplab.grill.runner import GrillSettings

    return GrillSettings(
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
        limit=args.limit,
        lmeval_api=args.lmeval_api,
        lmeval_include=args.lmeval_include,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        db=args.db,
    )


def _run(settings: GrillSettings, *, json_path: str | None) -> int:
    """Grade, store, print; 0, or 1 when every request failed."""
    from swaplab.grill.present import ProgressBar, report_document, show_outcome
    from swaplab.grill.runner import execute
    from swaplab.results.report import run_and_show

    return run_and_show(
        lambda progress: execute(settings, progress), ProgressBar, report_document, show_outcome,
        db=settings.db, json_path=json_path,
    )


def _selfcheck(suites: Sequence[str]) -> int:
    """Run the proofs, print a line per suite and every failure; 0 when all hold, else 1."""
    from swaplab.results.console import command_console

    from swaplab.grill.present import selfcheck_table
    from swaplab.grill.selfcheck import check_suite

    console = command_console()
    checks = []
    for suite in suites:
        with console.status(f"selfcheck: {suite}"):
            checks.append((suite, check_suite(suite)))
    console.print(selfcheck_table(checks))
    failures = [check for _, proofs in checks for check in proofs if not check.ok]
    for check in failures:
        console.print(f"[red]FAILED[/red] {check.suite} {check.name}: {check.detail}", highlight=False, soft_wrap=True)
    if failures:
        console.print(f"{len(failures)} task{'s' if len(failures) != 1 else ''} can't prove themselves: fix the suite before grading models.")
        return 1
    console.print("Every task proved itself.")
    return 0


def _compare(db: str | None, a: int, b: int) -> int:
    """One verdict per figure."""
    from swaplab.results.console import command_console

    from swaplab.grill.compare import compare_runs, sentences

    console = command_console()
    for line in sentences(*compare_runs(db, a, b)):
        console.print(line, highlight=False, soft_wrap=True)
    return 0
