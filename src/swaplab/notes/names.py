"""The names a config's models answer to: what notes and runs are matched by."""

from __future__ import annotations

from swaplab.config import Config


def config_model_names(config: Config) -> dict[str, tuple[str, ...]]:
    """Every model a config serves, local then peer, as id -> its names (the id first, then its aliases).

    A peer's model is `peer/model`; its bare name is an alias when no other peer lists it,
    as the router resolves it.
    """
    names: dict[str, tuple[str, ...]] = {model.id: (model.id, *model.aliases) for model in config.models.values()}
    local_names = {name for model_names in names.values() for name in model_names}
    listed_by: dict[str, int] = {}
    for peer in config.peers.values():
        for model in peer.models:
            listed_by[model] = listed_by.get(model, 0) + 1
    for peer in config.peers.values():
        for model in peer.models:
            qualified = f"{peer.id}/{model}"
            bare = (model,) if listed_by[model] == 1 and model not in local_names else ()
            names[qualified] = (qualified, *bare)
    return names


def name_index(models: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """name -> model id, for every name of every model; a name taken earlier keeps its model."""
    index: dict[str, str] = {}
    for model_id, names in models.items():
        for name in names:
            index.setdefault(name, model_id)
    return index
