"""Who runs beside whom: a `groups:` block (`config.routing` says which), and the models
`hooks.on_startup.preload` starts."""

from __future__ import annotations

from swaplab.config.model import GroupConfig, ModelConfig
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


def read_preload(hooks: YamlSection | None, models: dict[str, ModelConfig]) -> tuple[str, ...]:
    """`hooks.on_startup.preload`: model ids or aliases, each resolved to its id once.

    A name that is no model is skipped with a warning (llama-swap skips it silently).
    """
    if hooks is None:
        return ()
    on_startup = hooks.section("on_startup")
    hooks.finish()
    if on_startup is None:
        return ()
    preload = []
    for item in on_startup.strings("preload"):
        name = item.text.strip()
        if not name:
            continue
        model_id = _resolve(models, name)
        if model_id is None:
            on_startup.findings.warn(
                item.line, f"hooks.on_startup.preload: '{name}' is not a model id or alias; not preloaded"
            )
        elif model_id not in preload:
            preload.append(model_id)
    on_startup.finish()
    return tuple(preload)


def _resolve(models: dict[str, ModelConfig], name: str) -> str | None:
    if name in models:
        return name
    for model in models.values():
        if name in model.aliases:
            return model.id
    return None
