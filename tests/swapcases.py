"""The swap table: group configs, and which running models must stop before a target starts.

tests/test_swap.py checks the swap decision against it, tests/test_placement.py the
placement decision.
"""

from __future__ import annotations

from swaplab.config.model import Config, GroupConfig, ModelConfig


def config(*groups: GroupConfig, models: str = "a b c d e") -> Config:
    return Config(
        path="<table>",
        models={m: ModelConfig(id=m, cmd=("x",), cmd_stop=None, proxy="http://x", check_endpoint="none") for m in models.split()},
        groups={g.id: g for g in groups},
    )


NO_GROUPS = config()
SWAP_PAIR = config(GroupConfig("pair", swap=True, exclusive=False, members=("a", "b")))
TOGETHER = config(GroupConfig("together", swap=False, exclusive=False, members=("a", "b")))
EXCLUSIVE_TOGETHER = config(GroupConfig("big", swap=False, exclusive=True, members=("a", "b")))
WITH_PERSISTENT = config(
    GroupConfig("big", swap=True, exclusive=True, members=("a", "b")),
    GroupConfig("always", swap=False, exclusive=False, persistent=True, members=("c",)),
    GroupConfig("side", swap=False, exclusive=False, members=("d",)),
)


# (config, target, running models least recently used first, models that must stop).
CASES = [
    (NO_GROUPS, "a", [], []),
    (NO_GROUPS, "a", ["a"], []),
    (NO_GROUPS, "b", ["a"], ["a"]),  # implicit group: swap and exclusive, one at a time
    (NO_GROUPS, "c", ["b", "a"], ["b", "a"]),  # order kept (the fleet passes least recently used first)
    (SWAP_PAIR, "b", ["a"], ["a"]),
    (SWAP_PAIR, "b", ["c"], []),  # a non-exclusive group leaves the default group alone
    (SWAP_PAIR, "c", ["a"], ["a"]),  # the default group is exclusive
    (TOGETHER, "b", ["a"], []),  # swap: false lets members run together
    (TOGETHER, "b", ["a", "c"], []),
    (EXCLUSIVE_TOGETHER, "b", ["a", "c"], ["c"]),
    (WITH_PERSISTENT, "a", ["c", "d", "e"], ["d", "e"]),  # persistent groups survive exclusivity
    (WITH_PERSISTENT, "b", ["a", "c"], ["a"]),
    (WITH_PERSISTENT, "d", ["a", "c"], []),  # a non-exclusive group stops no one
    (WITH_PERSISTENT, "e", ["a", "c", "d"], ["a", "d"]),  # the default group is exclusive, c persists
]
