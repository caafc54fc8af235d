"""engine = "process": the recipe's args run directly on each node, no container.

What the tests run over real SSH (with `swaplab sim` as the ranks), and a way to gang
any program that meets its peers through the SWAPLAB_* variables. The placeholders
`{rank}`, `{port}`, `{head}`, `{fabric_ip}` and `{model}` in args (and entrypoint) are
replaced per node; nothing else in an argument is touched, so JSON passes through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swaplab.launch.engines import LauncherFlag

if TYPE_CHECKING:
    from swaplab.launch.engines import Gang
    from swaplab.launch.plan import Step
    from swaplab.launch.recipe import Recipe

USES_DOCKER = False
DEFAULT_ENTRYPOINT: tuple[str, ...] = ()
MODEL_IS_HUB_REPO = False
READY: tuple[str, ...] = ()
FATAL: tuple[str, ...] = ()
READY_PATH = None
READY_TIMEOUT = 120.0
RESERVED_FLAGS: tuple[str, ...] = ()


def recipe_flags(recipe: Recipe) -> tuple[LauncherFlag, ...]:
    """A process gets no flags from the launcher: its args are the whole command."""
    return ()


def check(recipe: Recipe) -> list[tuple[tuple[str | int, ...], str]]:
    """Nothing beyond the recipe's own rules."""
    return []


def node_env(gang: Gang, rank: int) -> dict[str, str]:
    """The SWAPLAB_* variables the gang adds are all a process needs."""
    return {}


def substitute(word: str, gang: Gang, rank: int) -> str:
    """`word` with the per-node placeholders replaced (plain replacement: braces elsewhere stay)."""
    values = {
        "{rank}": str(rank),
        "{port}": str(gang.recipe.port),
        "{head}": gang.head.fabric_ip,
        "{fabric_ip}": gang.hosts[rank].fabric_ip,
        "{model}": gang.recipe.model or "",
    }
    for placeholder, value in values.items():
        word = word.replace(placeholder, value)
    return word


def rank_steps(gang: Gang) -> list[tuple[int, Step]]:
    """Each node runs the command itself; the head first."""
    from swaplab.launch.plan import Step

    command = gang.recipe.entrypoint + gang.recipe.args
    return [
        (rank, Step("rank", tuple(substitute(word, gang, rank) for word in command), "rank"))
        for rank in gang.ranks
    ]
