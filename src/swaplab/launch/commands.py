"""`swaplab launch ...`: load the recipe and the cluster, then plan here or hand over to the gang.

`plan` lives here; `doctor`, `up`, `down`, `status` and `logs` are swaplab.launch.gang's and
swaplab.launch.doctor's, imported only when asked for.
"""

from __future__ import annotations

import argparse
import json

from swaplab.errors import ConfigError
from swaplab.launch.cluster import Cluster, get_cluster
from swaplab.launch.plan import default_run_id, make_plan, plan_json, plan_text
from swaplab.launch.recipe import Recipe, load_recipe


def run(args: argparse.Namespace) -> int:
    """Carry out one `swaplab launch ACTION`; returns the exit code."""
    recipe, cluster = load_both(args.recipe, args.clusters, args.cluster)
    action = args.launch_command
    if action == "plan":
        plan = make_plan(recipe, cluster, run_id=default_run_id(recipe, cluster))
        print(json.dumps(plan_json(plan), indent=2) if args.json else plan_text(plan), end="\n" if args.json else "")
        return 0
    if action == "doctor":
        from swaplab.launch.doctor import doctor

        return doctor(recipe, cluster)
    from swaplab.launch import gang

    if action == "up":
        return gang.up(recipe, cluster, foreground=args.foreground)
    if action == "down":
        return gang.down(recipe, cluster)
    if action == "status":
        return gang.status(recipe, cluster)
    if action == "logs":
        return gang.logs(recipe, cluster, rank=args.rank, follow=args.follow)
    raise ValueError(f"unknown launch action {action!r}")


def load_both(recipe_path: str, clusters_path: str, cluster_name: str) -> tuple[Recipe, Cluster]:
    """The recipe and the cluster; the faults of both files are reported together."""
    faults = []
    recipe = cluster = None
    try:
        recipe = load_recipe(recipe_path)
    except ConfigError as error:
        faults += error.faults
    try:
        cluster = get_cluster(clusters_path, cluster_name)
    except ConfigError as error:
        faults += error.faults
    if faults:
        raise ConfigError(faults)
    assert recipe is not None and cluster is not None
    return recipe, cluster
