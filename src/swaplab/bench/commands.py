"""`swaplab bench throughput|prefill|prefix-cache|compare|selftest`: typed settings from the
arguments, the library call, what it printed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from swaplab.argtypes import float_list, int_list

if TYPE_CHECKING:
    from swaplab.bench.run import BenchSettings
    from swaplab.bench.selftest import SelftestSettings

DB_HELP = "the swaplab database runs are stored in (default: $SWAPLAB_DB or the user's data directory)"
WORKLOADS = {
    "throughput": "output tok/s, TTFT, TPOT, ITL and latency over a concurrency sweep (or Poisson rates)",
    "prefill": "TTFT and prefill tok/s at growing prompt lengths, one request at a time",
    "prefix-cache": "TTFT with a shared prefix cached against the same length uncached",
}


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab bench WORKLOAD`, `bench compare` and `bench selftest`, with their arguments."""
    bench = commands.add_parser("bench", help="measure a served model: throughput, prefill, prefix cache")
    actions = bench.add_subparsers(dest="bench_command", required=True, metavar="WORKLOAD")
    for name, summary in WORKLOADS.items():
        workload = actions.add_parser(name, help=summary, description=summary)
        workload.add_argument("--url", default="http://127.0.0.1:8080", help="a swaplab router or a backend (default: the local router)")
        workload.add_argument("--model", help="model id or alias (default: the only model the server has)")
        workload.add_argument("--endpoint", choices=("chat", "completions"), default="chat", help="API to send prompts to (default chat)")
        workload.add_argument("--output-tokens", type=int, help="forced answer length (default 256 for throughput, 16 otherwise)")
        workload.add_argument("--requests", type=int, help="requests per level and rep (default: 4 per concurrency slot; 2 for prefill; 4 for prefix-cache)")
        workload.add_argument("--reps", type=int, default=3, help="measured repetitions (default 3)")
        workload.add_argument("--warmup", type=int, default=1, help="warm-up runs done first and discarded (default 1)")
        workload.add_argument("--db", help=DB_HELP)
        workload.add_argument("--json", metavar="FILE", help="also write a self-contained JSON report")
        workload.add_argument("--api-key", help="bearer token for the server (default: $OPENAI_API_KEY)")
        workload.add_argument("--selftest", action="store_true", help="measure the client's overhead afresh before the run")
        if name == "throughput":
            workload.add_argument("--input-tokens", type=int_list, default=[1024], help="prompt length (default 1024)")
            workload.add_argument("--concurrency", type=int_list, default=[], help="levels, comma-separated (default 1,2,4,8)")
            workload.add_argument("--rate", type=float_list, default=[], help="Poisson arrivals per second instead, comma-separated levels")
            workload.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals (default 0)")
        elif name == "prefill":
            workload.add_argument("--input-tokens", type=int_list, default=[], help="prompt lengths (default 1024,8192,32768, capped at the context)")
        else:
            workload.add_argument("--prefix-tokens", type=int, help="shared prefix length (default 4096, capped at the context)")
            workload.add_argument("--suffix-tokens", type=int, default=64, help="fresh suffix after it (default 64)")
    compare = actions.add_parser("compare", help="compare two stored runs: a ratio with its interval, or indistinguishable")
    compare.add_argument("a", type=int, help="run id of A (the baseline)")
    compare.add_argument("b", type=int, help="run id of B")
    compare.add_argument("--db", help=DB_HELP)
    compare.add_argument(
        "--min-effect", type=float, default=0.01,
        help="a B/A this close to 1 is never called a difference, however significant (default 0.01)",
    )
    selftest = actions.add_parser("selftest", help="measure what the client itself adds, against a sim it starts")
    selftest.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    selftest.add_argument("--ttft-ms", type=float, default=50.0, help="the sim's TTFT (default 50)")
    selftest.add_argument("--tokens-per-second", type=float, default=50.0, help="the sim's rate per stream (default 50)")
    selftest.add_argument("--output-tokens", type=int, default=64, help="tokens per stream (default 64)")
    selftest.add_argument("--rounds", type=int, default=5, help="pairs of rounds, one per reader (default 5)")
    selftest.add_argument(
        "--spread-ms", type=float, default=20.0,
        help="stream starts spread over this long, as in a steady closed loop (default 20; 0 = all at once)",
    )
    selftest.add_argument("--db", help=DB_HELP)
    selftest.add_argument("--json", metavar="FILE", help="also write the figures as JSON")


