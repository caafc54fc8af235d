"""`swaplab grill run` end to end against `swaplab sim --script`: every scoring path, deterministically.

The scripts are written from the suite's own references (a "perfect model"), or to fail
in one precise way: a loop, a thought cut off by the budget, a needle answered in one cell.
"""

from __future__ import annotations

import json
import re

import pytest
from procs import free_port, run_swaplab
from scripts import agent_rule, code_rule, fenced

from swaplab.grill.agent import agent_tasks
from swaplab.grill.code import code_tasks
from swaplab.grill.needle import needle_cells
from swaplab.results.runs import get_run, list_runs


def perfect_script() -> dict:
    rules = [code_rule(task, {"content": fenced(task.reference)}) for task in code_tasks()]
    rules += [agent_rule(task) for task in agent_tasks()]
    return {"rules": rules, "default": {"content": "I don't know."}}


@pytest.fixture
def grill(tmp_path, scripted):
    """Runs `swaplab grill run` against a sim replaying `script`; returns (the finished command, the stored run)."""
    db = tmp_path / "grill.db"

    def run(script: dict, *args: str):
        sim = scripted(script)
        report = tmp_path / "report.json"
        done = run_swaplab(
            "grill", "run", "--url", sim.url, "--db", str(db), "--json", str(report),
            "--transcripts", str(tmp_path / "transcripts"), *args,
        )
        run_row = get_run(db, json.loads(report.read_text())["run_id"]) if done.returncode in (0, 1) else None
        return done, run_row

    run.db = db
    return run


def rounds_of(run: dict) -> dict[str, tuple[float, int]]:
    return {round_["round"]: (round_["score"]["mean"], round_["total"]) for round_ in run["summary"]["rounds"]}


def statuses(run: dict) -> dict[str, str]:
    return {request["level"]: request["data"]["status"] for request in run["requests"]}


def test_a_perfect_scripted_model_scores_every_code_task_and_completes_every_agent_task(grill):
    done, run = grill(perfect_script(), "--suite", "code,agent", "--reps", "1")
    assert done.returncode == 0, done.stderr
    assert rounds_of(run) == {"r1": (8, 8), "r2": (5, 5), "r3": (5, 5), "r4": (5, 5), "R5": (6, 6)}
    summary = run["summary"]
    assert summary["score"]["mean"] == summary["total"] == 23
    assert summary["r5"]["complete"]["mean"] == 6 and summary["r5"]["looped"]["mean"] == 0
    assert summary["tok_per_step"]["mean"] > 0
    assert summary["isolation"]
    assert summary["headline"] == "23/23, R5 6/6"
    # Every attempt has its transcript on disk, named in its row.
    for request in run["requests"]:
        transcript = json.loads((grill_log(run) / request["data"]["transcript"]).read_text())
        assert transcript["status"] == "pass" and transcript["transcript"], request["level"]
    assert "23/23" in done.stdout


def grill_log(run):
    from pathlib import Path

    return Path(run["summary"]["log"])


def test_a_model_repeating_one_call_is_looped_and_the_run_goes_on(grill):
    long_task = next(task for task in agent_tasks() if task.round == "R5")
    short_task = next(task for task in agent_tasks() if task.round == "r4")
    repeated = [long_task.reference[0]] * 10
    script = {"rules": [agent_rule(long_task, repeated), agent_rule(short_task)]}
    done, run = grill(script, "--suite", "agent", "--reps", "1", "--tasks", f"{long_task.name},{short_task.name}")
    assert done.returncode == 0, done.stderr
    assert statuses(run) == {long_task.name: "looped", short_task.name: "pass"}
    assert run["summary"]["r5"]["looped"]["mean"] == 1 and run["summary"]["r5"]["complete"]["mean"] == 0
    assert "looped" in run["summary"]["headline"]


def test_truncated_thinking_fails_and_is_counted_as_truncated(grill):
    first, second, third = code_tasks()[:3]
    script = {"rules": [
        # The server separates the reasoning, and the budget ran out inside it.
        code_rule(first, {"reasoning": "Let me think about this step by step", "finish_reason": "length"}),
        # The thought is inline, opened and never closed.
        code_rule(second, {"content": "<think>\nFirst I consider the edge cases", "finish_reason": "length"}),
        # A closed thought, then the answer: scored on the answer.
        code_rule(third, {"content": f"<think>easy</think>\n{fenced(third.reference)}"}),
    ]}
    done, run = grill(script, "--suite", "code", "--reps", "1", "--tasks", f"{first.name},{second.name},{third.name}")
    assert done.returncode == 0, done.stderr
    assert statuses(run) == {first.name: "truncated", second.name: "truncated", third.name: "pass"}
    assert run["summary"]["truncated"]["mean"] == 2
    assert run["summary"]["score"]["mean"] == 1


