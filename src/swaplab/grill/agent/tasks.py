"""The agent suite's 11 tasks: r4 (5 short tool-use tasks) and R5 (6 longer ones).

Each task's files live in `data/<name>/`: `files/` is the starting workspace,
`solution/` what the reference trajectory writes, `hidden/` the tests the check runs
(laid over a copy of the final workspace, so a model that edits the visible tests gains
nothing), `expected/` files whose content must come out right, `mutants/` buggy
versions the model's own tests must catch. A task is judged from the final workspace
only, never from what the model says.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from swaplab.grill.agent.tools import IGNORED_PARTS, ToolCall, Workspace, test_command

DATA = Path(__file__).with_name("data")
# Floats in an expected JSON file match within this (money rounded to cents).
JSON_TOLERANCE = 0.011
FAILURE_LINES = 12  # how much of a failing test run a check's detail keeps

Check = Callable[[Path], tuple[bool, str]]


@dataclass(frozen=True)
class AgentTask:
    """One task: the prompt, the starting workspace, a reference trajectory and how the result is judged."""

    name: str
    round: str  # "r4" | "R5"
    prompt: str
    files: Mapping[str, str]  # the workspace's starting files: relative path -> text
    reference: tuple[ToolCall, ...]  # fixed calls that solve it, whatever the tools answer
    checks: tuple[Check, ...]

    def check(self, workspace: Path) -> tuple[bool, str]:
        """Whether the final workspace solves the task, and why not (the first check that failed)."""
        details = []
        for check in self.checks:
            ok, detail = check(workspace)
            if not ok:
                return False, detail
            details.append(detail)
        return True, "; ".join(details)


# -- checks ------------------------------------------------------------------------


def hidden_tests(task: str) -> Check:
    """The task's hidden tests (and data) laid over a copy of the workspace: every one must pass."""
    hidden = DATA / task / "hidden"
    targets = sorted(path.relative_to(hidden).as_posix() for path in hidden.rglob("test_*.py"))

    def check(workspace: Path) -> tuple[bool, str]:
        return _run_tests_on_copy(workspace, hidden, targets, expect_pass=True)

    return check


def own_tests_pass(*targets: str) -> Check:
    """The workspace's own tests `targets` pass against its own code."""

    def check(workspace: Path) -> tuple[bool, str]:
        return _run_tests_on_copy(workspace, None, list(targets), expect_pass=True)

    return check


def own_tests_catch(task: str, mutant: str, *targets: str) -> Check:
    """The workspace's tests `targets` fail once the buggy `mutants/<mutant>/` files replace the model's code."""
    overlay = DATA / task / "mutants" / mutant

    def check(workspace: Path) -> tuple[bool, str]:
        ok, detail = _run_tests_on_copy(workspace, overlay, list(targets), expect_pass=False)
        return ok, detail if not ok else f"the tests catch the {mutant} bug"

    return check


def expected_files(task: str) -> Check:
    """Each file of `expected/` is in the workspace with the same content (JSON: the same data)."""
    expected = DATA / task / "expected"

    def check(workspace: Path) -> tuple[bool, str]:
        for path in sorted(expected.rglob("*")):
            if not path.is_file():
                continue
            relative = path.relative_to(expected).as_posix()
            actual = workspace / relative
            if not actual.is_file():
                return False, f"{relative} is missing"
            text = actual.read_text(errors="replace")
            if path.suffix == ".json":
                try:
                    value = json.loads(text)
                except ValueError as error:
                    return False, f"{relative} is not valid JSON: {error}"
                if not _same_data(value, json.loads(path.read_text())):
                    return False, f"{relative} holds {json.dumps(value)[:200]}, not the expected data"
            elif text.strip() != path.read_text().strip():
                return False, f"{relative} reads {text.strip()[:80]!r}, expected {path.read_text().strip()!r}"
        return True, "files as expected"

    return check


def _same_data(actual: Any, expected: Any) -> bool:
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        return math.isclose(actual, expected, abs_tol=JSON_TOLERANCE)
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict) and actual.keys() == expected.keys()
            and all(_same_data(actual[key], expected[key]) for key in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list) and len(actual) == len(expected)
            and all(_same_data(a, e) for a, e in zip(actual, expected))
        )
    return type(actual) is type(expected) and actual == expected


