"""Command line: parses arguments and calls into the library. Nothing else lives here."""

from __future__ import annotations

import argparse
import sys

from swaplab import __version__
from swaplab.argtypes import float_list, int_list
from swaplab.errors import ConfigError, SwaplabError


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swaplab", description="Start, swap and stop local inference servers behind one endpoint.")
    parser.add_argument("--version", action="version", version=f"swaplab {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the router")
    serve.add_argument("--config", help="llama-swap style YAML config (default: the built-in demo models)")
    serve.add_argument(
        "--listen", type=_host_port, default=("127.0.0.1", 8080), metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:8080)",
    )
    serve.add_argument("--state-dir", help="where pid files and logs live (default: the user's state directory)")
    serve.add_argument("--db", help="the results store the activity table goes to (default: $SWAPLAB_DB or the user's data directory)")
    serve.add_argument(
        "--watch-config", action="store_true",
        help="reload the config when its file changes (SIGHUP reloads it too)",
    )
    serve.add_argument("--notes", help="notes folder for the catalogue at /catalog/ (default: the config's notes:)")

    config = commands.add_parser("config", help="check or show a config file")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_commands.add_parser("check", help="validate a config; one FILE:LINE: line per fault")
    check.add_argument("file")
    show = config_commands.add_parser("show", help="print the resolved config as JSON")
    show.add_argument("file")
    show.add_argument("--model", help="only this model (id or alias), with cmd as the final argv")

    notes = commands.add_parser("notes", help="check a notes folder's wikilinks or show a model's notes")
    notes_commands = notes.add_subparsers(dest="notes_command", required=True, metavar="ACTION")
    notes_check = notes_commands.add_parser("check", help="list broken [[wikilinks]] as FILE:LINE; exit 1 if any")
    notes_check.add_argument("folder", metavar="DIR")
    notes_check.add_argument("--config", help="a config whose model ids and aliases are valid link targets too")
    notes_show = notes_commands.add_parser("show", help="print the notes that belong to a model")
    notes_show.add_argument("model", metavar="MODEL", help="model id or alias")
    notes_show.add_argument("--notes", required=True, metavar="DIR", help="the notes folder")
    notes_show.add_argument("--config", help="the config, so the model's aliases match too")

    site = commands.add_parser("site", help="build the static catalogue: one page per model and per note")
    site_commands = site.add_subparsers(dest="site_command", required=True, metavar="ACTION")
    site_build = site_commands.add_parser("build", help="write the catalogue's HTML to a folder")
    site_build.add_argument("--config", required=True, help="the llama-swap style config")
    site_build.add_argument("--notes", metavar="DIR", help="the notes folder (default: the config's notes:)")
    site_build.add_argument("--db", help="the swaplab database (default: $SWAPLAB_DB or the user's data directory, if it exists)")
    site_build.add_argument("--out", required=True, metavar="DIR", help="folder to write the site to")

    sim = commands.add_parser("sim", help="a scriptable OpenAI-compatible server for tests and benchmarks")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, required=True)
    sim.add_argument("--model", required=True, help="model name it reports")
    sim.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    sim.add_argument(
        "--tokens-per-second", type=float, default=0.0, help="pace of each stream (0 = as fast as possible)"
    )
    sim.add_argument("--load-seconds", type=float, default=0.0, help="time before it can serve")
    sim.add_argument(
        "--health-before-ready", action="store_true",
        help="/health answers 200 during the load while generation fails with 503 (like SGLang)",
    )
    sim.add_argument(
        "--crash-after-tokens", type=int, default=0,
        help="exit abruptly after emitting this many tokens in total (0 = never)",
    )
    sim.add_argument("--default-max-tokens", type=int, default=16, help="output length when a request sets none")
    sim.add_argument("--script", metavar="FILE", help="scripted chat answers (YAML or JSON; see docs/sim.md)")

    activity = commands.add_parser("activity", help="print the requests the router proxied most recently")
    activity.add_argument("--model", help="only this model (id or the name the client sent)")
    activity.add_argument("--limit", type=int, default=20, help="how many requests (default 20)")
    activity.add_argument("--db", help="the swaplab database (default: $SWAPLAB_DB or the user's data directory)")

    runs = commands.add_parser("runs", help="list or show recorded bench and grill runs")
    runs_commands = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    runs_list = runs_commands.add_parser("list", help="the latest runs, the most recent at the bottom")
    runs_list.add_argument("--model", help="only runs of this model (recorded under it as id or alias)")
    runs_list.add_argument("--kind", help="only runs of this kind (throughput, prefill, prefix-cache, grill, ...)")
    runs_list.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    runs_list.add_argument("--db", help="the swaplab database (default: $SWAPLAB_DB or the user's data directory)")
    runs_show = runs_commands.add_parser("show", help="one run: metadata, parameters, summary per level, errors")
    runs_show.add_argument("id", type=int, help="the run's id, as `swaplab runs list` shows it")
    runs_show.add_argument("--db", help="the swaplab database (default: $SWAPLAB_DB or the user's data directory)")
    runs_show.add_argument("--json", action="store_true", help="print the run and all its requests as JSON")

    bench = commands.add_parser("bench", help="measure a served model: throughput, prefill, prefix cache")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="WORKLOAD")
    bench_db_help = "the swaplab database runs are stored in (default: $SWAPLAB_DB or the user's data directory)"
    workloads = {
        "throughput": "output tok/s, TTFT, TPOT, ITL and latency over a concurrency sweep (or Poisson rates)",
        "prefill": "TTFT and prefill tok/s at growing prompt lengths, one request at a time",
        "prefix-cache": "TTFT with a shared prefix cached against the same length uncached",
    }
    for name, summary in workloads.items():
        workload = bench_commands.add_parser(name, help=summary, description=summary)
        workload.add_argument("--url", default="http://127.0.0.1:8080", help="a swaplab router or a backend (default: the local router)")
        workload.add_argument("--model", help="model id or alias (default: the only model the server has)")
        workload.add_argument("--endpoint", choices=("chat", "completions"), default="chat", help="API to send prompts to (default chat)")
        workload.add_argument("--output-tokens", type=int, help="forced answer length (default 256 for throughput, 16 otherwise)")
        workload.add_argument("--requests", type=int, help="requests per level and rep (default: 4 per concurrency slot; 2 for prefill; 4 for prefix-cache)")
        workload.add_argument("--reps", type=int, default=3, help="measured repetitions (default 3)")
        workload.add_argument("--warmup", type=int, default=1, help="warm-up runs done first and discarded (default 1)")
        workload.add_argument("--db", help=bench_db_help)
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
    compare = bench_commands.add_parser("compare", help="compare two stored runs: a ratio with its interval, or indistinguishable")
    compare.add_argument("a", type=int, help="run id of A (the baseline)")
    compare.add_argument("b", type=int, help="run id of B")
    compare.add_argument("--db", help=bench_db_help)
    compare.add_argument(
        "--min-effect", type=float, default=0.01,
        help="a B/A this close to 1 is never called a difference, however significant (default 0.01)",
    )
    selftest = bench_commands.add_parser("selftest", help="measure what the client itself adds, against a sim it starts")
    selftest.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    selftest.add_argument("--ttft-ms", type=float, default=50.0, help="the sim's TTFT (default 50)")
    selftest.add_argument("--tokens-per-second", type=float, default=50.0, help="the sim's rate per stream (default 50)")
    selftest.add_argument("--output-tokens", type=int, default=64, help="tokens per stream (default 64)")
    selftest.add_argument("--rounds", type=int, default=5, help="pairs of rounds, one per reader (default 5)")
    selftest.add_argument(
        "--spread-ms", type=float, default=20.0,
        help="stream starts spread over this long, as in a steady closed loop (default 20; 0 = all at once)",
    )
    selftest.add_argument("--db", help=bench_db_help)
    selftest.add_argument("--json", metavar="FILE", help="also write the figures as JSON")

    from swaplab.grill.arguments import add_grill_parser
    from swaplab.launch.arguments import add_launch_parser

    add_grill_parser(commands)
    add_launch_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as error:
        # The same FILE:LINE: lines as `swaplab config check`, nothing around them.
        for fault in error.faults:
            print(fault, file=sys.stderr)
        return error.exit_code
    except SwaplabError as error:
        print(f"swaplab: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "serve":
        from swaplab.router.serve import serve

        host, port = args.listen
        return serve(
            config_path=args.config, host=host, port=port, state_dir=args.state_dir,
            watch_config=args.watch_config, db=args.db, notes=args.notes,
        )
    if args.command == "config":
        from swaplab.config import commands

        if args.config_command == "check":
            return commands.check(args.file)
        return commands.show(args.file, model=args.model)
    if args.command == "notes":
        from swaplab.notes import commands as notes_commands

        if args.notes_command == "check":
            return notes_commands.check(args.folder, config_path=args.config)
        return notes_commands.show(args.model, args.notes, config_path=args.config)
    if args.command == "site":
        from swaplab.catalog.build import build_command

        return build_command(args.config, args.out, notes=args.notes, db=args.db)
    if args.command == "sim":
        from swaplab.sim.script import load_script
        from swaplab.sim.server import SimSettings, run

        return run(
            SimSettings(
                host=args.host,
                port=args.port,
                model=args.model,
                ttft_ms=args.ttft_ms,
                tokens_per_second=args.tokens_per_second,
                load_seconds=args.load_seconds,
                health_before_ready=args.health_before_ready,
                crash_after_tokens=args.crash_after_tokens,
                default_max_tokens=args.default_max_tokens,
                script=load_script(args.script) if args.script else None,
            )
        )
    if args.command == "activity":
        from swaplab.results.activity import show_activity

        return show_activity(args.db, model=args.model, limit=args.limit)
    if args.command == "runs":
        from swaplab.results import present

        if args.runs_command == "list":
            return present.list_command(args.db, model=args.model, kind=args.kind, limit=args.limit)
        return present.show_command(args.db, args.id, as_json=args.json)
    if args.command == "bench":
        return _bench(args)
    if args.command == "grill":
        from swaplab.grill import commands as grill_commands

        return grill_commands.run(args)
    if args.command == "launch":
        from swaplab.launch import commands as launch_commands

        return launch_commands.run(args)
    raise AssertionError(f"unhandled command {args.command}")


def _bench(args: argparse.Namespace) -> int:
    from swaplab.bench import commands

    if args.bench_command == "compare":
        return commands.compare_command(args.db, args.a, args.b, min_effect=args.min_effect)
    if args.bench_command == "selftest":
        from swaplab.bench.selftest import SelftestSettings

        settings = SelftestSettings(
            streams=args.streams, ttft_ms=args.ttft_ms, tokens_per_second=args.tokens_per_second,
            output_tokens=args.output_tokens, rounds=args.rounds, spread_ms=args.spread_ms,
        )
        return commands.selftest_command(args.db, settings, json_path=args.json)
    import os

    from swaplab.bench.run import BenchSettings

    settings = BenchSettings(
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
    return commands.run_command(settings, json_path=args.json)
