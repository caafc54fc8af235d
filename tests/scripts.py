"""Scripts for `swaplab sim --script` written from the grill's own tasks: what the grill tests share."""

from __future__ import annotations

import json
import re
from pathlib import Path

from procs import Sim


def prompt_pattern(prompt: str) -> str:
    """A regex that finds this task's prompt (and no other) in a request's messages."""
    return re.escape(prompt.strip()[:160])


def fenced(code: str) -> str:
    """An answer carrying `code` in a fenced block, as a model would write it."""
    return f"Here it is:\n\n```python\n{code.rstrip()}\n```\n"


def code_rule(task, reply: dict) -> dict:
    """A rule answering a code task's prompt with `reply`."""
    return {"match": prompt_pattern(task.prompt), "replies": [reply]}


def agent_rule(task, calls=None, *, then: dict | None = None) -> dict:
    """A rule playing `calls` (default: the task's reference) one per turn, then answering."""
    calls = task.reference if calls is None else calls
    replies = [{"tool_calls": [{"name": call.name, "arguments": dict(call.arguments)}]} for call in calls]
    return {"match": prompt_pattern(task.prompt), "replies": replies or [then], "then": then or {"content": "Done."}}


class ScriptedSims:
    """Starts sims replaying scripts (plain data) in a folder; closes them all at the end."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.started: list[Sim] = []

    def __call__(self, script: dict) -> Sim:
        path = self.folder / f"script-{len(self.started)}.json"
        path.write_text(json.dumps(script))
        sim = Sim(self.folder, "--script", str(path), model="scripted")
        self.started.append(sim)
        return sim

    def close(self) -> None:
        for sim in self.started:
            sim.close()
