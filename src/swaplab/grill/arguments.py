"""`swaplab grill ...` arguments; `swaplab.grill.commands.run(args)` carries them out."""

from __future__ import annotations

import argparse

from swaplab.argtypes import float_list, int_list

SUITES = ("code", "agent", "needle", "humaneval")
DB_HELP = "the swaplab database runs are stored in (default: $SWAPLAB_DB or the user's data directory)"


def _suites(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in SUITES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"suites are {', '.join(SUITES)}; got {text!r}")
    return names


def add_grill_parser(commands: argparse._SubParsersAction) -> None:
    grill = commands.add_parser("grill", help="grade a served model: code, agentic tool use, long-context recall")
    actions = grill.add_subparsers(dest="grill_command", required=True, metavar="ACTION")

    run = actions.add_parser("run", help="run suites against a model and store the scores")
    run.add_argument("--url", default="http://127.0.0.1:8080", help="a swaplab router or a backend (default: the local router)")
    run.add_argument("--model", help="model id or alias (default: the only model the server has)")
    run.add_argument("--suite", type=_suites, default=["code", "agent", "needle"], help="comma-separated (default code,agent,needle)")
    run.add_argument("--reps", type=int, default=3, help="repetitions; every score is over these (default 3)")
    run.add_argument("--temperature", type=float, help="sampling temperature (default: the model's metadata, else 0.2)")
    run.add_argument("--max-tokens", type=int, default=2048, help="answer budget per request (default 2048)")
    run.add_argument("--tasks", help="only these tasks, comma-separated names")
    run.add_argument("--needle-lengths", type=int_list, default=[], help="haystack lengths in tokens (default: 1024 up to the context)")
    run.add_argument("--needle-depths", type=float_list, default=[0.1, 0.5, 0.9], help="fact depths (default 0.1,0.5,0.9)")
    run.add_argument("--transcripts", metavar="DIR", help="where transcripts go (default: next to the database)")
    run.add_argument("--api-key", help="bearer token for the server (default: $OPENAI_API_KEY)")
    run.add_argument("--db", help=DB_HELP)
    run.add_argument("--json", metavar="FILE", help="also write the run's summary and outcomes as JSON")

    selfcheck = actions.add_parser("selfcheck", help="prove the suite: references pass, known-wrong answers fail")
    selfcheck.add_argument("--suite", type=_suites, default=list(SUITES), help="comma-separated (default: all)")

    compare = actions.add_parser("compare", help="compare two stored grill runs: a difference with its interval, or indistinguishable")
    compare.add_argument("a", type=int, help="run id of A (the baseline)")
    compare.add_argument("b", type=int, help="run id of B")
    compare.add_argument("--db", help=DB_HELP)
