"""The code suite: 18 single-shot Python tasks in three rounds, scored by hidden tests in the sandbox.

A task is a folder of data under `tasks/code/<name>/`: `task.toml` (name, round, entry
point, order in its round), `prompt.md` (what the model is asked), `tests.py` (the
hidden tests: `test_*` functions that import the entry point from `solution`),
`reference.py` (an answer that passes) and `wrong.py` (a plausible near miss that must
fail). The same scorer serves HumanEval (`swaplab.grill.humaneval`): a candidate is
written to `solution.py` (after the task's preamble), the tests to `tests.py`, and a
fixed runner calls every test, printing each failure and one result line.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from swaplab.client import OpenAIClient, RequestResult
from swaplab.grill.extract import Answer, last_code_block, split_answer
from swaplab.grill.outcome import ERROR, FAIL, PASS, TRUNCATED, Sampling, TaskOutcome
from swaplab.grill.sandbox import Limits, SandboxResult, run_python

ROUNDS = ("r1", "r2", "r3")
ANSWER_FORMAT = (
    "\n\nAnswer with the complete code in a single ```python fenced block. "
    "Use only the Python standard library."
)
TEST_LIMITS = Limits(cpu_seconds=10, wall_seconds=30)
SOLUTION_FILE = "solution.py"
TESTS_FILE = "tests.py"

# Runs in the sandbox next to solution.py and tests.py; argv: the result line's nonce, the entry point.
RUNNER = r'''
import sys
import traceback

nonce, entry_point = sys.argv[1], sys.argv[2]


def one_line(text):
    return str(text).strip().replace("\n", " | ")[:300]


def finish(passed, total):
    print("RESULT %s passed=%d total=%d" % (nonce, passed, total), flush=True)
    sys.exit(0 if total and passed == total else 1)


try:
    import solution
except BaseException as error:  # a syntax error, an exception or sys.exit() at import
    print("FAIL import: %s: %s" % (type(error).__name__, one_line(error)), flush=True)
    finish(0, 0)
if not callable(getattr(solution, entry_point, None)):
    print("FAIL entry point: the code defines no %s" % entry_point, flush=True)
    finish(0, 0)
import tests

cases = [(name, case) for name, case in vars(tests).items() if name.startswith("test_") and callable(case)]
passed = 0
for name, case in cases:
    try:
        case()
    except AssertionError as error:
        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename.endswith("tests.py")]
        where = frames[-1].line if frames else ""
        print("FAIL %s: %s" % (name, one_line(str(error) or where or "assertion failed")), flush=True)
    except BaseException as error:
        print("FAIL %s: %s: %s" % (name, type(error).__name__, one_line(error)), flush=True)
    else:
        passed += 1
finish(passed, len(cases))
'''


@dataclass(frozen=True)
class CodeTask:
    """One single-shot coding task with its hidden tests and the answers that prove them."""

    name: str
    round: str  # "r1" | "r2" | "r3" | "humaneval"
    prompt: str  # the whole user message
    entry_point: str  # the function (or class) the tests call
    tests: str  # tests.py: test_* functions importing from `solution`
    reference: str  # code that passes
    wrong: str  # a near miss that fails
    preamble: str = ""  # code put before the candidate's in solution.py (HumanEval's prompt)

    @property
    def suite(self) -> str:
        return "humaneval" if self.round == "humaneval" else "code"


class SelfCheck(NamedTuple):
    """One task's proof: the reference passes, the known-wrong answer fails."""

    name: str
    reference_ok: bool
    wrong_fails: bool
    detail: str


@dataclass(frozen=True)
class TestRun:
    """What the hidden tests said about one candidate."""

    passed: bool
    detail: str  # the first failure, or why the run was stopped
    tests_passed: int
    tests_total: int
    sandbox: SandboxResult


def code_tasks() -> list[CodeTask]:
    """The 18 tasks: r1 8, r2 5, r3 5, in round order."""
    return list(_load_code_tasks())


@functools.cache
def _load_code_tasks() -> tuple[CodeTask, ...]:
    folder = resources.files("swaplab.grill") / "tasks" / "code"
    tasks: list[tuple[int, int, CodeTask]] = []
    for entry in folder.iterdir():
        if not entry.is_dir() or not (entry / "task.toml").is_file():
            continue
        meta = tomllib.loads((entry / "task.toml").read_text())
        task = CodeTask(
            name=meta["name"],
            round=meta["round"],
            prompt=(entry / "prompt.md").read_text().rstrip() + ANSWER_FORMAT,
            entry_point=meta["entry_point"],
            tests=(entry / "tests.py").read_text(),
            reference=(entry / "reference.py").read_text(),
            wrong=(entry / "wrong.py").read_text(),
        )
        tasks.append((ROUNDS.index(task.round), int(meta["order"]), task))
    return tuple(task for _, _, task in sorted(tasks, key=lambda item: item[:2]))


