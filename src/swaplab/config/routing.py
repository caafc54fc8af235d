"""Who runs beside whom, and who waits first: `routing` (router and scheduler), and the legacy
top-level `groups` and `matrix` it replaces, normalised as llama-swap normalises them.

`routing.router.use` picks the group router (`settings.groups`) or the matrix router
(`settings.matrix`); the block it does not pick is accepted and ignored unread, as in
llama-swap. The legacy top-level keys and `routing.router` are mutually exclusive. The
scheduler is llama-swap's one, `fifo`, with per-model priorities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swaplab.config.groups import read_groups
from swaplab.config.matrix import read_matrix
from swaplab.config.model import GroupConfig, MatrixConfig, ModelConfig
from swaplab.config.model import Names
from swaplab.config.tree import Entry
from swaplab.config.yamlreader import YamlSection

ROUTERS = ("group", "matrix")
SCHEDULERS = ("fifo",)


@dataclass(frozen=True)
class Routing:
    router: str = "group"
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    matrix: MatrixConfig | None = None
    priority: dict[str, int] = field(default_factory=dict)


def read_routing(
    top: YamlSection, models: dict[str, ModelConfig], model_entries: dict[str, Entry], names: Names
) -> Routing:
    """The effective router (its groups or its matrix) and the fifo priorities."""
    legacy_groups = top.entry("groups")
    legacy_matrix = top.entry("matrix")
    routing = top.section("routing")
    router = routing.section("router") if routing is not None else None
    settings = router.section("settings") if router is not None else None
    use_entry = router.entry("use") if router is not None else None
    use = router.string("use") if router is not None else ""
    groups_entry = settings.entry("groups") if settings is not None else None
    matrix_entry = settings.entry("matrix") if settings is not None else None

    has_legacy = legacy_matrix is not None or _non_empty(legacy_groups)
    has_routing = bool(use) or matrix_entry is not None or _non_empty(groups_entry)
    kind, groups_at, matrix_at = "group", None, None
    if has_legacy and has_routing:
        line = (legacy_matrix or legacy_groups).key_line
        top.findings.fault(
            line,
            "config uses both the legacy top-level 'matrix'/'groups' keys and the new 'routing.router' block; "
            "please migrate the top-level keys into 'routing.router' and remove them",
        )
    elif has_legacy:
        if legacy_matrix is not None and _non_empty(legacy_groups):
            top.findings.fault(legacy_matrix.key_line, "config cannot use both 'groups' and 'matrix'")
        elif legacy_matrix is not None:
            kind, matrix_at = "matrix", (top, "matrix")
        else:
            groups_at = (top, "groups")
    elif use == "matrix":
        if matrix_entry is None:
            top.findings.fault(
                use_entry.key_line, "routing.router.use is 'matrix' but routing.router.settings.matrix is not set"
            )
        else:
            kind, matrix_at = "matrix", (settings, "matrix")
    elif use in ("group", ""):
        groups_at = (settings, "groups") if settings is not None else None
    else:
        top.findings.fault(use_entry.key_line, f'routing.router.use: unknown router "{use}" (valid: {", ".join(ROUTERS)})')

    groups: dict[str, GroupConfig] = {}
    matrix = None
    if groups_at is not None:
        groups = read_groups(groups_at[0].section(groups_at[1]), models, model_entries)
    if matrix_at is not None:
        block = matrix_at[0].section(matrix_at[1])
        if block is not None:
            # every model as written, even one too broken to resolve (so it is not reported twice)
            matrix = read_matrix(block, list(model_entries), aliases=names.aliases)
    if settings is not None:
        settings.finish()  # the block `use` did not pick is ignored unread, as in llama-swap
    if router is not None:
        router.finish()
    priority = _read_scheduler(routing, names) if routing is not None else {}
    if routing is not None:
        routing.finish()
    return Routing(router=kind, groups=groups, matrix=matrix, priority=priority)


def _non_empty(entry: Entry | None) -> bool:
    """A groups block that counts as given: llama-swap tests `len(groups) > 0`."""
    return entry is not None and (not entry.item.is_mapping or bool(entry.item.value))


def _read_scheduler(routing: YamlSection, names: Names) -> dict[str, int]:
    """`routing.scheduler`: `use: fifo` (the one scheduler), and `settings.fifo.priority`.

    A priority key may be a model id or an alias. llama-swap accepts an alias key and never
    applies it (its queue looks priorities up by model id); swaplab applies it to the alias's
    model (docs/config.md says so). Two keys naming one model with different priorities is a fault.
    """
    scheduler = routing.section("scheduler")
    if scheduler is None:
        return {}
    use = scheduler.string("use", "fifo") or "fifo"
    if use not in SCHEDULERS:
        scheduler.findings.fault(
            scheduler.entries["use"].key_line, f'routing.scheduler.use: unknown scheduler "{use}" (valid: {", ".join(SCHEDULERS)})'
        )
    settings = scheduler.section("settings")
    scheduler.finish()
    fifo = settings.section("fifo") if settings is not None else None
    if settings is not None:
        settings.finish()
    if fifo is None:
        return {}
    priority_section = fifo.section("priority")
    fifo.finish()
    if priority_section is None:
        return {}
    priority: dict[str, int] = {}
    named_by: dict[str, str] = {}
    for key, entry in priority_section.entries.items():
        value = priority_section.integer(key, 0)
        model_id = names.local(key)
        if model_id is None:
            priority_section.findings.fault(
                entry.key_line, f'routing.scheduler.settings.fifo.priority references unknown model "{key}"'
            )
            continue
        if model_id in priority and priority[model_id] != value:
            if key == model_id:  # the model's own id wins over an alias
                priority[model_id], named_by[model_id] = value, key
                continue
            if named_by[model_id] != model_id:
                priority_section.findings.fault(
                    entry.key_line,
                    f"routing.scheduler.settings.fifo.priority: '{named_by[model_id]}' and '{key}' both name "
                    f"model '{model_id}', with different priorities",
                )
            continue
        priority[model_id], named_by[model_id] = value, key
    priority_section.finish()
    return priority

