"""Whether a sleep freed the GPU: believed from evidence, never from a 200 alone.

vLLM started without `--enable-sleep-mode` answers 200 to `/sleep` and keeps its memory,
saying so in its own log ("Sleep mode freed 0.00 GiB memory, ..."); SGLang without
`--enable-memory-saver` answers 200 as well. A router that counted either as asleep would
start the next model into a full GPU. The evidence, in order: the engine's own report of
what it freed (its contract's `sleep.reports` with a `freed_gib` figure), else NVML's figure
for the process before and after. Pure: the backend feeds lines and readings in.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass

from swaplab.config.model import ModelConfig
from swaplab.engines import contract

FREED_NOTHING_GIB = 0.01
"""Less than this freed is nothing: vLLM prints two decimals, so its "0.00" is below it."""


@dataclass(frozen=True)
class Freed:
    """What a sleep freed, and who says so."""

    gib: float
    source: str
    """The evidence in words: the engine's line, or NVML's two readings."""


def report_patterns(model: ModelConfig) -> tuple[re.Pattern[str], ...]:
    """The engine's log lines that state what a sleep freed (a `freed_gib` group): of the engine the
    entry's `sleep:` names, whatever its cmd runs (a wrapper script hides it); () for an engine that
    says nothing, or a `sleep: engine: http` entry whose calls are the user's own."""
    if model.sleep is None or model.sleep.engine == "http":
        return ()
    engine = model.sleep.engine
    sleep = contract(engine).sleep
    if sleep is None:
        return ()
    patterns = (report.pattern() for report in sleep.reports)
    return tuple(pattern for pattern in patterns if "freed_gib" in pattern.groupindex)


def engine_report(line: str, patterns: tuple[re.Pattern[str], ...], name: str) -> Freed | None:
    """What `line` says was freed, when it is one of the engine's reports."""
    for pattern in patterns:
        found = pattern.search(line)
        if found is not None:
            return Freed(float(found.group("freed_gib")), f"{name} said: {found.group(0).strip()}")
    return None


def nvml_freed(before: Mapping[int, float] | None, after: Mapping[int, float] | None) -> Freed | None:
    """What NVML saw leave the process's GPUs; None when it could not read both times."""
    if not before:
        return None
    held_after = sum((after or {}).values())
    held_before = sum(before.values())
    return Freed(max(0.0, held_before - held_after),
                 f"NVML: the process held {held_before:.2f} GiB before the sleep and {held_after:.2f} GiB after")


def freed_nothing(freed: Freed | None) -> str | None:
    """Why the sleep is not believed, or None: no evidence (an engine that reports nothing, no NVML)
    leaves the engine's answer to stand."""
    if freed is None or freed.gib >= FREED_NOTHING_GIB:
        return None
    return f"it answered the sleep call but freed nothing ({freed.source})"


class ReportWatch:
    """Armed for one sleep: the first report line the engine prints after the call began."""

    def __init__(self, patterns: tuple[re.Pattern[str], ...], name: str):
        self.patterns = patterns
        self.name = name
        self.freed: Freed | None = None
        self.seen = asyncio.Event()

    def line(self, text: str) -> None:
        if self.freed is None and self.patterns:
            self.freed = engine_report(text, self.patterns, self.name)
            if self.freed is not None:
                self.seen.set()
