"""`swaplab launch status`: the gang's ranks on every node, found by their labels, its
containers, the last run started here, and whether the head serves."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from swaplab.launch import remote, state
from swaplab.launch.cluster import Cluster
from swaplab.launch.members import docker_filter, find_gang
from swaplab.launch.plan import default_run_id, make_plan
from swaplab.launch.readiness import head_client, one_token
from swaplab.launch.remote import LabeledProcess
from swaplab.launch.spec import Recipe


@dataclass(frozen=True)
class RankProcess:
    """A running rank's wrapper on its node: its pid, its run, and the command it runs."""

    pid: int
    start_id: str
    command: str


@dataclass(frozen=True)
class RankStatus:
    """One rank of the recipe on its host; `processes` is empty when it does not run."""

    rank: int
    host: str
    processes: tuple[RankProcess, ...]


@dataclass(frozen=True)
class GangStatus:
    """What `status` found."""

    last_run: state.RunRecord | None
    """The recipe's last run on the cluster started from this machine."""
    ranks: tuple[RankStatus, ...]
    containers: tuple[tuple[str, str], ...]
    """(host, `NAME<TAB>STATUS` from docker ps) for the recipe's containers."""
    head_url: str
    answer: str | None
    """The head's one-token completion, None when it does not serve."""

    @property
    def serving(self) -> bool:
        """Every rank runs and the head answers."""
        return all(rank.processes for rank in self.ranks) and self.answer is not None


def status(recipe: Recipe, cluster: Cluster) -> GangStatus:
    """The gang's processes on every node and whether the head serves."""
    return asyncio.run(_status(recipe, cluster))


async def _status(recipe: Recipe, cluster: Cluster) -> GangStatus:
    hosts = cluster.hosts[: recipe.required_nodes]
    found = await find_gang(recipe, cluster, cluster.hosts)
    folder = state.latest_run(recipe.slug, cluster.name)
    last_run = folder.load() if folder else None
    ranks = []
    for rank, host in enumerate(hosts):
        # Hosts may share a machine (the loopback test cluster): each shows its own rank only.
        processes = [p for p in found[host] if p.labels.get("SWAPLAB_RANK") == str(rank)]
        ranks.append(RankStatus(rank=rank, host=host.name, processes=tuple(
            RankProcess(
                pid=root.pid, start_id=root.labels.get("SWAPLAB_START", "?"),
                command=next((p.command for p in processes if p.parent == root.pid), root.command),
            )
            for root in _rank_roots(processes)
        )))
    containers: list[tuple[str, str]] = []
    if recipe.engine != "process":
        for host in hosts:
            listed = await remote.run(
                remote.target_for(cluster, host),
                ["docker", "ps", "--filter", docker_filter(recipe), "--format", "{{.Names}}\t{{.Status}}"],
            )
            containers += [(host.name, line) for line in listed.stdout.splitlines()]
    head_url = make_plan(recipe, cluster, run_id=default_run_id(recipe, cluster)).head_url
    async with head_client(head_url) as client:
        answer = await one_token(client) if any(rank.processes for rank in ranks) else None
    return GangStatus(
        last_run=last_run, ranks=tuple(ranks), containers=tuple(containers),
        head_url=head_url, answer=answer,
    )


def _rank_roots(processes: list[LabeledProcess]) -> list[LabeledProcess]:
    """The processes whose parent is not itself part of the gang: each rank's wrapper."""
    pids = {process.pid for process in processes}
    return [process for process in processes if process.parent not in pids]
