"""`swaplab launch down`: stop every process and container of a recipe's gangs on every node
of the cluster, record how their runs ended, and remove the files `[[pre_serve]]` staged there.

A foreground `up` that still supervises a run is told first (the run's folder notes the
request), so it reports a requested stop, not a failure, and records the end itself.
"""

from __future__ import annotations

import asyncio

from swaplab.launch import remote, state
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.hooks import unstaging_argv
from swaplab.launch.members import stop_gang
from swaplab.launch.spec import Recipe

STOPPED_BY_DOWN = "stopped by `swaplab launch down`"


def down(recipe: Recipe, cluster: Cluster) -> dict[Host, int]:
    """Stop the recipe's gangs on every host of the cluster; returns how many processes or
    containers each host had."""
    return asyncio.run(_down(recipe, cluster))


async def _down(recipe: Recipe, cluster: Cluster) -> dict[Host, int]:
    for folder in state.runs(recipe.slug, cluster.name):
        record = folder.load()
        if record is not None and not record.ended:
            folder.request_down()
    stopped = await stop_gang(recipe, cluster)
    for folder in state.runs(recipe.slug, cluster.name):
        record = folder.load()
        if record is not None and not record.ended and not state.supervisor_alive(record):
            record.outcome, record.cause = "stopped", STOPPED_BY_DOWN
            folder.save(record)
    # After the stop, not before: a rank still starting copies its staged files into place.
    await asyncio.gather(*(
        remote.check(remote.target_for(cluster, host), unstaging_argv(recipe), what="removing the staged pre_serve files")
        for host in cluster.hosts
    ))
    return stopped
