"""A download's progress bar (rich) on stdout, for a terminal and for a pipe alike.

On a terminal the bar redraws in place. Into a pipe (a backend's output, which the router
shows in `/logs` and on the page line by line) a redraw would be one endless line, so
the bar is printed as a new line at each tenth of the file instead.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

LINES_PER_FILE = 10


class TransferDisplay:
    """`update(label, done, total)` as a models.Progress; a context manager around the downloads."""

    def __init__(self, console: Console | None = None):
        if console is None:
            # A pipe has no width of its own: wide enough that a line is one bar, never wrapped.
            console = Console(file=sys.stdout) if sys.stdout.isatty() else Console(file=sys.stdout, width=110)
        self._console = console
        self._live = console.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            console=self._console, auto_refresh=self._live, transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._printed: dict[str, int] = {}

    def __enter__(self) -> TransferDisplay:
        if self._live:
            self._progress.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._live:
            self._progress.stop()

    def update(self, label: str, done: int, total: int | None) -> None:
        task = self._tasks.get(label)
        if task is None:
            task = self._tasks[label] = self._progress.add_task(f"fetching {label}", total=total)
        self._progress.update(task, completed=done, total=total)
        if self._live:
            return
        # Piped: a line at the first bytes and at each tenth (the last at the end); of a
        # file of unknown size, one each 16 MiB.
        step = done * LINES_PER_FILE // total if total else done // (16 * 1024 * 1024)
        if self._printed.get(label, -1) < step:
            self._printed[label] = step
            task_object = next(t for t in self._progress.tasks if t.id == task)
            self._console.print(self._progress.make_tasks_table([task_object]))
            self._console.file.flush()
