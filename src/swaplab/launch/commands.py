"""`swaplab launch ...`: its arguments (`add_parser`) and carrying them out (`main`).

The only module of the launcher that sees argparse or prints: it turns the arguments into
typed settings, calls the library, and shows what comes back (launcher messages on stderr,
plans, findings, status and rank output on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_CLUSTERS = "~/.config/swaplab/clusters.toml"
ACTIONS = {
    "plan": "print, per node, the exact commands `up` would run; changes nothing",
    "doctor": "preflight every node: ssh, docker, GPU runtime, image, model files, disk, memory, ports",
    "up": "preflight, distribute, start every rank, and wait until the gang serves",
    "down": "stop every rank of the recipe's gang on every node",
    "status": "the gang's ranks on every node, from their labels",
    "logs": "the gang's logs, merged across ranks, each line prefixed with its rank",
}


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add `swaplab launch` and its actions to the top-level subcommands."""
    launch = commands.add_parser("launch", help="bring up a recipe across a cluster's nodes as one gang")
    actions = launch.add_subparsers(dest="launch_command", required=True, metavar="ACTION")
    for name, summary in ACTIONS.items():
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


def main(args: argparse.Namespace) -> int:
    """Carry out one `swaplab launch ACTION`; returns the exit code."""
    # Imported here, not at the top: add_parser runs for every swaplab command, and the
    # launcher's library (aiohttp through the client, psutil) takes a noticeable while to load.
    from swaplab.launch import present
    from swaplab.launch.doctor import doctor
    from swaplab.launch.down import down
    from swaplab.launch.logs import logs
    from swaplab.launch.plan import default_run_id, make_plan, plan_json, plan_text
    from swaplab.launch.settings import LogsSettings, Target, UpSettings, load_target
    from swaplab.launch.status import status
    from swaplab.launch.up import up

    recipe, cluster = load_target(Target(recipe=args.recipe, cluster=args.cluster, clusters=args.clusters))
    action = args.launch_command
    observer = present.ConsoleObserver()
    if action == "plan":
        plan = make_plan(recipe, cluster, run_id=default_run_id(recipe, cluster))
        print(json.dumps(plan_json(plan), indent=2) if args.json else plan_text(plan), end="\n" if args.json else "")
        return 0
    if action == "doctor":
        findings = doctor(recipe, cluster)
        _print_lines(present.doctor_lines(findings))
        print(present.doctor_summary(findings), file=sys.stderr)
        return 1 if any(not finding.ok for finding in findings) else 0
    if action == "up":
        record = up(recipe, cluster, UpSettings(foreground=args.foreground), observer)
        return 1 if record.outcome == "failed" else 0
    if action == "down":
        for line in present.down_lines(down(recipe, cluster)):
            observer.message(line)
        return 0
    if action == "status":
        found = status(recipe, cluster)
        _print_lines(present.status_lines(found))
        return 0 if found.serving else 1
    if action == "logs":
        try:
            logs(recipe, cluster, LogsSettings(rank=args.rank, follow=args.follow), observer)
        except KeyboardInterrupt:
            pass
        return 0
    raise ValueError(f"unknown launch action {action!r}")


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line)
