"""The files `[[pre_serve]]` copies are staged on each node by `up` and removed by `down`.

Over real SSH to the two loopback nodes of tests/sshd.py (which share this user's home, so
one staged file stands for both), with `swaplab sim` as the ranks.
"""

from __future__ import annotations

from pathlib import Path

import sshd as loopback
from sshd import CLUSTER, node_state, sim_args

from swaplab.launch.hooks import staged_path
from swaplab.launch.plan import default_run_id
from swaplab.launch.settings import Target, load_target

sshd = loopback.sshd
gang = loopback.gang


def staged_file(gang) -> Path:
    """Where `up` stages the recipe's first copy on the nodes, as the launcher names it."""
    recipe, cluster = load_target(Target(recipe=str(gang.recipe_path), cluster=CLUSTER, clusters=str(gang.clusters)))
    return Path.home() / staged_path(recipe, default_run_id(recipe, cluster), 0).removeprefix("~/")


def test_down_removes_the_files_up_staged_on_the_nodes(gang, tmp_path):
    path = gang.recipe(sim_args(), ready=["listening on"])
    (path.parent / "mod.txt").write_text("the mod's content\n")
    with path.open("a") as recipe:
        recipe.write(f'\n[[pre_serve]]\ncopy = [{{ from = "mod.txt", to = "{tmp_path}/copied-{{rank}}.txt" }}]\n')
    up = gang.launch("up")
    assert up.returncode == 0, up.stderr
    staged = staged_file(gang)
    assert staged.read_text() == "the mod's content\n"
    assert (tmp_path / "copied-1.txt").read_text() == "the mod's content\n"

    down = gang.launch("down")
    assert down.returncode == 0, down.stderr
    assert not staged.exists()
    assert not (node_state(gang.slug) / "pre-serve").exists()
    assert (tmp_path / "copied-1.txt").exists(), "what the ranks copied into place is theirs, not the staging's"

    again = gang.launch("down")
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("nothing of the gang was running") == 2, again.stderr