def _run_tests_on_copy(workspace: Path, overlay: Path | None, targets: list[str], *, expect_pass: bool) -> tuple[bool, str]:
    """The test runner over `targets` in a copy of `workspace` with `overlay`'s files written over it."""
    with tempfile.TemporaryDirectory(prefix="swaplab-check-") as directory:
        copy = Path(directory) / "workspace"
        # Links are copied as links: the check never follows one out of the workspace.
        shutil.copytree(workspace, copy, symlinks=True, ignore=shutil.ignore_patterns(*IGNORED_PARTS))
        if overlay is not None:
            shutil.copytree(overlay, copy, dirs_exist_ok=True)
        result = Workspace(copy).run(test_command(targets))
    lines = (result.stdout or "").strip().splitlines()
    summary = lines[-1] if lines else (result.stopped or f"exit status {result.returncode}")
    if result.stopped:
        return False, f"tests stopped by the sandbox ({result.stopped})"
    passed = result.returncode == 0
    if passed == expect_pass:
        return True, summary
    if expect_pass:
        failures = [line for line in lines if line.endswith(("FAILED", "ERROR while importing"))]
        return False, f"tests failed: {summary}: {', '.join(failures[:FAILURE_LINES])}"
    return False, f"the workspace's tests {' '.join(targets)} pass even with the {overlay.name if overlay else ''} bug back: {summary}"


# -- the tasks ---------------------------------------------------------------------


def _files(task: str, folder: str = "files") -> dict[str, str]:
    root = DATA / task / folder
    return {
        path.relative_to(root).as_posix(): path.read_text()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not IGNORED_PARTS & set(path.parts)
    }


def _read(path: str) -> ToolCall:
    return ToolCall("read_file", {"path": path})


def _write(task: str, path: str) -> ToolCall:
    """The reference writes `solution/<path>` to `<path>`."""
    return ToolCall("write_file", {"path": path, "content": (DATA / task / "solution" / path).read_text()})


def _list(path: str = ".") -> ToolCall:
    return ToolCall("list_dir", {"path": path})


def _tests(path: str | None = None) -> ToolCall:
    return ToolCall("run_tests", {"path": path} if path else {})


def _task(name: str, round_: str, prompt: str, reference: list[ToolCall], checks: list[Check]) -> AgentTask:
    return AgentTask(name, round_, prompt.strip(), _files(name), tuple(reference), tuple(checks))


