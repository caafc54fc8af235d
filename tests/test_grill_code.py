"""The code suite: extraction rules, the 18 tasks proving themselves, scoring in the sandbox, asking a scripted model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from procs import Sim, free_port

from swaplab.client import OpenAIClient, RequestResult
from swaplab.grill.code import (
    CodeTask,
    ask_code,
    code_tasks,
    score_code,
    selfcheck_code,
)
from swaplab.grill.extract import Answer, last_code_block, split_answer
from swaplab.grill.outcome import ERROR, FAIL, PASS, TRUNCATED, Sampling
from swaplab.grill.sandbox import Limits


def answer_of(text: str = "", reasoning: str = "", finish_reason: str = "stop") -> Answer:
    return split_answer(RequestResult(sent_at=0.0, text=text, reasoning=reasoning, finish_reason=finish_reason))


def fenced(code: str, tag: str = "python") -> str:
    return f"Here you go:\n\n```{tag}\n{code}```\n"


def task_named(name: str) -> CodeTask:
    return next(task for task in code_tasks() if task.name == name)


# -- extraction -------------------------------------------------------------------------


def test_reasoning_content_is_kept_apart():
    answer = answer_of(text="The answer is 4.", reasoning="2 + 2 = 4, surely")
    assert answer == Answer(text="The answer is 4.", thinking="2 + 2 = 4, surely", truncated=False)


def test_inline_think_is_stripped():
    answer = answer_of(text="<think>\nlet me see\n</think>\n\nThe answer is 4.")
    assert answer.text == "The answer is 4." and answer.thinking == "let me see" and not answer.truncated


def test_several_thinking_blocks_strip_through_the_last_marker():
    text = "<think>first</think>draft answer<think>second thoughts</think>final answer"
    answer = answer_of(text=text)
    assert answer.text == "final answer"
    assert "first" in answer.thinking and "second thoughts" in answer.thinking and not answer.truncated


def test_a_template_opened_thought_has_only_its_close():
    # Qwen3's chat template ends the prompt with <think>: the output holds only the close.
    answer = answer_of(text="reasoning here</think>answer")
    assert answer.text == "answer" and answer.thinking == "reasoning here"


@pytest.mark.parametrize(
    ("opener", "closer"),
    [("<thinking>", "</thinking>"), ("[THINK]", "[/THINK]"), ("◁think▷", "◁/think▷"), ("<|START_THINKING|>", "<|END_THINKING|>")],
)
def test_other_common_markers(opener, closer):
    answer = answer_of(text=f"{opener}hmm{closer}done")
    assert answer.text == "done" and answer.thinking == "hmm"


def test_harmony_channels():
    text = "<|channel|>analysis<|message|>think think<|end|><|start|>assistant<|channel|>final<|message|>Result<|return|>"
    answer = answer_of(text=text)
    assert answer.text == "Result" and not answer.truncated


def test_unterminated_thought_is_truncated():
    answer = answer_of(text="<think>still going and going", finish_reason="length")
    assert answer.truncated and answer.text == "" and "still going" in answer.thinking


def test_a_thought_reopened_after_an_answer_is_truncated():
    answer = answer_of(text="<think>a</think>partial<think>more and more")
    assert answer.truncated and answer.text == "partial"


def test_separated_reasoning_cut_by_the_budget_is_truncated():
    assert answer_of(text="", reasoning="thinking...", finish_reason="length").truncated
    # Reasoning that ended, then an answer cut short, is an ordinary (probably failing) answer.
    assert not answer_of(text="def f(", reasoning="done thinking", finish_reason="length").truncated
    assert not answer_of(text="", reasoning="thought", finish_reason="stop").truncated


def test_last_fenced_block_wins():
    text = "First:\n```python\nx = 1\n```\nBetter:\n```python\nx = 2\n```\nDone."
    assert last_code_block(text) == "x = 2\n"


def test_bare_and_tilde_fences_and_aliases():
    assert last_code_block("```\nbare = True\n```") == "bare = True\n"
    assert last_code_block("~~~python\ntilde = True\n~~~") == "tilde = True\n"
    assert last_code_block("```py\nshort = True\n```") == "short = True\n"
    assert last_code_block("```Python3 title='x'\nupper = True\n```") == "upper = True\n"


def test_blocks_of_other_languages_are_ignored():
    text = "```python\ncode = 1\n```\nRun it with:\n```bash\npython x.py\n```\n"
    assert last_code_block(text) == "code = 1\n"
    assert last_code_block("```json\n{}\n```") is None


def test_no_block_is_none():
    assert last_code_block("def f():\n    return 1\n") is None
    assert last_code_block("") is None


def test_a_longer_fence_holds_a_shorter_one():
    text = "````python\ns = '''\n```\ninner\n```\n'''\n````\n"
    assert last_code_block(text) == "s = '''\n```\ninner\n```\n'''\n"


def test_indented_fence_is_dedented():
    text = "1. Do this:\n   ```python\n   def f():\n       return 1\n   ```\n"
    assert last_code_block(text) == "def f():\n    return 1\n"


def test_an_unclosed_fence_runs_to_the_end():
    assert last_code_block("```python\nx = 1\ny = 2") == "x = 1\ny = 2\n"


def test_code_inside_thinking_does_not_count():
    answer = answer_of(text="<think>```python\nwrong = 1\n```</think>No code, sorry.")
    assert last_code_block(answer.text) is None


# -- the tasks --------------------------------------------------------------------------


def test_eighteen_tasks_in_three_rounds():
    tasks = code_tasks()
    assert [task.round for task in tasks] == ["r1"] * 8 + ["r2"] * 5 + ["r3"] * 5
    names = [task.name for task in tasks]
    assert len(set(names)) == 18
    assert {"weighted_interval_scheduling", "text_justify"} <= set(names)
    for task in tasks:
        assert re.search(rf"(def|class) {task.entry_point}\b", task.prompt), task.name
        assert "```python fenced block" in task.prompt
        assert f"from solution import {task.entry_point}" in task.tests
        assert task.suite == "code"


def test_selfcheck_every_reference_passes_and_every_wrong_answer_fails():
    checks = selfcheck_code()
    assert [check.name for check in checks] == [task.name for task in code_tasks()]
    failed = [check for check in checks if not (check.reference_ok and check.wrong_fails)]
    assert not failed, failed
    for check in checks:
        assert check.detail.startswith("reference: ") and "tests passed" in check.detail
        assert "wrong: " in check.detail and "PASSED" not in check.detail


# -- scoring ----------------------------------------------------------------------------


def test_score_a_passing_answer(tmp_path):
    task = task_named("text_justify")
    outcome = score_code(task, answer_of(text=fenced(task.reference), reasoning="easy"), workdir_root=tmp_path)
    assert outcome.status == PASS, outcome.detail
    assert (outcome.suite, outcome.round, outcome.task) == ("code", "r2", "text_justify")
    assert outcome.extra["tests_passed"] == outcome.extra["tests_total"] == 9
    assert outcome.transcript[-1]["role"] == "sandbox" and "passed=9 total=9" in outcome.transcript[-1]["content"]
    assert list(tmp_path.iterdir()) == []  # the scoring directory is gone


def test_score_a_near_miss_names_the_first_failure():
    task = task_named("weighted_interval_scheduling")
    outcome = score_code(task, answer_of(text=fenced(task.wrong)))
    assert outcome.status == FAIL
    assert outcome.detail.startswith("test_classic_example: assert weighted_interval_scheduling(jobs) == 250")
    assert outcome.extra["tests_passed"] < outcome.extra["tests_total"]


def test_score_without_a_code_block():
    outcome = score_code(task_named("flatten"), answer_of(text="Just flatten it recursively."))
    assert outcome.status == FAIL and outcome.detail == "no ```python fenced block in the answer"


def test_score_truncated_thinking():
    outcome = score_code(task_named("flatten"), answer_of(text="<think>so the lists...", finish_reason="length"))
    assert outcome.status == TRUNCATED and not outcome.passed


def test_score_code_that_does_not_compile_or_lacks_the_entry_point():
    task = task_named("chunk_list")
    broken = score_code(task, answer_of(text=fenced("def chunk_list(items, size)\n    return []\n")))
    assert broken.status == FAIL and broken.detail.startswith("import: SyntaxError")
    renamed = score_code(task, answer_of(text=fenced(task.reference.replace("def chunk_list", "def chunks"))))
    assert renamed.status == FAIL and renamed.detail == "entry point: the code defines no chunk_list"


def test_a_candidate_exiting_early_with_success_does_not_pass():
    task = task_named("chunk_list")
    for trick in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"):
        outcome = score_code(task, answer_of(text=fenced(task.reference + trick)))
        assert outcome.status == FAIL, trick


ATTACKS = {
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "infinite loop": "while True:\n    pass\n",
    "10 GB allocation": "hoard = bytearray(10 * 1024 ** 3)\n",
    "home directory": f"open({str(Path.home() / 'swaplab-grill-escape.txt')!r}, 'w').write('x')\n",
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=3).sendall(b'x')\n",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_hostile_answer_fails_and_the_next_one_still_passes(attack):
    task = task_named("chunk_list")
    # The attack runs when the tests import the solution; the function itself is right.
    hostile = f"{task.reference}\n{ATTACKS[attack]}"
    limits = Limits(cpu_seconds=2, wall_seconds=5)
    outcome = score_code(task, answer_of(text=fenced(hostile)), limits=limits)
    assert outcome.status == FAIL, (attack, outcome.detail)
    assert not (Path.home() / "swaplab-grill-escape.txt").exists()
    after = score_code(task, answer_of(text=fenced(task.reference)))
    assert after.status == PASS, after.detail


# -- asking a model ---------------------------------------------------------------------


def scripted_replies(tasks_and_replies: list[tuple[CodeTask, dict]]) -> dict:
    return {
        "rules": [
            {"match": re.escape(f"def {task.entry_point}("), "replies": [reply]} for task, reply in tasks_and_replies
        ]
    }


async def test_ask_code_through_a_scripted_model(tmp_path):
    passing = task_named("run_length_encode")
    near_miss = task_named("roman_to_int")
    thinking_forever = task_named("merge_intervals")
    inline = task_named("caesar_cipher")
    script = scripted_replies([
        (passing, {"reasoning": "Runs: count them.", "content": fenced(passing.reference)}),
        (near_miss, {"content": fenced(near_miss.wrong)}),
        (thinking_forever, {"content": "<think>sort, then merge, then", "finish_reason": "length"}),
        (inline, {"content": f"<think>maketrans</think>{fenced(inline.reference, tag='')}"}),
    ])
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script))
    sim = Sim(tmp_path, "--script", str(script_path))
    try:
        async with OpenAIClient(sim.url) as client:
            sampling = Sampling(temperature=0.0, max_tokens=512)
            outcomes = {task.name: await ask_code(client, "sim-model", task, sampling) for task in (passing, near_miss, thinking_forever, inline)}
    finally:
        sim.close()
    assert outcomes["run_length_encode"].status == PASS, outcomes["run_length_encode"].detail
    assert outcomes["roman_to_int"].status == FAIL
    assert outcomes["roman_to_int"].detail.startswith("test_subtractive_tens_and_hundreds")
    assert outcomes["merge_intervals"].status == TRUNCATED
    assert outcomes["caesar_cipher"].status == PASS, outcomes["caesar_cipher"].detail

    first = outcomes["run_length_encode"]
    assert first.transcript[0] == {"role": "user", "content": passing.prompt}
    assert first.transcript[1]["role"] == "assistant" and first.transcript[1]["reasoning"] == "Runs: count them."
    assert first.transcript[2]["role"] == "sandbox"
    assert first.steps == 1 and len(first.requests) == 1 and first.requests[0].streamed
    assert first.output_tokens > 0  # the sim counts words


async def test_ask_code_when_the_server_is_gone():
    async with OpenAIClient(f"http://127.0.0.1:{free_port()}") as client:
        outcome = await ask_code(client, "m", task_named("flatten"), Sampling())
    assert outcome.status == ERROR and outcome.detail
    assert outcome.transcript[0]["role"] == "user" and len(outcome.requests) == 1
