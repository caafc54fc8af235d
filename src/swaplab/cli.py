"""Command line: the top-level parser, composed from each package's command glue, and dispatch to it.

Every package's glue is `<package>/commands.py`, exposing `add_parser(commands)` (adds its
subcommands, with all their arguments, to the top-level subparsers) and `main(args)` (turns
the arguments into typed settings, calls the library, prints, returns the exit code).

Building the parser imports every commands module, for `swaplab --help` as for
`swaplab sim`, so importing one must be cheap. The rule: a commands module imports its
library lazily, inside `main` (aiohttp, jinja2, the grill, the store are loaded only by
the command that uses them), and a package's `__init__` re-exports nothing heavy
(router, sim, catalog, notes and results re-export nothing). What the parser still
pays for is `swaplab.config`'s `__init__`, which loads the YAML loader.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

from swaplab import __version__
from swaplab.bench import commands as bench
from swaplab.catalog import commands as catalog
from swaplab.config import commands as config
from swaplab.errors import ConfigError, SwaplabError
from swaplab.grill import commands as grill
from swaplab.launch import commands as launch
from swaplab.notes import commands as notes
from swaplab.results import commands as results
from swaplab.router import commands as router
from swaplab.sim import commands as sim

# In the order `swaplab --help` lists their commands.
PACKAGES: tuple[ModuleType, ...] = (router, config, notes, catalog, sim, results, bench, grill, launch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swaplab", description="Start, swap and stop local inference servers behind one endpoint.")
    parser.add_argument("--version", action="version", version=f"swaplab {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for package in PACKAGES:
        before = set(commands.choices)
        package.add_parser(commands)
        for name in commands.choices.keys() - before:
            commands.choices[name].set_defaults(package_main=package.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.package_main(args)
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
    except BrokenPipeError:
        # The reader went away (`swaplab config show ... | head`): not an error of ours. Point
        # stdout at nothing so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
