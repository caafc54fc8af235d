"""`swaplab launch logs`: the last run's output, merged across ranks, each line prefixed with
its rank; read from the nodes when they answer, else from this machine's mirror."""

from __future__ import annotations

import asyncio

from swaplab.errors import SwaplabError
from swaplab.launch import remote, state
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.members import follow_member_output, line_prefix, recipe_label
from swaplab.launch.output import LineSplitter, Observer
from swaplab.launch.remote import RemoteError, SshTarget
from swaplab.launch.settings import LogsSettings
from swaplab.launch.spec import Recipe


def logs(recipe: Recipe, cluster: Cluster, settings: LogsSettings, observer: Observer) -> None:
    """Hand the last run's output to `observer`, every line prefixed with its rank; with
    `settings.follow`, keep handing new lines over until the ranks end."""
    asyncio.run(_logs(recipe, cluster, settings, observer))


async def _logs(recipe: Recipe, cluster: Cluster, settings: LogsSettings, observer: Observer) -> None:
    folder = state.latest_run(recipe.slug, cluster.name)
    record = folder.load() if folder else None
    if folder is None or record is None:
        raise SwaplabError(
            f"no run of {recipe.slug} on cluster {cluster.name} was started from this machine "
            f"(looked in {state.recipe_folder(recipe.slug)}); start one with `swaplab launch up`"
        )
    ranks = [entry for entry in record.ranks if settings.rank is None or entry.rank == settings.rank]
    if not ranks:
        known = ", ".join(str(entry.rank) for entry in record.ranks) or "none started"
        raise SwaplabError(f"run {record.start_id} has no rank {settings.rank}; its ranks: {known}")
    targets = {entry.name: _target_by_name(cluster, entry.host) for entry in ranks}

    async def fetch(entry: state.RankRecord) -> None:
        try:
            data = await remote.read_output(targets[entry.name], entry.directory, folder.mirrored_bytes(entry.name))
        except RemoteError as error:
            observer.message(f"{entry.host} cannot be read ({error}); showing this machine's copy of rank {entry.rank}")
            return
        folder.append_output(entry.name, data)

    await asyncio.gather(*(fetch(entry) for entry in ranks))
    splitters = {}
    for entry in ranks:
        prefix = _prefix(entry)
        splitters[entry.name] = LineSplitter()
        lines = splitters[entry.name].feed(folder.read_output(entry.name))
        if not settings.follow:
            lines += splitters[entry.name].flush()
        for line in lines:
            observer.output(f"{prefix}{line}")
    if not settings.follow:
        return
    label = recipe_label(recipe)

    async def follow(entry: state.RankRecord) -> None:
        prefix = _prefix(entry)

        def on_line(line: str) -> None:
            observer.output(f"{prefix}{line}")

        splitter = splitters[entry.name]
        await follow_member_output(
            targets[entry.name], entry.directory, folder, entry.name, label=label, on_line=on_line, splitter=splitter
        )
        for line in splitter.flush():
            on_line(line)

    await asyncio.gather(*(follow(entry) for entry in ranks))


def _prefix(entry: state.RankRecord) -> str:
    return line_prefix(entry.rank, entry.name, entry.step)


def _target_by_name(cluster: Cluster, name: str) -> SshTarget:
    host = next((host for host in cluster.hosts if host.name == name), Host(name=name, fabric_ip="0.0.0.0"))
    return remote.target_for(cluster, host)
