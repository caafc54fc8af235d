"""engine = "process": the recipe's args run directly on each node, no container.

What the tests run over real SSH (with `swaplab sim` as the ranks), and a way to gang
any program that meets its peers through the SWAPLAB_* variables. The placeholders
`{rank}`, `{port}`, `{head}`, `{fabric_ip}` and `{model}` in args (and entrypoint) are
replaced per node; nothing else in an argument is touched, so JSON passes through.
"""

from __future__ import annotations

from swaplab.launch.engine import Fault, Gang, LauncherFlag
from swaplab.launch.hooks import staged_path, wrapped
from swaplab.launch.spec import Readiness, Recipe, Step


class Process:
    """Any program, one per node, started as the recipe's args say."""

    name = "process"
    order = 3
    uses_docker = False
    default_entrypoint: tuple[str, ...] = ()
    replaces_image_entrypoint = False
    # A `model` that is ORG/NAME is fetched and copied like a container engine's; HF_HOME tells the process where.
    model_is_hub_repo = True
    readiness = Readiness(path=None, ready=(), fatal=(), timeout=120.0)
    reserved_flags: tuple[str, ...] = ()

    def recipe_flags(self, recipe: Recipe) -> tuple[LauncherFlag, ...]:
        """A process gets no flags from the launcher: its args are the whole command."""
        return ()

    def check(self, recipe: Recipe) -> list[Fault]:
        """Nothing beyond the recipe's own rules."""
        return []

    def gpu_factors(self, recipe: Recipe) -> tuple[tuple[str, int], ...]:
        """None: a process is one per node, whatever it does with GPUs."""
        return ()

    def node_env(self, gang: Gang, rank: int) -> dict[str, str]:
        """The SWAPLAB_* variables the gang adds are all a process needs."""
        return {}

    def rank_steps(self, gang: Gang) -> list[tuple[int, Step]]:
        """Each node runs the command itself (after the recipe's pre_serve hooks); the head first."""
        command = gang.recipe.entrypoint + gang.recipe.args
        steps = []
        for rank in gang.ranks:
            def word(text: str, rank: int = rank) -> str:
                return substitute(text, gang, rank)
            argv = wrapped(
                gang.recipe, [word(part) for part in command],
                source=lambda index: staged_path(gang.recipe, gang.run_id, index), word=word,
            )
            steps.append((rank, Step("rank", argv, "rank")))
        return steps


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


ENGINE = Process()
