"""`swaplab grill selfcheck`: the suite proves itself before it grades a model.

Per suite: every code task's reference passes its hidden tests and its known-wrong
answer fails them; HumanEval's canonical solutions pass and empty bodies fail; every
agent task's reference trajectory solves it and an empty trajectory does not; every
needle cell states its fact exactly once, at its depth, and the scorer tells it from
another cell's. All of it through the same sandbox and scorers a model's answers meet.
"""

from __future__ import annotations

from dataclasses import dataclass

NEEDLE_DEPTHS = (0.1, 0.5, 0.9)
NEEDLE_SENTENCES = 200


@dataclass(frozen=True)
class Check:
    """One task's proof, whatever its suite."""

    suite: str
    name: str
    ok: bool
    detail: str


def check_suite(suite: str) -> list[Check]:
    """The proofs of one suite."""
    if suite == "code":
        from swaplab.grill.code import selfcheck_code

        return [Check("code", item.name, item.reference_ok and item.wrong_fails, item.detail) for item in selfcheck_code()]
    if suite == "humaneval":
        from swaplab.grill.humaneval import selfcheck_humaneval

        return [
            Check("humaneval", item.name, item.reference_ok and item.wrong_fails, item.detail)
            for item in selfcheck_humaneval()
        ]
    if suite == "agent":
        from swaplab.grill.agent import selfcheck_agent

        return [Check("agent", item.name, item.ok, item.detail) for item in selfcheck_agent()]
    if suite == "needle":
        return check_needle()
    raise ValueError(f"unknown suite {suite!r}")


def check_needle() -> list[Check]:
    """Each cell's haystack holds its fact once, near its depth, and only its own fact scores."""
    from itertools import islice

    from swaplab.grill.needle import compose, filler_sentences, found, needle_cells

    filler = list(islice(filler_sentences(), NEEDLE_SENTENCES))
    cells = needle_cells(NEEDLE_DEPTHS, [1024])
    checks = []
    for cell, other in zip(cells, [*cells[1:], cells[0]], strict=True):
        prompt = compose(cell, filler)
        haystack_start = prompt.index(filler[0])
        haystack_end = prompt.rindex(filler[-1]) + len(filler[-1])
        at = (prompt.index(cell.sentence) - haystack_start) / (haystack_end - haystack_start)
        problems = []
        if prompt.count(cell.fact) != 1:
            problems.append(f"the fact appears {prompt.count(cell.fact)} times")
        if abs(at - cell.depth) > 0.05:
            problems.append(f"the fact sits at depth {at:.2f}")
        if not found(cell.fact, f"The code is {cell.fact.upper().replace('-', ' - ')}."):
            problems.append("the scorer misses the right answer")
        if found(cell.fact, f"The code is {other.fact}.") or found(cell.fact, prompt.replace(cell.sentence, "")):
            problems.append("the scorer accepts a wrong answer")
        detail = "; ".join(problems) or f"fact {cell.fact} once at depth {at:.2f}; right answer found, others refused"
        checks.append(Check("needle", cell.name, not problems, detail))
    return checks
