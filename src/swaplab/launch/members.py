"""The gang on its nodes: its members (each long-running rank process), the labels that mark
them, and following, finding and stopping them.

Every rank process carries the launcher's variables in its environment (for container
engines the docker client does, and the container carries labels): `SWAPLAB_RECIPE`,
`SWAPLAB_RUN`, `SWAPLAB_START`, `SWAPLAB_RANK`... `down` and `status` find the gang by
them on every node, with no state file needed, so orphans are found as well.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from swaplab.launch import remote, state
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.output import LineSplitter, read_lines
from swaplab.launch.plan import NodePlan, Plan
from swaplab.launch.remote import LabeledProcess, SshTarget
from swaplab.launch.spec import Recipe, Step

STOP_GRACE_SECONDS = 10


def recipe_label(recipe: Recipe) -> str:
    """NAME=VALUE in the environment of every process of the recipe's gangs."""
    return f"SWAPLAB_RECIPE={recipe.slug}"


def docker_filter(recipe: Recipe) -> str:
    """`docker ps --filter` value for the recipe's containers (the plan labels them)."""
    return f"label=swaplab.recipe={recipe.slug}"


def rank_env(plan: Plan, start_id: str, node: NodePlan) -> dict[str, str]:
    """The environment added to a rank process on its node.

    For engine "process" that is the plan's env (recipe, cluster NCCL table, launcher
    variables) less the secrets, which `up` sends apart; container engines have theirs in
    `docker run -e` already, so the docker client gets only the labels.
    """
    labels = {
        "SWAPLAB_RECIPE": plan.recipe.slug,
        "SWAPLAB_RECIPE_HASH": plan.recipe.digest(),
        "SWAPLAB_RUN": plan.run_id,
        "SWAPLAB_START": start_id,
        "SWAPLAB_RANK": str(node.rank),
    }
    if plan.recipe.engine == "process":
        # Secrets travel apart, never in an argv (Step.secrets): the plan holds only their references.
        env = {key: value for key, value in node.env.items() if key not in plan.recipe.secret_keys}
        return {**env, **labels}
    return labels


def line_prefix(rank: int, name: str, step: str) -> str:
    """What each output line of a rank process starts with: `[rank N] ` (`[rank N STEP] ` for a second one)."""
    extra = "" if name == f"rank-{rank}" else f" {step}"
    return f"[rank {rank}{extra}] "


@dataclass(frozen=True)
class Member:
    """One long-running process of the gang: a rank step on its node."""

    node: NodePlan
    step: Step
    name: str  # rank-N, or rank-N-STEP for a second long-running step on the same rank
    directory: str
    target: SshTarget

    @property
    def rank(self) -> int:
        return self.node.rank

    @property
    def title(self) -> str:
        extra = "" if self.name == f"rank-{self.rank}" else f" ({self.step.name})"
        return f"rank {self.rank}{extra} on {self.node.host.name}"

    @property
    def prefix(self) -> str:
        return line_prefix(self.rank, self.name, self.step.name)


def members_of(plan: Plan, start_id: str) -> list[Member]:
    """The gang's long-running processes in the engine's start order."""
    members = []
    seen: set[int] = set()
    for node, step in plan.rank_steps():
        name = f"rank-{node.rank}"
        if node.rank in seen:
            name += "-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", step.name)
        seen.add(node.rank)
        members.append(Member(
            node=node, step=step, name=name, directory=state.node_directory(plan.recipe.slug, start_id, name),
            target=remote.target_for(plan.cluster, node.host),
        ))
    return members


async def follow_member_output(
    target: SshTarget, directory: str, folder: state.RunFolder, name: str, *,
    label: str, on_line: Callable[[str], None], splitter: LineSplitter,
) -> None:
    """Stream member `name`'s output from where this machine's mirror ends, until the stream
    ends: each chunk extends the mirror, each complete line goes to `on_line`.

    A partial last line stays in `splitter` (the stream may have broken mid-line).
    """
    process = await remote.follow_output(target, directory, folder.mirrored_bytes(name), label=label)
    assert process.stdout is not None
    async with remote.owned(process):
        await read_lines(
            process.stdout, on_line, splitter=splitter, on_bytes=lambda chunk: folder.append_output(name, chunk)
        )


async def find_gang(recipe: Recipe, cluster: Cluster, hosts: Sequence[Host]) -> dict[Host, list[LabeledProcess]]:
    """The processes of the recipe's gangs on each of `hosts`, found by their label."""
    found = await asyncio.gather(
        *(remote.find_labeled(remote.target_for(cluster, host), recipe_label(recipe)) for host in hosts)
    )
    return dict(zip(hosts, found, strict=True))


async def stop_gang(recipe: Recipe, cluster: Cluster) -> dict[Host, int]:
    """SIGTERM, then SIGKILL after the grace, every labelled process (and container) of the
    recipe on every host of the cluster; returns how many each host had."""
    async def stop_on(host: Host) -> int:
        target = remote.target_for(cluster, host)
        count = 0
        if recipe.engine != "process":
            count += await _stop_containers(target, recipe)
        count += len(await remote.stop_labeled(target, recipe_label(recipe), grace_seconds=STOP_GRACE_SECONDS))
        return count

    counts = await asyncio.gather(*(stop_on(host) for host in cluster.hosts))
    return dict(zip(cluster.hosts, counts, strict=True))


async def _stop_containers(target: SshTarget, recipe: Recipe) -> int:
    listed = await remote.run(target, ["docker", "ps", "--all", "--quiet", "--filter", docker_filter(recipe)])
    containers = listed.stdout.split() if listed.ok else []
    if containers:
        await remote.run(target, ["docker", "stop", "--time", str(STOP_GRACE_SECONDS), *containers])
        await remote.run(target, ["docker", "rm", "--force", *containers])
    return len(containers)
