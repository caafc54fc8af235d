"""What grading one task once produced, and how the model was asked: shared by every suite."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swaplab.client import RequestResult

# A task's status. Only "pass" scores; "truncated" is a failure counted apart (the answer
# budget ran out inside the model's thinking); "looped" is an agent task stopped for
# repeating itself; "inconclusive" is a needle cell the model never answered in its budget.
PASS = "pass"
FAIL = "fail"
TRUNCATED = "truncated"
LOOPED = "looped"
INCONCLUSIVE = "inconclusive"
ERROR = "error"  # the request itself failed (HTTP error, connection lost)
STATUSES = (PASS, FAIL, TRUNCATED, LOOPED, INCONCLUSIVE, ERROR)


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the model is asked: recorded with every run."""

    temperature: float = 0.2
    max_tokens: int = 2048
    seed: int | None = None

    def parameters(self) -> dict[str, Any]:
        """The request-body fields these settings become."""
        body: dict[str, Any] = {"temperature": self.temperature}
        if self.seed is not None:
            body["seed"] = self.seed
        return body


@dataclass(slots=True)
class TaskOutcome:
    """One attempt at one task: its verdict, why, and everything needed to audit it."""

    suite: str  # "code" | "agent" | "needle" | "humaneval"
    round: str  # "r1", "r2", "r3", "r4", "R5", "needle", "humaneval"
    task: str  # the task's name, e.g. "text_justify"
    status: str  # one of STATUSES
    detail: str = ""  # one line: why it failed, what the tests said
    # The conversation as sent and answered, JSON-ready: messages, tool results, final answer.
    transcript: list[dict[str, Any]] = field(default_factory=list)
    requests: list[RequestResult] = field(default_factory=list)
    steps: int = 0  # model turns (agent: tool-calling steps)
    output_tokens: int = 0  # the server's completion tokens over all requests
    wall_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # suite-specific: needle depth/length, isolation, ...

    @property
    def passed(self) -> bool:
        return self.status == PASS
