"""Which notes belong to which model, what a wikilink names, which name nothing: pure functions over notes and names.

A note belongs to a model (known by its id and aliases) when
1. its front matter's `models` lists one of the names; or
2. its file stem equals a name, or is a prefix of one at a `-`
   (`glm-4.7-flash.md` belongs to the model aliased `glm-4.7-flash-sglang-tp2`); or
3. its text names one of them as a whole token, where `-` and `.` belong to the token
   (`glm-flash` is not named inside `glm-flash-awq` nor `glm-flash.md`; a sentence's final
   full stop is not part of a token).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from swaplab.notes.folder import Note
from swaplab.notes.wikilinks import find_wikilinks


@dataclass(frozen=True)
class NoteMatch:
    note: Note
    reason: str
    """Why the note belongs to the model, in words: `front matter lists X`, `file name is a prefix of X`, ..."""


def match_reason(note: Note, names: Sequence[str]) -> str | None:
    """Why `note` belongs to the model called `names` (id first, then aliases), or None when it doesn't."""
    for name in names:
        if name in note.models:
            return f"front matter lists {name}"
    for name in names:
        if note.stem == name:
            return f"file name is {name}"
    for name in names:
        if name.startswith(note.stem + "-"):
            return f"file name is a prefix of {name}"
    for name in names:
        if mentions(note.body, name):
            return f"mentions {name}"
    return None


def notes_for(names: Sequence[str], notes: Iterable[Note]) -> list[NoteMatch]:
    """The notes that belong to the model called `names`, in the folder's order."""
    matches = []
    for note in notes:
        reason = match_reason(note, names)
        if reason is not None:
            matches.append(NoteMatch(note, reason))
    return matches


def mentions(text: str, name: str) -> bool:
    """True when `text` names `name` as a whole token."""
    return bool(name) and _token_pattern(name).search(text) is not None


@lru_cache(maxsize=4096)
def _token_pattern(name: str) -> re.Pattern[str]:
    # A `.` right after the name only extends the token when the token goes on after it.
    return re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.[\w-])")


class LinkTargets:
    """What `[[name]]` names: a note by stem, then by title, then a model by any of its names."""

    def __init__(self, notes: Iterable[Note], model_names: Mapping[str, str] | None = None):
        self.by_stem: dict[str, Note] = {}
        self.by_title: dict[str, Note] = {}
        for note in notes:
            self.by_stem.setdefault(note.stem, note)
            self.by_title.setdefault(note.title, note)
        self.model_names = dict(model_names or {})
        """Every name of every model (ids, aliases) to the model's id."""

    def note(self, name: str) -> Note | None:
        return self.by_stem.get(name) or self.by_title.get(name)

    def model(self, name: str) -> str | None:
        """The id of the model `name` names, when no note does."""
        return None if self.note(name) is not None else self.model_names.get(name)

    def resolves(self, name: str) -> bool:
        return self.note(name) is not None or name in self.model_names


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
