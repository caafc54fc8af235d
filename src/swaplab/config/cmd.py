"""A `cmd` string to argv, exactly as llama-swap reads it; never through a shell."""

from __future__ import annotations

import shlex

MAX_COMMAND = 128 << 10
"""Characters a command may have (Linux runs no argument past 128 KiB): shlex takes time
that grows with the square of a word's length, minutes for a few MiB."""


def strip_comment_lines(text: str) -> str:
    """Drop lines whose trimmed text starts with `#` (users keep notes inside `cmd`)."""
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith("#"))


def split_command(text: str) -> list[str]:
    """Comment lines dropped, trailing-backslash lines joined, then split shell-style (POSIX).

    Raises ValueError on an unbalanced quote or a command past `MAX_COMMAND`.
    """
    text = strip_comment_lines(text)
    if len(text) > MAX_COMMAND:
        raise ValueError(f"the command is longer than {MAX_COMMAND >> 10} KiB; no command needs that much")
    lines = []
    for line in text.split("\n"):
        trimmed = line.strip()
        # shlex would keep the newline after a backslash as a literal character.
        lines.append(trimmed[:-1] + " " if trimmed.endswith("\\") else line)
    return shlex.split("\n".join(lines), comments=False, posix=True)
