"""What each `swaplab launch` action is told, as typed settings, and loading the recipe and
cluster a `Target` names (the faults of both files reported together)."""

from __future__ import annotations

from dataclasses import dataclass

from swaplab.errors import ConfigError
from swaplab.launch.cluster import Cluster, get_cluster
from swaplab.launch.recipe import load_recipe
from swaplab.launch.spec import Recipe


@dataclass(frozen=True)
class Target:
    """A recipe on a cluster, as named by the user: what every action starts from."""

    recipe: str
    """The recipe.toml, or its folder."""
    cluster: str
    """A cluster of the clusters file."""
    clusters: str
    """The clusters file."""


@dataclass(frozen=True)
class UpSettings:
    """How `up` runs."""

    foreground: bool = False
    """Stay and supervise the ready gang until it ends (what a router entry's cmd uses)."""


@dataclass(frozen=True)
class LogsSettings:
    """Which output `logs` shows."""

    rank: int | None = None
    """Only this rank; None: all."""
    follow: bool = False
    """Keep showing new lines until the ranks end."""


def load_target(target: Target) -> tuple[Recipe, Cluster]:
    """The recipe and the cluster; the faults of both files are reported together."""
    faults = []
    recipe = cluster = None
    try:
        recipe = load_recipe(target.recipe)
    except ConfigError as error:
        faults += error.faults
    try:
        cluster = get_cluster(target.clusters, target.cluster)
    except ConfigError as error:
        faults += error.faults
    if faults:
        raise ConfigError(faults)
    assert recipe is not None and cluster is not None
    return recipe, cluster
