"""`selectors:`: virtual model names, each resolved per request to one of its targets by a
strategy (`warm`, `pin`, `spillover`), validated as llama-swap validates them
(internal/config/selectors.go). A target resolves like any requested name (`config.names`)
and is never another selector.
"""

from __future__ import annotations

from swaplab.config.matrix import can_contain_all
from swaplab.config.model import SelectorConfig
from swaplab.config.model import Names
from swaplab.config.routing import Routing
from swaplab.config.tree import to_plain
from swaplab.config.yamlreader import YamlSection, shown

STRATEGIES = ("warm", "pin", "spillover")


def read_selectors(section: YamlSection | None, names: Names, routing: Routing) -> dict[str, SelectorConfig]:
    """Each selector, its targets checked: they resolve, `warm` ones are local, and a
    `spillover` selector's local targets can all run at once under the router."""
    selectors: dict[str, SelectorConfig] = {}
    if section is None:
        return selectors
    for selector_id, entry in section.entries.items():
        section.read_keys.add(selector_id)
        if not entry.item.is_mapping and entry.item.value is not None:
            section.fault(entry, f"expected a mapping (strategy, targets, ...), got {shown(entry.item)}")
            continue
        selector = YamlSection(section.findings, entry.item, section.path + (selector_id,))
        settings = selector.section("settings")
        spillover = settings.integer("spillover", 1) if settings is not None else 1
        if settings is not None:
            settings.finish()
        metadata = selector.mapping("metadata")
        selectors[selector_id] = SelectorConfig(
            id=selector_id,
            strategy=selector.string("strategy"),
            targets=tuple(item.text for item in selector.strings("targets")),
            spillover=spillover,
            name=selector.string("name"),
            description=selector.string("description"),
            unlisted=selector.boolean("unlisted", False),
            metadata=to_plain(metadata) if metadata is not None else {},
        )
        selector.finish()
    for selector_id, selector in selectors.items():
        for problem in _selector_problems(selector, selectors, names, routing):
            section.findings.fault(section.entries[selector_id].key_line, problem)
    return selectors


def _selector_problems(
    selector: SelectorConfig, selectors: dict[str, SelectorConfig], names: Names, routing: Routing
) -> list[str]:
    """llama-swap's objections to one selector, in its words (the first stops its checks, as there)."""
    where = f"selectors.{selector.id}"
    if not selector.id.strip():
        return ["selectors: selector names cannot be empty"]
    if selector.id in names.model_ids:
        return [f'{where}: name conflicts with model ID "{selector.id}"']
    if selector.id in names.aliases:
        return [f'{where}: name conflicts with model alias "{selector.id}"']
    if names.qualified.get(selector.id):
        return [f'selector ID "{selector.id}" conflicts with fully qualified peer model name']
    if not selector.strategy:
        return [f"{where}.strategy is required"]
    if selector.strategy not in STRATEGIES:
        return [f'{where}.strategy: unknown strategy "{selector.strategy}" (valid: {", ".join(STRATEGIES)})']
    if not selector.targets:
        return [f"{where}.targets must contain at least one entry"]
    resolved: list[str] = []
    local: list[str] = []
    for index, target in enumerate(selector.targets):
        if target in selectors:
            return [f'{where}.targets[{index}] references selector "{target}"; selector chaining is not supported']
        base = names.base(target)
        if base is None:
            return [f'{where}.targets[{index}] references unknown model "{target}"']
        model_id = names.local(target)
        if selector.strategy == "warm" and model_id is None:
            return [f'{where}.targets[{index}] must resolve to a local model for strategy "warm"']
        if model_id is not None:
            local.append(model_id)
        resolved.append(base)
    if selector.strategy != "spillover":
        return []
    if selector.spillover < 1:
        return [f"{where}.settings.spillover must be >= 1"]
    seen: set[str] = set()
    for target in resolved:
        if target in seen:
            return [f'{where}.targets contains duplicate resolved model "{target}"']
        seen.add(target)
    problem = _coexistence_problem(selector.id, local, routing)
    return [problem] if problem else []


def _coexistence_problem(selector_id: str, local: list[str], routing: Routing) -> str | None:
    """Can a spillover selector's local targets run at once? One matrix set holds them all, or
    they share one group with `swap: false` (models in no group are in `(default)`, which swaps)."""
    if len(local) <= 1:
        return None
    if routing.router == "matrix":
        if routing.matrix is not None and can_contain_all(routing.matrix, local):
            return None
        return f"selectors.{selector_id}.targets must all appear together in one expanded matrix set"
    group_of = {member: group.id for group in routing.groups.values() for member in group.members}
    group_id = group_of.get(local[0])
    if group_id is None or routing.groups[group_id].swap:
        return f"selectors.{selector_id} spillover targets must share a group with swap: false"
    if any(group_of.get(target) != group_id for target in local[1:]):
        return f"selectors.{selector_id} spillover targets must share one routing group"
    return None
