"""The rich Console commands print their tables with: the terminal's width on a terminal,
the content's own when the output goes to a pipe or a file.

Rich takes 80 columns (or `$COLUMNS`) when stdout is no terminal, and squeezes a table's
columns into it, folding cells and cropping lines: `swaplab activity | head` cut figures.
Piped, nothing reads the width, so lines are as long as what they hold.
"""

from __future__ import annotations

import sys
from typing import IO

from rich.console import Console

PIPED_WIDTH = 100_000
"""Wide enough for any table (rich sizes a table to its content within this), no wider."""


def command_console(file: IO[str] | None = None, *, stderr: bool = False) -> Console:
    """A Console on stdout (or stderr) that folds and crops to the terminal only when there is one."""
    console = Console(file=file, stderr=stderr)
    if console.is_terminal:
        return console
    return Console(file=file, stderr=stderr, width=PIPED_WIDTH)
