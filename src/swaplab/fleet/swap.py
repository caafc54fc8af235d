"""What must stop before a model can start: a pure decision over plain data."""

from __future__ import annotations

from collections.abc import Iterable

from swaplab.config.model import Config


def must_stop(config: Config, target: str, running: Iterable[str]) -> list[str]:
    """Models among `running` (in the given order) that llama-swap's group rules stop for `target`.

    Within the target's group, `swap: true` allows one member at a time. An
    `exclusive` group stops every model of other groups, except `persistent` ones.
    """
    group = config.group_of(target)
    victims = []
    for other in running:
        if other == target:
            continue
        other_group = config.group_of(other)
        if other_group.id == group.id:
            if group.swap:
                victims.append(other)
        elif group.exclusive and not other_group.persistent:
            victims.append(other)
    return victims
