"""`swaplab site build`: the catalogue written to a folder, and what was written."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab site build` and its arguments."""
    site = commands.add_parser("site", help="build the static catalogue: one page per model and per note")
    actions = site.add_subparsers(dest="site_command", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="write the catalogue's HTML to a folder")
    build.add_argument("--config", help="the llama-swap style config (default: the built-in default `swaplab serve` runs)")
    build.add_argument("--notes", metavar="DIR", help="the notes folder (default: the config's notes:)")
    build.add_argument("--db", help="the swaplab database (default: $SWAPLAB_DB or the user's data directory, if it exists)")
    build.add_argument("--out", required=True, metavar="DIR", help="folder to write the site to")


def main(args: argparse.Namespace) -> int:
    """Build the site, then say what was written; returns the exit code."""
    from swaplab.catalog.build import build_site

    written = build_site(args.config, args.out, notes=args.notes, db=args.db)
    models = sum(path.parent.name == "models" for path in written)
    notes_written = sum(path.parent.name == "notes" for path in written)
    index = Path(args.out) / "index.html"
    print(f"Wrote {len(written)} files to {args.out}: {_count(models, 'model page')}, "
          f"{_count(notes_written, 'note page')}. Open {index}")
    return 0


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
