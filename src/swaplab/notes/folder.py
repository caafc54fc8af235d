"""A folder of markdown notes: each file's front matter (`title`, `models`, `tags`) and body."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from swaplab.errors import SwaplabError

FRONT_MATTER_FENCE = "---"
FRONT_MATTER_ENDS = ("---", "...")


class NotesError(SwaplabError):
    """A notes folder or a note that cannot be read."""


@dataclass(frozen=True)
class Note:
    """One markdown file of the folder."""

    path: Path
    stem: str
    """The file name without `.md`: what `[[stem]]` links to and what `notes/<stem>.html` is called."""
    title: str
    """The front matter's `title`, else the stem."""
    models: tuple[str, ...] = ()
    """Model ids or aliases the front matter says the note belongs to."""
    tags: tuple[str, ...] = ()
    body: str = ""
    """The markdown after the front matter."""
    body_line: int = 1
    """Line of the file where `body` starts, so a place in the body can be reported as FILE:LINE."""

    @property
    def file_name(self) -> str:
        return self.path.name


def load_notes(folder: str | Path) -> tuple[Note, ...]:
    """Every `*.md` file directly in `folder`, sorted by stem; raises NotesError for a folder or note that can't be read."""
    directory = Path(folder)
    if not directory.exists():
        raise NotesError(f"notes folder {directory} does not exist")
    if not directory.is_dir():
        raise NotesError(f"{directory} is not a folder (expected a folder of markdown notes)")
    try:
        paths = sorted(path for path in directory.iterdir() if path.suffix == ".md" and path.is_file())
    except OSError as error:
        raise NotesError(f"cannot read notes folder {directory}: {error.strerror or error}") from None
    return tuple(read_note(path) for path in paths)


def read_note(path: Path) -> Note:
    """One note: its front matter read, its body kept as written."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise NotesError(f"{path}:1: not UTF-8 text ({error.reason})") from None
    except OSError as error:
        raise NotesError(f"{path}:1: cannot read: {error.strerror or error}") from None
    front, body, body_line = split_front_matter(text, path)
    title = _text(front.get("title"), path, "title") or path.stem
    return Note(
        path=path,
        stem=path.stem,
        title=title,
        models=_names(front.get("models"), path, "models"),
        tags=_names(front.get("tags"), path, "tags"),
        body=body,
        body_line=body_line,
    )


def split_front_matter(text: str, path: Path) -> tuple[dict, str, int]:
    """(front matter, body, the body's first line); a file without a closed `---` block has none."""
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != FRONT_MATTER_FENCE:
        return {}, text, 1
    for index in range(1, len(lines)):
        if lines[index].rstrip() in FRONT_MATTER_ENDS:
            break
    else:
        return {}, text, 1
    try:
        front = yaml.safe_load("\n".join(lines[1:index])) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = mark.line + 2 if mark is not None else 1
        problem = getattr(error, "problem", None) or str(error)
        raise NotesError(f"{path}:{line}: front matter is not valid YAML: {problem}") from None
    if not isinstance(front, dict):
        raise NotesError(f"{path}:2: front matter must be a mapping (title, models, tags)")
    return front, "\n".join(lines[index + 1 :]), index + 2


def _text(value: object, path: Path, key: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value).strip()
    raise NotesError(f"{path}:2: front matter '{key}' must be a string")


def _names(value: object, path: Path, key: str) -> tuple[str, ...]:
    """A list of names, or one name on its own."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    names = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise NotesError(f"{path}:2: front matter '{key}' must be a list of names")
        names.append(str(item).strip())
    return tuple(name for name in names if name)
