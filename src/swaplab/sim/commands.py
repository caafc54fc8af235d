"""`swaplab sim`: serve a scriptable OpenAI-compatible model with the timing and faults asked for."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab sim` and its arguments."""
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
        "--startup-log", metavar="FILE",
        help="print FILE's lines (an engine's startup output; '#' lines skipped) before listening, as the engine would",
    )
    sim.add_argument(
        "--startup-seconds", type=float, default=1.0, metavar="S",
        help="spread --startup-log's lines evenly over S seconds (default 1)",
    )
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
    # Checked by SimSettings against swaplab.sim.sleep's lists, which this module must not import
    # (it would load aiohttp for every `swaplab` command).
    sim.add_argument(
        "--engine", default="generic", metavar="ENGINE",
        help="which engine to be, as its release is (swaplab's engine contracts): generic (none), vllm, sglang, "
        "llamacpp or tabby: its model names, keys, routes and sleep API",
    )
    # The engines' own spellings of the flags that change their answers; each engine takes those it has.
    sim.add_argument("--served-model-name", nargs="+", default=(), metavar="NAME",
                     help="vLLM, SGLang: the names it answers to (default: --model)")
    sim.add_argument("--api-key", help="vLLM, SGLang, llama.cpp: the key clients must send")
    sim.add_argument("--admin-api-key", help="SGLang: the key its admin routes (release, resume) need")
    for switch, engines in (("--enable-sleep-mode", "vLLM: sleeps free memory"),
                            ("--enable-tokenizer-info-endpoint", "vLLM: serve /tokenizer_info"),
                            ("--enable-memory-saver", "SGLang: releases free memory"),
                            ("--enable-weights-cpu-backup", "SGLang: the weights come back on resume")):
        sim.add_argument(switch, action="store_true", help=engines)
    sim.add_argument("--sse-ping-interval", type=float, metavar="SECONDS",
                     help="llama.cpp: a ':' comment into a stream silent this long (its prefill); -1: none "
                          "(default: LLAMA_ARG_SSE_PING_INTERVAL, else 30; fractions allowed)")
    sim.add_argument("--disable-auth", choices=("true", "false"), default="false",
                     help="TabbyAPI: no keys (else from api_tokens.yml in the working folder, written when missing)")
    sim.add_argument("--memory-gib", type=float, default=1.0,
                     help="GPU memory the model holds: what a sleep reports it freed (default 1)")
    sim.add_argument("--sleep-seconds", type=float, default=0.0, help="time a sleep call takes to answer")
    sim.add_argument(
        "--wake-seconds", type=float, default=0.0,
        help="time a wake call takes (vLLM: one that restores weights; a kv_cache-only wake is instant)",
    )
    for operation in ("sleep", "wake"):
        sim.add_argument(
            f"--{operation}-fault", default="none", metavar="FAULT",
            help=f"what a {operation} call does instead: none, error (500), hang (never answers) or crash (exit 1)",
        )


    sim.add_argument("--parallel", type=int, default=1, help="llama.cpp's slots, each with its own prompt cache")
    sim.add_argument(
        "--prefill-tokens-per-second", type=float, default=0.0,
        help="pace of the prompt tokens a slot did not already hold, before the first token (0 = instant)",
    )
    sim.add_argument(
        "--timings", action="store_true",
        help="answer with llama.cpp's timings (prompt_n, cache_n, predicted_n); implied by the other slot flags",
    )
    sim.add_argument(
        "--slot-save-path", metavar="DIR", help="serve /slots/{id}?action=save|restore|erase, with files in DIR"
    )
    sim.add_argument(
        "--slot-fault", default="none", metavar="FAULT",
        help="what slot actions do instead: none, save-error, save-hang, restore-error, restore-corrupt,"
             " restore-hang or restore-crash (the sim exits)",
    )


def main(args: argparse.Namespace) -> int:
    """Serve until stopped; returns the exit code."""
    from swaplab.sim.script import load_script
    from swaplab.sim.serve import run
    from swaplab.sim.settings import SimSettings

    return run(
        SimSettings(
            host=args.host,
            port=args.port,
            model=args.model,
            ttft_ms=args.ttft_ms,
            tokens_per_second=args.tokens_per_second,
            load_seconds=args.load_seconds,
            startup_lines=_startup_lines(args.startup_log) if args.startup_log else (),
            startup_seconds=args.startup_seconds,
            health_before_ready=args.health_before_ready,
            crash_after_tokens=args.crash_after_tokens,
            default_max_tokens=args.default_max_tokens,
            script=load_script(args.script) if args.script else None,
            engine=args.engine,
            served_model_names=tuple(args.served_model_name),
            api_key=args.api_key,
            admin_api_key=args.admin_api_key,
            switches=frozenset(
                flag for flag, on in (
                    ("--enable-sleep-mode", args.enable_sleep_mode),
                    ("--enable-tokenizer-info-endpoint", args.enable_tokenizer_info_endpoint),
                    ("--enable-memory-saver", args.enable_memory_saver),
                    ("--enable-weights-cpu-backup", args.enable_weights_cpu_backup),
                    ("--disable-auth", args.disable_auth == "true"),
                ) if on
            ),
            memory_gib=args.memory_gib,
            sleep_seconds=args.sleep_seconds,
            wake_seconds=args.wake_seconds,
            sleep_fault=args.sleep_fault,
            wake_fault=args.wake_fault,
            parallel=args.parallel,
            prefill_tokens_per_second=args.prefill_tokens_per_second,
            slot_save_path=args.slot_save_path,
            slot_fault=args.slot_fault,
            timings=args.timings,
            sse_ping_interval=args.sse_ping_interval,
        )
    )


def _startup_lines(path: str) -> tuple[str, ...]:
    """The lines of an engine's startup output to replay, without the file's '#' comments."""
    from swaplab.errors import SwaplabError

    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError as error:
        raise SwaplabError(f"sim --startup-log {path}: {error.strerror or error}") from None
    return tuple(line for line in text.splitlines() if line.strip() and not line.startswith("#"))
