"""A folder of markdown notes with front matter and [[wikilinks]], and which notes belong to which model."""

from swaplab.notes.folder import Note, NotesError, load_notes
from swaplab.notes.matching import LinkTargets, NoteMatch, match_reason, mentions, notes_for
from swaplab.notes.wikilinks import Wikilink, find_wikilinks, render

__all__ = [
    "LinkTargets", "Note", "NoteMatch", "NotesError", "Wikilink", "find_wikilinks", "load_notes", "match_reason",
    "mentions", "notes_for", "render",
]