@cache
def _all_tasks() -> tuple[AgentTask, ...]:
    return (
        # -- r4: short tool use, a few steps each ------------------------------
        _task(
            "median_bug", "r4",
            "The tests in test_stats.py fail. Find the bug in stats.py and fix it so that the tests pass. "
            "Do not change the tests.",
            [_read("stats.py"), _read("test_stats.py"), _write("median_bug", "stats.py"), _tests()],
            [hidden_tests("median_bug")],
        ),
        _task(
            "rename_setting", "r4",
            "Rename the setting `timeout_ms` to `request_timeout_ms` in config.json, and update client.py, "
            "which reads it, so that it keeps working. Change nothing else.",
            [_read("config.json"), _read("client.py"), _write("rename_setting", "config.json"),
             _write("rename_setting", "client.py")],
            [expected_files("rename_setting"), hidden_tests("rename_setting")],
        ),
        _task(
            "count_errors", "r4",
            "Each line of logs/app.log reads `DATE TIME LEVEL MESSAGE`. How many entries in it have the level "
            "ERROR? Write only that number to a new file answer.txt.",
            [_list("logs"), _read("logs/app.log"), _write("count_errors", "answer.txt")],
            [expected_files("count_errors")],
        ),
        _task(
            "add_slugify", "r4",
            "Add a function `slugify(text)` to text_utils.py: it lower-cases the text, turns every run of "
            "characters other than a-z and 0-9 into a single '-', and leaves no '-' at either end "
            "(\"What's new in 2024?\" -> \"what-s-new-in-2024\"). test_text_utils.py has tests for it; "
            "keep the existing functions as they are.",
            [_read("text_utils.py"), _read("test_text_utils.py"), _write("add_slugify", "text_utils.py"), _tests()],
            [hidden_tests("add_slugify")],
        ),
        _task(
            "module_from_spec", "r4",
            "Create the Python module that SPEC.md describes, in the file it names.",
            [_list(), _read("SPEC.md"), _write("module_from_spec", "temperature.py")],
            [hidden_tests("module_from_spec")],
        ),
        # -- R5: longer work, where a model can lose its way ---------------------
        _task(
            "shop_bugs", "R5",
            "The test suite in tests/ fails. Find and fix the bugs in the shop package so that every test "
            "passes. Do not change the tests.",
            [_list(), _read("tests/test_shop.py"), _read("shop/cart.py"), _read("shop/pricing.py"),
             _tests("tests"), _write("shop_bugs", "shop/pricing.py"), _write("shop_bugs", "shop/cart.py"),
             _tests("tests")],
            [hidden_tests("shop_bugs")],
        ),
        _task(
            "todo_done", "R5",
            "Add a `done N` command to todo.py. It marks item N (numbered from 1, as `list` shows them) as "
            "done, and that is saved in the store. `list` then shows `[x]` before the title of a done item "
            "and `[ ]` before the others (for example `2. [x] call Sam`). `done` with a number that is not an "
            "item prints `no item N` and returns 1. test_todo.py already expects the new list format; make "
            "it pass.",
            [_read("todo.py"), _read("test_todo.py"), _write("todo_done", "todo.py"), _tests("test_todo.py")],
            [hidden_tests("todo_done")],
        ),
        _task(
            "shared_helper", "R5",
            "reports/daily.py and reports/weekly.py each define the same `format_money` function. Move it "
            "into a new module reports/money.py and have both reports import it from there, so that it is "
            "defined only once. The reports must print exactly what they print now; test_reports.py checks "
            "them.",
            [_list(), _read("reports/daily.py"), _read("reports/weekly.py"),
             _write("shared_helper", "reports/money.py"), _write("shared_helper", "reports/daily.py"),
             _write("shared_helper", "reports/weekly.py"), _tests()],
            [hidden_tests("shared_helper")],
        ),
        _task(
            "sales_summary", "R5",
            "Write a script summarize.py that reads data/sales.csv and writes summary.json with three keys: "
            "\"rows\" (the number of sales rows), \"revenue_by_region\" (for each region, the sum of "
            "units * unit_price over its rows, rounded to 2 decimals) and \"top_product\" (the product with "
            "the most units sold in total). Then run it, so that summary.json is there.",
            [_list(), _read("data/sales.csv"), _write("sales_summary", "summarize.py"),
             ToolCall("run_python", {"code": "import runpy\nrunpy.run_path('summarize.py', run_name='__main__')\n"})],
            [expected_files("sales_summary"), hidden_tests("sales_summary")],
        ),
        _task(
            "ini_parser", "R5",
            "Some tests in test_inifile.py fail. Fix inifile.py so that it does what its docstring and the "
            "tests say, without breaking what works. Do not change the tests.",
            [_read("inifile.py"), _read("test_inifile.py"), _tests(), _write("ini_parser", "inifile.py"), _tests()],
            [hidden_tests("ini_parser")],
        ),
        _task(
            "intervals_tests_first", "R5",
            "merge() in intervals.py has two bugs: touching intervals such as (1, 3) and (3, 5) are not "
            "merged, and input that is not sorted gives wrong results. First add tests to test_intervals.py "
            "that show each of the two problems, then fix merge() so that all the tests pass.",
            [_read("intervals.py"), _read("test_intervals.py"),
             _write("intervals_tests_first", "test_intervals.py"), _tests(),
             _write("intervals_tests_first", "intervals.py"), _tests()],
            [hidden_tests("intervals_tests_first"), own_tests_pass("test_intervals.py"),
             own_tests_catch("intervals_tests_first", "touching", "test_intervals.py"),
             own_tests_catch("intervals_tests_first", "unsorted", "test_intervals.py")],
        ),
    )


def agent_tasks() -> list[AgentTask]:
    """The 11 agent tasks: r4 (5), then R5 (6)."""
    return list(_all_tasks())
