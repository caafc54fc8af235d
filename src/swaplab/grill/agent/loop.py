"""When an agent run is LOOPED: a pure judgement over the calls it made and what they changed.

Two rules, whichever fires first:

- **Repeat**: the same call (tool and arguments, compared canonically) made
  `REPEAT_LIMIT` (3) times with no change to the workspace in between. A change resets
  the count, so "run the tests, fix, run the tests, fix, run the tests" is work, not a
  loop; three identical reads or test runs of an unchanged workspace are a loop.
- **No progress**: `IDLE_TURNS` (6) model turns in a row in which no call was new (never
  made before in the run) and the workspace did not change.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

REPEAT_LIMIT = 3
IDLE_TURNS = 6


@dataclass
class LoopGuard:
    """Fed every call and every turn's end; says why the run is LOOPED once it is."""

    repeat_limit: int = REPEAT_LIMIT
    idle_turns: int = IDLE_TURNS
    reason: str | None = None  # set once, when a rule fires
    _since_change: Counter[str] = field(default_factory=Counter)
    _seen: set[str] = field(default_factory=set)
    _idle: int = 0
    _turn_progress: bool = False

    def call(self, key: str, changed_workspace: bool) -> str | None:
        """One call made (its `key`) and whether it changed the workspace; the reason when that made a loop."""
        if changed_workspace:
            self._since_change.clear()
            self._turn_progress = True
        if key not in self._seen:
            self._seen.add(key)
            self._turn_progress = True
        self._since_change[key] += 1
        if self.reason is None and self._since_change[key] >= self.repeat_limit:
            self.reason = f"the same call {self._since_change[key]} times with no change to the workspace in between: {key}"
        return self.reason

    def end_turn(self) -> str | None:
        """The model's turn is over (all its calls fed); the reason when it was one idle turn too many."""
        self._idle = 0 if self._turn_progress else self._idle + 1
        self._turn_progress = False
        if self.reason is None and self._idle >= self.idle_turns:
            self.reason = f"{self._idle} turns in a row without a new call or a change to the workspace"
        return self.reason
