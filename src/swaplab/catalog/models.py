"""Which models the catalogue has a page for: the config's local and peer models, and retired ids.

A retired id survives only in the results store (runs of a model recorded under a name no
model of the config answers to; the bench's selftest and runs against a sim are no model's)
or in the notes (a front matter's `models` naming one). Pure
functions over the config, the names runs were recorded under and the notes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swaplab.config import Config
from swaplab.config.redact import config_secrets, entry_text, redact_text
from swaplab.notes.names import config_model_names, name_index
from swaplab.notes.folder import Note

ACTIVE = "Active"
RETIRED = "Retired"


@dataclass(frozen=True)
class CatalogModel:
    id: str
    names: tuple[str, ...]
    """The id first, then every other name it answers to: what its runs and notes are matched by."""
    origin: str
    """`local`, `peer` or `retired`."""
    name: str = ""
    description: str = ""
    aliases: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    """Each device it claims, described: `0: RTX 4060 Ti, 6 GiB`."""
    peer: str = ""
    peer_proxy: str = ""
    entry: str = ""
    """The config entry as written, comments included, its secrets masked (local models only)."""
    entry_line: int = 0
    survives_in: tuple[str, ...] = ()
    """For a retired id: `results` and/or `notes`."""

    @property
    def state(self) -> str:
        return RETIRED if self.origin == "retired" else ACTIVE


def catalog_models(config: Config, recorded: Iterable[tuple[str, str | None]], notes: Sequence[Note]) -> list[CatalogModel]:
    """Local models in config order, then peer models, then retired ids sorted.

    `recorded` is the (model, requested_model) pair of each run in the store.
    """
    names = config_model_names(config)
    secrets = config_secrets(config)
    models: list[CatalogModel] = []
    for model in config.models.values():
        models.append(
            CatalogModel(
                id=model.id,
                names=names[model.id],
                origin="local",
                name=model.name,
                description=model.description,
                aliases=model.aliases,
                devices=tuple(_device(config, device, model.vram_gib.get(device)) for device in model.devices),
                entry=entry_text(model, secrets),
                entry_line=model.line,
            )
        )
    for peer in config.peers.values():
        for peer_model in peer.models:
            qualified = f"{peer.id}/{peer_model}"
            models.append(
                CatalogModel(
                    id=qualified, names=names[qualified], origin="peer", aliases=names[qualified][1:],
                    peer=peer.id, peer_proxy=redact_text(peer.proxy, secrets),
                )
            )
    models += retired_models(set(name_index(names)), recorded, notes)
    return models


def names_a_model(run: Mapping[str, Any]) -> bool:
    """Whether a stored run measured a model: not the bench's selftest, nor any run against a
    `swaplab sim` (a stand-in, never a model to catalogue, under whatever name it was asked)."""
    return run.get("kind") != "selftest" and run.get("backend_kind") != "swaplab-sim"


def retired_models(
    known: set[str], recorded: Iterable[tuple[str, str | None]], notes: Sequence[Note]
) -> list[CatalogModel]:
    """Ids no model of the config answers to, sorted, each with the other names its runs paired it with.

    A run's `model` is the id its server resolved `requested_model` to, so it names the
    retired model and `requested_model` becomes one of its aliases.
    """
    groups = _NameGroups()
    from_results: set[str] = set()
    for model, requested_model in recorded:
        pair = [name for name in (requested_model, model) if name and name not in known]
        if not pair:
            continue
        from_results.update(pair)
        groups.join(pair, preferred=model if requested_model and model in pair else None)
    from_notes = {name for note in notes for name in note.models if name not in known}
    for name in sorted(from_notes):
        groups.join([name])
    retired = []
    for model_id, members in groups.groups():
        aliases = tuple(sorted(set(members) - {model_id}))
        survives = tuple(
            where for where, names in (("results", from_results), ("notes", from_notes)) if names & set(members)
        )
        retired.append(
            CatalogModel(id=model_id, names=(model_id, *aliases), origin="retired", aliases=aliases, survives_in=survives)
        )
    return sorted(retired, key=lambda model: model.id)


class _NameGroups:
    """Names joined into groups (union-find); each group's id is a preferred name, else its first in sort order."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        self.preferred: set[str] = set()

    def _root(self, name: str) -> str:
        self.parent.setdefault(name, name)
        while self.parent[name] != name:
            name = self.parent[name]
        return name

    def join(self, names: Sequence[str], preferred: str | None = None) -> None:
        if preferred is not None:
            self.preferred.add(preferred)
        roots = [self._root(name) for name in names]
        for root in roots[1:]:
            self.parent[root] = roots[0]

    def groups(self) -> list[tuple[str, list[str]]]:
        members: dict[str, list[str]] = {}
        for name in sorted(self.parent):
            members.setdefault(self._root(name), []).append(name)
        return [
            (next((name for name in names if name in self.preferred), names[0]), names) for names in members.values()
        ]


def _device(config: Config, device: int, vram_gib: float | None) -> str:
    declared = config.devices.get(device)
    text = f"{device}"
    if declared is not None and declared.name:
        text += f": {declared.name}"
    if vram_gib:
        text += f", {vram_gib:g} GiB"
    return text


def page_names(ids: Iterable[str]) -> dict[str, str]:
    """A file name (without `.html`) per id, safe in a URL and on any file system, unique among `ids`.

    Characters other than letters, digits, `.`, `_` and `-` become `_` (`ollama/gemma4:31b-cloud`
    is `ollama_gemma4_31b-cloud`); a clash gets `-2`, `-3`, ... in the order given.
    """
    taken: set[str] = set()
    names: dict[str, str] = {}
    for identifier in ids:
        base = re.sub(r"[^A-Za-z0-9._-]", "_", identifier) or "_"
        if base.startswith("."):
            base = "_" + base[1:]
        name, number = base, 1
        while name.lower() in taken:  # case-insensitive file systems too
            number += 1
            name = f"{base}-{number}"
        taken.add(name.lower())
        names[identifier] = name
    return names
