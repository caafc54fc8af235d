"""Who runs beside whom: a `groups:` block (`config.routing` says which), and the models
`hooks.on_startup.preload` starts."""

from __future__ import annotations

from swaplab.config.model import GroupConfig, ModelConfig, SelectorConfig
from swaplab.config.model import Names
from swaplab.config.tree import Entry
from swaplab.config.yamlreader import YamlSection, shown


def read_groups(
    section: YamlSection | None, models: dict[str, ModelConfig], model_entries: dict[str, Entry]
) -> dict[str, GroupConfig]:
    """Each group and its members; a model may be in one group only, and is listed by its id."""
    groups: dict[str, GroupConfig] = {}
    if section is None:
        return groups
    member_of: dict[str, str] = {}
    for group_id, entry in section.entries.items():
        section.read_keys.add(group_id)
        if not entry.item.is_mapping:
            section.fault(entry, f"expected a mapping (swap, exclusive, persistent, members), got {shown(entry.item)}")
            continue
        group = YamlSection(section.findings, entry.item, section.path + (group_id,))
        members: list[str] = []
        for item in group.strings("members"):
            member = item.text
            where = group.where("members")
            if member in members:
                group.findings.fault(item.line, f"duplicate model member {member} found in group: {group_id}")
                continue
            if member not in model_entries:
                hint = ""
                target = _resolve(models, member)
                if target is not None:
                    hint = f" (it is an alias of '{target}'; list the model id)"
                group.findings.fault(item.line, f"{where}: '{member}' is not a model{hint}")
            elif member in member_of:
                group.findings.fault(
                    item.line, f"model member {member} is used in multiple groups: {member_of[member]} and {group_id}"
                )
            else:
                member_of[member] = group_id
            members.append(member)
        groups[group_id] = GroupConfig(
            id=group_id,
            swap=group.boolean("swap", True),
            exclusive=group.boolean("exclusive", True),
            persistent=group.boolean("persistent", False),
            members=tuple(members),
        )
        group.finish()
    return groups


def read_preload(hooks: YamlSection | None, names: Names, selectors: dict[str, SelectorConfig]) -> tuple[str, ...]:
    """`hooks.on_startup.preload`: model ids or aliases, each resolved to its id once.

    A selector's name preloads the model that selector picks at launch (`_selector_pick`);
    llama-swap resolves preload names by id and alias only and drops the rest silently
    (internal/config/load.go:270-283), so a selector's name starts nothing there. Any other
    name that is no model is skipped with a warning (llama-swap skips it silently).
    """
    if hooks is None:
        return ()
    on_startup = hooks.section("on_startup")
    hooks.finish()
    if on_startup is None:
        return ()
    preload: list[str] = []
    for item in on_startup.strings("preload"):
        name = item.text.strip()
        if not name:
            continue
        model_id = names.local(name)
        if model_id is None and name in selectors:
            model_id, problem = _selector_pick(selectors[name], names, preload)
            if problem:
                on_startup.findings.warn(item.line, f"hooks.on_startup.preload: '{name}' is a selector {problem}")
                continue
            if model_id is None:
                continue  # a target that resolves to nothing: the selector's own fault says so
        if model_id is None:
            on_startup.findings.warn(
                item.line, f"hooks.on_startup.preload: '{name}' is not a model id or alias; not preloaded"
            )
        elif model_id not in preload:
            preload.append(model_id)
    on_startup.finish()
    return tuple(preload)


def _selector_pick(selector: SelectorConfig, names: Names, starting: list[str]) -> tuple[str | None, str]:
    """The model `selector` picks at launch, when only `starting` (the preloads before it) run.

    llama-swap's strategies (internal/server/selector.go:154-229) with no request served yet
    and no spillover reservation: `pin` takes the first target; `warm` the first target that
    is ready, else starting, else the first; `spillover` the least reserved active target
    (active: ready or starting), all tied at none and taken in order, else the first cold
    one. So `warm` and `spillover` take the first target an earlier preload starts, else the
    first target. Returns (model id, "") or (None, why nothing is preloaded).
    """
    if not selector.targets:
        return None, ""
    pick = selector.targets[0]
    if selector.strategy in ("warm", "spillover"):
        pick = next((target for target in selector.targets if names.local(target) in starting), pick)
    model_id = names.local(pick)
    if model_id is None and names.peer(pick) is not None:
        return None, f"whose pick at launch, '{pick}', is a peer's model; not preloaded"
    return model_id, ""


def _resolve(models: dict[str, ModelConfig], name: str) -> str | None:
    if name in models:
        return name
    for model in models.values():
        if name in model.aliases:
            return model.id
    return None