def run_tests(task: CodeTask, code: str, *, workdir_root: Path | None = None, limits: Limits = TEST_LIMITS) -> TestRun:
    """Run `task`'s hidden tests against `code` in the sandbox."""
    nonce = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="swaplab-grill-", dir=workdir_root) as directory:
        workdir = Path(directory)
        solution = f"{task.preamble}\n\n{code}" if task.preamble else code
        (workdir / SOLUTION_FILE).write_text(solution)
        (workdir / TESTS_FILE).write_text(task.tests)
        result = run_python(RUNNER, workdir=workdir, limits=limits, args=[nonce, task.entry_point])
    return read_test_run(result, nonce)


def read_test_run(result: SandboxResult, nonce: str) -> TestRun:
    """The runner's output into a verdict; only its own result line (with the nonce) can pass."""
    lines = result.stdout.splitlines()
    failures = [line.removeprefix("FAIL ") for line in lines if line.startswith("FAIL ")]
    passed = total = 0
    marker = f"RESULT {nonce} "
    for line in lines:
        if line.startswith(marker):
            fields = dict(part.split("=", 1) for part in line[len(marker):].split())
            passed, total = int(fields["passed"]), int(fields["total"])
    ok = result.ok and total > 0 and passed == total
    if ok:
        detail = f"{passed}/{total} tests passed"
    elif result.stopped is not None:
        detail = f"stopped by the sandbox: {result.stopped}" + (f" (after: {failures[0]})" if failures else "")
    elif failures:
        detail = failures[0]
    else:
        last = (result.stderr.strip() or result.stdout.strip() or f"exit status {result.returncode}").splitlines()[-1]
        detail = f"no test result: {last}"
    return TestRun(ok, detail, passed, total, result)


def score_code(
    task: CodeTask, answer: Answer, *, workdir_root: Path | None = None, limits: Limits = TEST_LIMITS
) -> TaskOutcome:
    """Score one answer: truncated thinking fails as truncated; else the last fenced block against the tests."""
    outcome = TaskOutcome(suite=task.suite, round=task.round, task=task.name, status=FAIL)
    if answer.truncated:
        outcome.status = TRUNCATED
        outcome.detail = "the answer budget ran out inside the model's thinking"
        return outcome
    code = last_code_block(answer.text)
    if code is None:
        outcome.detail = "no ```python fenced block in the answer"
        return outcome
    run = run_tests(task, code, workdir_root=workdir_root, limits=limits)
    outcome.status = PASS if run.passed else FAIL
    outcome.detail = run.detail
    outcome.extra = {"tests_passed": run.tests_passed, "tests_total": run.tests_total, "isolation": run.sandbox.isolation}
    if run.sandbox.stopped:
        outcome.extra["stopped"] = run.sandbox.stopped
    outcome.transcript = [{
        "role": "sandbox",
        "content": run.sandbox.stdout + (f"\n[stderr]\n{run.sandbox.stderr}" if run.sandbox.stderr else ""),
        "returncode": run.sandbox.returncode,
        "stopped": run.sandbox.stopped,
        "isolation": run.sandbox.isolation,
    }]
    return outcome


async def ask_code(client: OpenAIClient, model: str, task: CodeTask, sampling: Sampling) -> TaskOutcome:
    """Ask once (streamed), split off the thinking, score the answer in the sandbox."""
    messages = [{"role": "user", "content": task.prompt}]
    result = await client.chat(model, messages, max_tokens=sampling.max_tokens, **sampling.parameters())
    said = [*messages, {"role": "assistant", "content": result.text, "reasoning": result.reasoning}]
    if not result.ok:
        outcome = TaskOutcome(suite=task.suite, round=task.round, task=task.name, status=ERROR, detail=result.error or "")
    else:
        # The sandbox blocks for seconds: off the event loop, so other requests keep streaming.
        outcome = await asyncio.to_thread(score_code, task, split_answer(result))
    return _with_request(outcome, said, result)


def _with_request(outcome: TaskOutcome, said: list[dict], result: RequestResult) -> TaskOutcome:
    outcome.transcript = [*said, *outcome.transcript]
    outcome.requests = [result]
    outcome.steps = 1
    outcome.output_tokens = result.completion_tokens or 0
    outcome.wall_seconds = max(0.0, result.e2e_ms / 1000)
    return outcome


def selfcheck(tasks: list[CodeTask]) -> list[SelfCheck]:
    """Every task's reference and known-wrong answer through the tests, at most one run per core at once."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        references = list(pool.map(lambda task: run_tests(task, task.reference), tasks))
        wrongs = list(pool.map(lambda task: run_tests(task, task.wrong), tasks))
    checks = []
    for task, reference, wrong in zip(tasks, references, wrongs, strict=True):
        notes = [f"reference: {reference.detail}"]
        notes.append(f"wrong: {wrong.detail}" if not wrong.passed else "wrong: PASSED the tests")
        checks.append(SelfCheck(task.name, reference.passed, not wrong.passed, "; ".join(notes)))
    return checks


def selfcheck_code() -> list[SelfCheck]:
    """The code suite's proof, per task: (name, reference_ok, wrong_fails, detail)."""
    return selfcheck(code_tasks())