def main(args: argparse.Namespace) -> int:
    """Run one `swaplab bench` command; returns the exit code."""
    if args.bench_command == "compare":
        return _compare(args.db, args.a, args.b, min_effect=args.min_effect)
    if args.bench_command == "selftest":
        from swaplab.bench.selftest import SelftestSettings

        settings = SelftestSettings(
            streams=args.streams, ttft_ms=args.ttft_ms, tokens_per_second=args.tokens_per_second,
            output_tokens=args.output_tokens, rounds=args.rounds, spread_ms=args.spread_ms,
        )
        return _selftest(args.db, settings, json_path=args.json)
    return _run(_bench_settings(args), json_path=args.json)


def _bench_settings(args: argparse.Namespace) -> BenchSettings:
    import os

    from swaplab.bench.run import BenchSettings

    return BenchSettings(
        kind=args.bench_command,
        url=args.url,
        model=args.model,
        endpoint=args.endpoint,
        reps=args.reps,
        warmup=args.warmup,
        seed=getattr(args, "seed", 0),
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        input_tokens=getattr(args, "input_tokens", []),
        output_tokens=args.output_tokens,
        concurrency=getattr(args, "concurrency", []),
        rates=getattr(args, "rate", []),
        requests=args.requests,
        prefix_tokens=getattr(args, "prefix_tokens", None),
        suffix_tokens=getattr(args, "suffix_tokens", 64),
        db=args.db,
        fresh_selftest=args.selftest,
    )


def _run(settings: BenchSettings, *, json_path: str | None) -> int:
    """Run, store, print; 0, or 1 when every request failed."""
    from swaplab.bench.present import ProgressBar, report_document, show_outcome
    from swaplab.bench.run import execute
    from swaplab.results.report import run_and_show

    return run_and_show(
        lambda progress: execute(settings, progress), ProgressBar, report_document, show_outcome,
        db=settings.db, json_path=json_path,
    )


def _compare(db: str | None, a: int, b: int, *, min_effect: float) -> int:
    """One verdict per level, then the overall one."""
    from swaplab.results.console import command_console

    from swaplab.bench.compare import compare_runs, sentences

    console = command_console()
    for line in sentences(compare_runs(db, a, b, min_effect=min_effect)):
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def _selftest(db: str | None, settings: SelftestSettings, *, json_path: str | None) -> int:
    """Measure the client against a sim, store it, print the comparison."""
    import asyncio
    from dataclasses import asdict

    from swaplab.results.console import command_console

    from swaplab.bench.overhead import save_selftest, timed_measure
    from swaplab.bench.present import selftest_table
    from swaplab.results.report import check_report_path, write_report
    from swaplab.results.store import default_path

    console = command_console()
    check_report_path(json_path)
    with console.status(f"selftest: {settings.streams} streams from a sim, {settings.rounds} pairs of rounds"):
        report, started_at, ended_at = asyncio.run(timed_measure(settings))
    run_id = save_selftest(db, report, started_at=started_at, ended_at=ended_at)
    summary = report.summary()
    if json_path:
        write_report(json_path, {"run_id": run_id, "settings": asdict(settings), **summary})
    console.print(selftest_table(report, summary))
    console.print(
        f"The client adds {summary['client_overhead_ms']:.2f} ms to TTFT p50 over the raw reader "
        f"(median over {settings.rounds} back-to-back pairs of rounds) and keeps {summary['client_stream_rate_ratio']:.1%} of the sim's per-stream token rate. "
        f"Stored as run {run_id} in {db or default_path()}; bench reports on this host quote it as client_overhead_ms.",
        highlight=False,
    )
    return 0 if summary["failed"] == 0 else 1
