"""`swaplab launch ...` arguments; `swaplab.launch.commands.run(args)` carries them out."""

from __future__ import annotations

import argparse

DEFAULT_CLUSTERS = "~/.config/swaplab/clusters.toml"


def add_launch_parser(commands: argparse._SubParsersAction) -> None:
    launch = commands.add_parser("launch", help="bring up a recipe across a cluster's nodes as one gang")
    actions = launch.add_subparsers(dest="launch_command", required=True, metavar="ACTION")
    helps = {
        "plan": "print, per node, the exact commands `up` would run; changes nothing",
        "doctor": "preflight every node: ssh, docker, GPU runtime, image, model files, disk, memory, ports",
        "up": "preflight, distribute, start every rank, and wait until the gang serves",
        "down": "stop every rank of the recipe's gang on every node",
        "status": "the gang's ranks on every node, from their labels",
        "logs": "the gang's logs, merged across ranks, each line prefixed with its rank",
    }
    for name, summary in helps.items():
        action = actions.add_parser(name, help=summary, description=summary)
        action.add_argument("recipe", metavar="RECIPE", help="the recipe.toml (or its folder)")
        action.add_argument("--cluster", required=True, metavar="NAME", help="a cluster of the clusters file")
        action.add_argument(
            "--clusters", default=DEFAULT_CLUSTERS, metavar="FILE", help=f"the clusters file (default {DEFAULT_CLUSTERS})"
        )
        if name == "plan":
            action.add_argument("--json", action="store_true", help='print {"nodes": [{"host", "rank", "steps"}]} instead')
        if name == "up":
            action.add_argument(
                "--foreground", action="store_true",
                help="stay and supervise the gang; exit when it ends (what a router entry's cmd uses)",
            )
        if name == "logs":
            action.add_argument("--rank", type=int, help="only this rank")
            action.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
