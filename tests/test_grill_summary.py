"""The grill's figures from task outcomes: pure functions, checked against the seed's own numbers."""

from __future__ import annotations

import pytest

from swaplab.grill.outcome import FAIL, INCONCLUSIVE, LOOPED, PASS, TRUNCATED, TaskOutcome
from swaplab.grill.summary import headline, needle_grid, out_of, per_rep_scores, summarize
from swaplab.results.stats import compare


def outcome(round_: str, task: str, status: str = PASS, **fields) -> TaskOutcome:
    suite = {"r4": "agent", "R5": "agent", "needle": "needle", "humaneval": "humaneval"}.get(round_, "code")
    return TaskOutcome(suite=suite, round=round_, task=task, status=status, **fields)


def seed_rep(code_failures: int, r5_complete: int) -> list[TaskOutcome]:
    """One repetition of the 23 scored tasks (18 code, 5 r4) and the 6 R5 ones."""
    rounds = ["r1"] * 8 + ["r2"] * 5 + ["r3"] * 5
    code = [outcome(name, f"{name}-{index}", FAIL if index < code_failures else PASS) for index, name in enumerate(rounds)]
    agent = [outcome("r4", f"r4-{index}", steps=2, output_tokens=324) for index in range(5)]
    long = [outcome("R5", f"R5-{index}", PASS if index < r5_complete else LOOPED) for index in range(6)]
    return code + agent + long


def test_the_seeds_n3_run_summarises_as_the_catalogue_reads_it():
    reps = {1: seed_rep(4, 6), 2: seed_rep(2, 6), 3: seed_rep(3, 5)}
    summary = summarize(
        [(rep, task) for rep, tasks in reps.items() for task in tasks], suites=["code", "agent"], reps=3, log="/srv/x"
    )
    assert summary["score"] == {"mean": 20.0, "min": 19.0, "max": 21.0, "n": 3}
    assert summary["total"] == 23
    assert [round_["round"] for round_ in summary["rounds"]] == ["r1", "r2", "r3", "r4", "R5"]
    assert summary["rounds"][0] == {"round": "r1", "score": {"mean": 5.0, "min": 4.0, "max": 6.0, "n": 3}, "total": 8}
    assert summary["tok_per_step"]["mean"] == 162.0
    assert summary["r5"]["total"] == 6
    assert summary["r5"]["complete"]["min"] == 5 and summary["r5"]["looped"]["max"] == 1
    assert summary["log"] == "/srv/x"
    assert summary["headline"] == "20.0/23 (19-21), R5 5.7/6, looped 0.3"


def test_a_single_rep_reads_like_the_seeds_n1_numbers():
    summary = summarize([(1, task) for task in seed_rep(3, 6)], suites=["code", "agent"], reps=1)
    assert summary["headline"] == "20/23, R5 6/6"
    assert out_of(summary["rounds"][1]["score"], 5) == "5/5"


def test_truncated_thinking_is_a_failure_counted_apart():
    tasks = [outcome("r1", "a", TRUNCATED), outcome("r1", "b", PASS)]
    summary = summarize([(1, task) for task in tasks], suites=["code"], reps=1)
    assert summary["score"]["mean"] == 1
    assert summary["truncated"]["mean"] == 1


def test_a_needle_cell_shows_its_worst_result_over_reps():
    cells = [
        outcome("needle", "a", PASS, extra={"depth": 0.5, "context_tokens": 1024}),
        outcome("needle", "a", FAIL, extra={"depth": 0.5, "context_tokens": 1024}),
        outcome("needle", "b", PASS, extra={"depth": 0.1, "context_tokens": 1024}),
        outcome("needle", "c", INCONCLUSIVE, extra={"depth": 0.9, "context_tokens": 1024}),
        outcome("needle", "c", PASS, extra={"depth": 0.9, "context_tokens": 1024}),
    ]
    grid = needle_grid(cells)
    assert [(cell["depth"], cell["result"], cell["passed"], cell["n"]) for cell in grid] == [
        (0.1, "pass", 1, 1), (0.5, "fail", 1, 2), (0.9, "inconclusive", 1, 2),
    ]
    assert headline({"needle": grid}) == "needle 1/3"


def test_per_rep_scores_read_back_from_stored_rows():
    rows = [
        {"rep": 1, "warmup": False, "data": {"round": "r1", "status": "pass"}},
        {"rep": 1, "warmup": False, "data": {"round": "r2", "status": "fail"}},
        {"rep": 2, "warmup": False, "data": {"round": "r1", "status": "pass"}},
        {"rep": 2, "warmup": False, "data": {"round": "r2", "status": "pass"}},
        {"rep": 2, "warmup": False, "data": {"round": "R5", "status": "pass"}},
    ]
    assert per_rep_scores(rows) == {1: 1, 2: 2}
    assert per_rep_scores(rows, ["R5"]) == {2: 1}


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        ([19, 21, 20], [18, 20, 21], "indistinguishable"),  # the seed's SGLang vs vLLM A/B
        ([22], [20], "indistinguishable"),  # the seed's n=1 pass that reversed at n=3
        ([20, 20, 21], [14, 15, 14], "different"),
    ],
)
def test_score_comparisons_use_the_bench_statistics(a, b, verdict):
    assert compare(a, b).verdict == verdict
