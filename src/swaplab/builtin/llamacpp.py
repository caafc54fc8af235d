"""llama.cpp's own HTTP server (from the `xllamacpp` wheel) behind llama-server's common flags.

`python -m swaplab.builtin.llamacpp --model FILE.gguf --port 8081` behaves like
`llama-server -m FILE.gguf --port 8081`, so a config entry for it reads like one for a
real llama-server binary. It runs until SIGTERM or SIGINT. With `--fetch-demo NAME`
(the built-in default's entries) a demo model's file absent at `--model` is fetched
there first, so the router's health check covers a first start's download.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from pathlib import Path

from swaplab.builtin.index import index_url
from swaplab.builtin.models import DEMO_MODELS, fetch
from swaplab.builtin.progress import TransferDisplay
from swaplab.errors import SwaplabError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m swaplab.builtin.llamacpp",
        description="llama.cpp's server (xllamacpp) with llama-server's common flags.",
    )
    parser.add_argument("-m", "--model", required=True, help="path of a GGUF file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-c", "--ctx-size", type=int, default=4096, help="total context, split over slots")
    parser.add_argument("-np", "--parallel", type=int, default=1, help="slots (concurrent sequences)")
    parser.add_argument("-t", "--threads", type=int, default=-1, help="CPU threads for generation (-1 = auto)")
    parser.add_argument("--threads-http", type=int, default=-1, help="HTTP worker threads (-1 = auto)")
    parser.add_argument("-a", "--alias", action="append", default=[], help="model name(s) it answers to")
    parser.add_argument("-n", "--n-predict", type=int, default=-1, help="default output limit (-1 = none)")
    parser.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None)
    parser.add_argument("--embedding", "--embeddings", action="store_true", help="serve embeddings only")
    parser.add_argument("--pooling", choices=POOLING, default=None,
                        help="how token embeddings pool into one (default: the model's own, none for a chat model)")
    parser.add_argument("--api-key", action="append", default=[], help="require this key (repeatable)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up decode at load")
    parser.add_argument("--jinja", action="store_true", help="accepted for compatibility (always on)")
    parser.add_argument("--slot-save-path", metavar="DIR", help="where POST /slots/{id}?action=save writes")
    # What sizes the memory a load takes (swaplab fit reads the same flags off a cmd).
    parser.add_argument("-b", "--batch-size", type=int, default=None, help="logical batch (llama.cpp's default 2048)")
    parser.add_argument("-ub", "--ubatch-size", type=int, default=None, help="physical batch (llama.cpp's default 512)")
    parser.add_argument("-ctk", "--cache-type-k", choices=CACHE_TYPES, default=None, help="K cache type (default f16)")
    parser.add_argument("-ctv", "--cache-type-v", choices=CACHE_TYPES, default=None, help="V cache type (default f16)")
    parser.add_argument("-fa", "--flash-attn", choices=sorted(FLASH_ATTN), default=None,
                        help="flash attention (default auto)")
    parser.add_argument("--swa-full", action="store_true", help="a full-size cache for sliding-window layers")
    parser.add_argument("-kvu", "--kv-unified", action="store_true", help="one KV buffer shared by every slot")
    parser.add_argument("-fit", "--fit", choices=("on", "off"), default=None,
                        help="let llama.cpp shrink unset arguments to the devices' free memory (default on)")
    parser.add_argument("-lv", "--verbosity", "--log-verbosity", type=int, default=None, metavar="N",
                        help="log messages up to this level (4 shows the buffer sizes a load takes)")
    parser.add_argument("-v", "--verbose", "--log-verbose", action="store_true", help="log everything")
    parser.add_argument("--fetch-demo", choices=sorted(DEMO_MODELS), metavar="NAME",
                        help="--model is this built-in demo model's file: fetch it there first if it is absent")
    return parser


# llama-server's -ctk/-ctv values, each a ggml type name.
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN = {"on": "ENABLED", "off": "DISABLED", "auto": "AUTO"}
POOLING = ("none", "mean", "cls", "last", "rank")


def _exit_on_signal(signum: int, frame) -> None:
    # A stop during the fetch unwinds through its `finally`, which deletes the partial files.
    raise SystemExit(128 + signum)


def fetch_demo(name: str, target: str) -> None:
    """The demo model `name` at `target`, downloaded with a progress bar in this process's output."""
    if os.path.isfile(target):
        return
    print(f"llamacpp: {name}'s GGUF is not at {target}: fetching it from {index_url()} (once)", flush=True)
    stop_signals = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.signal(signum, _exit_on_signal) for signum in stop_signals}
    try:
        with TransferDisplay() as display:
            fetch(DEMO_MODELS[name], Path(target), progress=display.update)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"llamacpp: {name} fetched to {target}", flush=True)


def server_params(args: argparse.Namespace):
    """xllamacpp's parameters for llama-server's flags as `build_parser` parsed them."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_threads_http = args.threads_http
    params.n_predict = args.n_predict
    params.embedding = args.embedding
    if args.pooling is not None:
        params.pooling_type = getattr(xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{args.pooling.upper()}")
    params.warmup = not args.no_warmup
    params.endpoint_metrics = True
    if args.n_gpu_layers is not None:
        params.n_gpu_layers = args.n_gpu_layers
    if args.batch_size is not None:
        params.n_batch = args.batch_size
    if args.ubatch_size is not None:
        params.n_ubatch = args.ubatch_size
    for name, value in (("cache_type_k", args.cache_type_k), ("cache_type_v", args.cache_type_v)):
        if value is not None:
            setattr(params, name, getattr(xllamacpp.ggml_type, f"GGML_TYPE_{value.upper()}"))
    if args.flash_attn is not None:
        params.flash_attn_type = getattr(xllamacpp.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{FLASH_ATTN[args.flash_attn]}")
    params.swa_full = args.swa_full
    params.kv_unified = args.kv_unified
    if args.fit is not None:
        params.fit_params = args.fit == "on"
    if args.verbose:
        params.verbosity = 99
    elif args.verbosity is not None:
        params.verbosity = args.verbosity
    if args.alias:
        params.model_alias = set(args.alias)
    if args.api_key:
        params.api_keys = args.api_key
    if args.slot_save_path:
        # xllamacpp joins this and the file name without a separator; llama-server adds one.
        params.slot_save_path = args.slot_save_path.rstrip("/") + "/"
    return params


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Checked before a first start's download, which would be wasted without it.
    try:
        import xllamacpp
    except ImportError:
        python = shlex.quote(sys.executable)
        print(
            f"llamacpp: the xllamacpp wheel is not installed for {python}: run `{python} -m pip install xllamacpp`"
            " (pipx: `pipx inject swaplab xllamacpp`; uv: `uv tool install swaplab --with xllamacpp`)",
            file=sys.stderr,
        )
        return 2
    if args.fetch_demo:
        try:
            fetch_demo(args.fetch_demo, args.model)
        except SwaplabError as error:
            print(f"llamacpp: {error}", file=sys.stderr)
            return 2
    if not os.path.isfile(args.model):
        print(f"llamacpp: model file not found: {args.model}", file=sys.stderr)
        return 2

    params = server_params(args)

    # Block SIGTERM/SIGINT before the server's threads exist so that they inherit the
    # mask and only sigwait below receives them; then destroy the server in order.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = xllamacpp.Server(params)
    print(f"llamacpp: server is listening on {server.listening_address}", flush=True)
    received = signal.sigwait(stop_signals)
    print(f"llamacpp: {signal.Signals(received).name} received, shutting down", flush=True)
    del server
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
