"""`swaplab serve`: run the router on the address asked for."""

from __future__ import annotations

import argparse

from swaplab.argtypes import host_port
from swaplab.builtin.defaults import SERVE_LISTEN


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab serve` and its arguments."""
    serve = commands.add_parser("serve", help="run the router")
    serve.add_argument("--config", help="llama-swap style YAML config (default: the built-in demo models)")
    serve.add_argument(
        "--config-dir", metavar="DIR",
        help="also every *.yml/*.yaml directly in DIR, merged after --config in sorted order (llama-swap's -config-dir)",
    )
    serve.add_argument(
        "--listen", type=host_port, default=SERVE_LISTEN, metavar="HOST:PORT",
        help=f"address to listen on (default {SERVE_LISTEN[0]}:{SERVE_LISTEN[1]}); "
        "the built-in default's backends take the ports after it",
    )
    serve.add_argument("--state-dir", help="where pid files and logs live (default: the user's state directory)")
    serve.add_argument("--db", help="the results store the activity table goes to (default: $SWAPLAB_DB or the user's data directory)")
    serve.add_argument(
        "--watch-config", action="store_true",
        help="reload the config when one of its files changes (SIGHUP reloads it too)",
    )
    serve.add_argument("--notes", help="notes folder for the catalogue at /catalog/ (default: the config's notes:)")


def main(args: argparse.Namespace) -> int:
    """Serve until stopped; returns the exit code."""
    from swaplab.router.serve import serve

    host, port = args.listen
    return serve(
        config_path=args.config, config_dir=args.config_dir, host=host, port=port, state_dir=args.state_dir,
        watch_config=args.watch_config, db=args.db, notes=args.notes,
    )
