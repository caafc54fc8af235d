"""Everything the site shows, gathered once: the config's models, the store's runs, the notes.

`read_site` does the reading (config already loaded, notes folder, store); `gather` is a
pure function of what was read, so tests and the live catalogue build the same `Site`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swaplab.catalog.history import GrillRow, grill_rows, latest_score
from swaplab.catalog.lmeval import LmevalRow, lmeval_rows
from swaplab.catalog.models import CatalogModel, catalog_models, names_a_model, page_names
from swaplab.catalog.performance import Performance, performance
from swaplab.config import Config
from swaplab.notes.folder import Note, load_notes
from swaplab.notes.matching import LinkTargets, NoteMatch, notes_for
from swaplab.notes.names import name_index
from swaplab.notes.wikilinks import find_wikilinks
from swaplab.results.runs import recorded_models, runs_for_models
from swaplab.results.store import reading


@dataclass(frozen=True)
class Sources:
    """Where the site came from, for its footer."""

    config: str
    database: str | None = None
    notes: str | None = None
    runs: int = 0


@dataclass(frozen=True)
class ModelPage:
    model: CatalogModel
    page: str
    """File name without `.html`, under `models/`."""
    history: tuple[GrillRow, ...]
    lmeval: tuple[LmevalRow, ...]
    """The lm-eval scores of its grill runs, one row per task and metric (none: no lm-eval run)."""
    performance: Performance
    notes: tuple[NoteMatch, ...]
    latest: GrillRow | None


@dataclass(frozen=True)
class NotePage:
    note: Note
    page: str
    """File name without `.html`, under `notes/`."""
    models: tuple[ModelPage, ...]
    """The models the note belongs to."""
    linked_from: tuple[Note, ...]
    """Notes with a wikilink to this one (its backlinks)."""


@dataclass(frozen=True)
class Site:
    models: tuple[ModelPage, ...]
    notes: tuple[NotePage, ...]
    targets: LinkTargets
    sources: Sources
    model_pages: dict[str, str] = field(default_factory=dict)
    """model id -> page name."""
    note_pages: dict[str, str] = field(default_factory=dict)
    """note stem -> page name."""

    def link(self, name: str, root: str) -> str | None:
        """The href of what `[[name]]` names, from a page `root` levels below the site (`""` or `"../"`)."""
        note = self.targets.note(name)
        if note is not None:
            return f"{root}notes/{self.note_pages[note.stem]}.html"
        model_id = self.targets.model(name)
        if model_id is not None:
            return f"{root}models/{self.model_pages[model_id]}.html"
        return None


def gather(config: Config, notes: Sequence[Note], runs: Sequence[Mapping[str, Any]], sources: Sources) -> Site:
    """The site's content from a loaded config, the notes and every run in the store."""
    recorded = [(run["model"], run.get("requested_model")) for run in runs if names_a_model(run)]
    models = catalog_models(config, recorded, notes)
    model_pages = page_names(model.id for model in models)
    note_pages = page_names(note.stem for note in notes)
    pages = []
    for model in models:
        names = set(model.names)
        own = [run for run in runs if run["model"] in names or run.get("requested_model") in names]
        history = tuple(grill_rows(own))
        pages.append(
            ModelPage(
                model=model, page=model_pages[model.id], history=history, lmeval=tuple(lmeval_rows(own)),
                performance=performance(own),
                notes=tuple(notes_for(model.names, notes)), latest=latest_score(history),
            )
        )
    targets = LinkTargets(notes, name_index({model.id: model.names for model in models}))
    note_list = []
    for note in notes:
        linked_from = tuple(
            other for other in notes
            if other is not note and any(targets.note(link.target) is note for link in find_wikilinks(other.body))
        )
        belongs = tuple(page for page in pages if any(match.note is note for match in page.notes))
        note_list.append(NotePage(note, note_pages[note.stem], belongs, linked_from))
    return Site(tuple(pages), tuple(note_list), targets, sources, model_pages, note_pages)


def read_site(config: Config, notes_dir: str | None, database: Path | None) -> Site:
    """Read the notes folder and the store at `database` (None: no store) and gather the site."""
    notes = load_notes(notes_dir) if notes_dir else ()
    runs = read_runs(database) if database is not None else []
    sources = Sources(
        config=config.path, database=str(database) if database is not None else None, notes=notes_dir, runs=len(runs)
    )
    return gather(config, notes, runs, sources)


def read_runs(path: Path) -> list[dict[str, Any]]:
    """Every run in the store, oldest first, without their requests."""
    with reading(path) as connection:
        return runs_for_models(connection, recorded_models(connection))
