"""llama.cpp's own HTTP server (from the `xllamacpp` wheel) behind llama-server's common flags.

`python -m swaplab.builtin.llamacpp --model FILE.gguf --port 8081` behaves like
`llama-server -m FILE.gguf --port 8081`, so a config entry for it reads like one for a
real llama-server binary. It runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


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
    parser.add_argument("--api-key", action="append", default=[], help="require this key (repeatable)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up decode at load")
    parser.add_argument("--jinja", action="store_true", help="accepted for compatibility (always on)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not os.path.isfile(args.model):
        print(f"llamacpp: model file not found: {args.model}", file=sys.stderr)
        return 2
    try:
        import xllamacpp
    except ImportError:
        print("llamacpp: the xllamacpp wheel is not installed (pip install 'swaplab[llamacpp]')", file=sys.stderr)
        return 2

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
    params.warmup = not args.no_warmup
    params.endpoint_metrics = True
    if args.n_gpu_layers is not None:
        params.n_gpu_layers = args.n_gpu_layers
    if args.alias:
        params.model_alias = set(args.alias)
    if args.api_key:
        params.api_keys = args.api_key

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