def test_a_needle_answered_only_at_depth_half_scores_exactly_that_cell(grill):
    depths, lengths = [0.1, 0.5, 0.9], [400]
    cells = needle_cells(depths, lengths)
    middle = next(cell for cell in cells if cell.depth == 0.5)
    script = {
        "rules": [{"match": re.escape(middle.fact), "replies": [{"content": f"The answer is {middle.fact}."}]}],
        "default": {"content": "I could not find it."},
    }
    done, run = grill(
        script, "--suite", "needle", "--reps", "1", "--needle-depths", "0.1,0.5,0.9", "--needle-lengths", "400",
        "--max-tokens", "64",
    )
    assert done.returncode == 0, done.stderr
    grid = {cell["depth"]: cell["result"] for cell in run["summary"]["needle"]}
    assert grid == {0.1: "fail", 0.5: "pass", 0.9: "fail"}


def test_compare_separates_a_good_model_from_a_broken_one_and_not_a_model_from_itself(grill):
    tasks = code_tasks()[:4]
    names = ",".join(task.name for task in tasks)
    good = {"rules": [code_rule(task, {"content": fenced(task.reference)}) for task in tasks]}
    bad = {"rules": [code_rule(task, {"content": fenced(task.wrong)}) for task in tasks]}
    runs = []
    for script in (good, good, bad):
        done, run = grill(script, "--suite", "code", "--reps", "2", "--tasks", names)
        assert done.returncode == 0, done.stderr
        runs.append(run["id"])
    same = run_swaplab("grill", "compare", str(runs[0]), str(runs[1]), "--db", str(grill.db))
    assert same.returncode == 0, same.stderr
    assert "indistinguishable" in same.stdout and "different" not in same.stdout
    apart = run_swaplab("grill", "compare", str(runs[0]), str(runs[2]), "--db", str(grill.db))
    assert apart.returncode == 0, apart.stderr
    assert "B - A = -4.00" in apart.stdout and "different" in apart.stdout


@pytest.mark.parametrize("case", ["unreachable", "unknown-task", "unknown-model"])
def test_bad_input_is_one_line_exit_2_and_nothing_stored(tmp_path, scripted, case):
    db = tmp_path / "grill.db"
    sim = scripted({"rules": []})
    url = f"http://127.0.0.1:{free_port()}" if case == "unreachable" else sim.url
    args = {"unknown-task": ["--tasks", "no_such_task"], "unknown-model": ["--model", "nope"]}.get(case, [])
    done = run_swaplab("grill", "run", "--url", url, "--db", str(db), "--suite", "code", "--reps", "1", *args)
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swaplab: "), done.stderr
    expected = {"unreachable": "cannot reach", "unknown-task": "no_such_task", "unknown-model": "nope"}[case]
    assert expected in lines[0]
    assert not db.exists() or list_runs(db) == []


def test_selfcheck_proves_every_suite():
    done = run_swaplab("grill", "selfcheck")
    assert done.returncode == 0, done.stdout + done.stderr
    for suite, count in (("code", 18), ("agent", 11), ("needle", 3), ("humaneval", 164)):
        assert re.search(rf"{suite}\s+│\s+{count}\s+│\s+{count}/{count}", done.stdout), done.stdout
    assert "Every task proved itself." in done.stdout


def test_humaneval_runs_through_the_same_runner_and_is_its_own_round(grill):
    from swaplab.grill.humaneval import humaneval_tasks

    first, second = humaneval_tasks()[:2]
    script = {"rules": [code_rule(first, {"content": fenced(first.reference)}), code_rule(second, {"content": "No idea."})]}
    done, run = grill(script, "--suite", "humaneval", "--reps", "1", "--tasks", f"{first.name},{second.name}")
    assert done.returncode == 0, done.stderr
    assert statuses(run) == {first.name: "pass", second.name: "fail"}
    assert rounds_of(run) == {"humaneval": (1, 2)}
    assert run["summary"]["headline"] == "1/2"
