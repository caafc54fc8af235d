"""A `cmd` string to argv, exactly as llama-swap reads it; never through a shell."""

from __future__ import annotations

import shlex


def strip_comment_lines(text: str) -> str:
    """Drop lines whose trimmed text starts with `#` (users keep notes inside `cmd`)."""
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith("#"))


def split_command(text: str) -> list[str]:
    """Comment lines dropped, trailing-backslash lines joined, then split shell-style (POSIX).

    Raises ValueError on an unbalanced quote.
    """
    lines = []
    for line in strip_comment_lines(text).split("\n"):
        trimmed = line.strip()
        # shlex would keep the newline after a backslash as a literal character.
        lines.append(trimmed[:-1] + " " if trimmed.endswith("\\") else line)
    return shlex.split("\n".join(lines), comments=False, posix=True)
