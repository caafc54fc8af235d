"""`swaplab notes check` and `swaplab notes show`: the library calls behind the CLI, printing what they find."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from swaplab.config import load_config
from swaplab.notes.folder import Note, load_notes
from swaplab.notes.matching import LinkTargets, notes_for
from swaplab.notes.names import config_model_names, name_index
from swaplab.notes.wikilinks import find_wikilinks


@dataclass(frozen=True)
class BrokenLink:
    path: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [[{self.target}]] has no note"


def broken_links(notes: Iterable[Note], targets: LinkTargets) -> list[BrokenLink]:
    """Every wikilink that names neither a note nor a model, in file and line order."""
    broken = []
    for note in notes:
        for link in find_wikilinks(note.body):
            if not targets.resolves(link.target):
                broken.append(BrokenLink(note.path, note.body_line + link.line - 1, link.target))
    return broken


def check(folder: str, config_path: str | None = None, out: TextIO | None = None) -> int:
    """`swaplab notes check DIR`: print every broken wikilink; exit 1 when there are any, else 0."""
    out = out or sys.stdout
    notes = load_notes(folder)
    models = config_model_names(load_config(config_path)) if config_path else {}
    broken = broken_links(notes, LinkTargets(notes, name_index(models)))
    for link in broken:
        print(link, file=out)
    return 1 if broken else 0


def show(model: str, folder: str, config_path: str | None = None, out: TextIO | None = None) -> int:
    """`swaplab notes show MODEL`: print the notes of a model (known by all its names when a config is given)."""
    out = out or sys.stdout
    notes = load_notes(folder)
    names: tuple[str, ...] = (model,)
    if config_path:
        models = config_model_names(load_config(config_path))
        model_id = name_index(models).get(model)
        if model_id is not None:
            names = models[model_id]
    matches = notes_for(names, notes)
    if not matches:
        print(f"No notes in {folder} belong to {' / '.join(names)}.", file=out)
        return 0
    for number, match in enumerate(matches):
        if number:
            print(file=out)
        note = match.note
        heading = f"{note.title} ({note.file_name}): {match.reason}"
        print(heading, file=out)
        print("=" * len(heading), file=out)
        print(note.body.strip("\n"), file=out)
    return 0
