"""The agent suite: its tasks prove themselves, and run_agent drives a scripted model through a real sim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from procs import Sim
from scripts import agent_rule

from swaplab.client import OpenAIClient
from swaplab.grill.agent import (
    ToolCall,
    agent_tasks,
    replay_reference,
    run_agent,
    selfcheck_agent,
)
from swaplab.grill.agent.loop import IDLE_TURNS, REPEAT_LIMIT, LoopGuard
from swaplab.grill.agent.tools import Workspace
from swaplab.grill.outcome import FAIL, LOOPED, PASS, TRUNCATED, Sampling

TASKS = {task.name: task for task in agent_tasks()}





async def run_scripted(sim: Sim, task, **options):
    async with OpenAIClient(sim.url) as client:
        return await run_agent(client, "scripted", task, Sampling(temperature=0.0, max_tokens=512), **options)


# -- the suite proves itself -----------------------------------------------------------


def test_eleven_tasks_five_short_six_long_with_distinct_prompts():
    tasks = agent_tasks()
    assert [task.round for task in tasks] == ["r4"] * 5 + ["R5"] * 6
    assert len({task.name for task in tasks}) == 11
    # Scripts (and the lead's end-to-end tests) find a task by the start of its prompt.
    assert len({task.prompt[:160] for task in tasks}) == 11
    assert all(task.reference and task.files for task in tasks)


def test_every_reference_passes_and_doing_nothing_fails_every_task():
    checks = selfcheck_agent()
    assert [check.name for check in checks] == list(TASKS)
    failing = [check for check in checks if not check.ok]
    assert not failing, "\n".join(check.detail for check in failing)
    assert all(check.reference_ok and check.noop_fails for check in checks)


def test_replay_reports_steps_and_the_check():
    outcome = replay_reference(TASKS["shop_bugs"])
    assert outcome.status == PASS and outcome.steps == len(TASKS["shop_bugs"].reference)
    assert outcome.transcript[-1] == {"role": "check", "passed": True, "content": outcome.detail}
    noop = replay_reference(TASKS["shop_bugs"], ())
    assert noop.status == FAIL and "tests failed" in noop.detail


def test_editing_the_visible_tests_does_not_pass_a_task():
    task = TASKS["median_bug"]
    tampered = (ToolCall("write_file", {"path": "test_stats.py", "content": "def test_nothing():\n    pass\n"}),)
    outcome = replay_reference(task, tampered)
    assert outcome.status == FAIL and "test_median_of_an_even_count FAILED" in outcome.detail


def test_tests_that_miss_a_bug_fail_the_tests_first_task():
    task = TASKS["intervals_tests_first"]
    # The fix without the tests that show the bugs: the model's tests don't catch them.
    fix_only = tuple(call for call in task.reference if call.arguments.get("path") != "test_intervals.py")
    outcome = replay_reference(task, fix_only)
    assert outcome.status == FAIL and "pass even with the touching bug back" in outcome.detail


def test_hand_written_summary_fails_where_the_script_is_rerun_on_other_data():
    task = TASKS["sales_summary"]
    expected = (Path(__file__).parents[1] / "src/swaplab/grill/agent/data/sales_summary/expected/summary.json").read_text()
    hard_coded = (
        ToolCall("write_file", {"path": "summary.json", "content": expected}),
        ToolCall("write_file", {"path": "summarize.py", "content": f"open('summary.json', 'w').write({expected!r})\n"}),
    )
    outcome = replay_reference(task, hard_coded)
    assert outcome.status == FAIL and "test_summarize_reads_whatever_data_is_there FAILED" in outcome.detail


# -- the tools ---------------------------------------------------------------------------


def test_paths_outside_the_workspace_are_refused_and_nothing_happens(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    workspace = Workspace.create(tmp_path / "workspace", {"a.txt": "a"})
    (workspace.root / "link").symlink_to(outside)
    for call in (
        ToolCall("read_file", {"path": "../outside/secret.txt"}),
        ToolCall("read_file", {"path": str(outside / "secret.txt")}),
        ToolCall("read_file", {"path": "link/secret.txt"}),
        ToolCall("write_file", {"path": "../outside/new.txt", "content": "x"}),
        ToolCall("write_file", {"path": "link/new.txt", "content": "x"}),
        ToolCall("list_dir", {"path": ".."}),
        ToolCall("run_tests", {"path": "../outside"}),
    ):
        result = workspace.execute(call)
        assert result.error and "outside the workspace" in result.text, (call, result)
    assert sorted(path.name for path in outside.iterdir()) == ["secret.txt"]
    # Inside, an absolute path is fine.
    assert workspace.execute(ToolCall("read_file", {"path": str(workspace.root / "a.txt")})).text == "a"


def test_bad_calls_are_tool_errors(tmp_path):
    workspace = Workspace.create(tmp_path / "workspace", {"a.txt": "a"})
    assert "there is no tool 'delete'" in workspace.execute(ToolCall("delete", {"path": "a.txt"})).text
    assert "'content' must be a string" in workspace.execute(ToolCall("write_file", {"path": "b.txt"})).text
    assert "is not a file" in workspace.execute(ToolCall("read_file", {"path": "missing.txt"})).text
    ran = workspace.execute(ToolCall("run_python", {"code": "import sys; print('out'); sys.exit(3)"}))
    assert ran.error and ran.text.startswith("exit status 3") and "out" in ran.text


# -- loop rules, as a table --------------------------------------------------------------


@pytest.mark.parametrize(
    ("turns", "looped_at"),
    [
        # (calls of each turn as (key, changed the workspace)), the turn it is LOOPED at (None: never)
        ([[("read a", False)]] * 3, 3),
        ([[("read a", False), ("read a", False), ("read a", False)]], 1),
        # A change in between resets the count: test, fix, test, fix, test is work.
        ([[("test", False)], [("write 1", True)], [("test", False)], [("write 2", True)], [("test", False)]], None),
        # Writing the same content again changes nothing after the first time.
        ([[("write same", True)], [("write same", False)], [("write same", False)]], 3),
        # Six distinct calls, then the same six again: no new call and no change for IDLE_TURNS turns.
        ([[(f"read {n}", False)] for n in range(6)] * 2, 12),
        ([[(f"read {n}", False)] for n in range(5)] + [[("read 0", False)], [("write", True)]], None),
    ],
)
def test_loop_rules(turns, looped_at):
    guard = LoopGuard()
    for number, calls in enumerate(turns, start=1):
        for key, changed in calls:
            guard.call(key, changed)
        if guard.end_turn():
            break
    assert (number if guard.reason else None) == looped_at, guard.reason
    assert (REPEAT_LIMIT, IDLE_TURNS) == (3, 6)


# -- run_agent through a real sim --------------------------------------------------------


async def test_a_scripted_reference_completes_every_task(scripted):
    sim = scripted({"rules": [agent_rule(task) for task in TASKS.values()]})
    for task in TASKS.values():
        outcome = await run_scripted(sim, task)
        assert outcome.status == PASS, (task.name, outcome.detail)
        assert outcome.steps == len(task.reference) + 1  # the calls, then the final answer
        assert outcome.extra["complete"] and not outcome.extra["looped"]
        assert outcome.output_tokens == sum(result.completion_tokens for result in outcome.requests) > 0
        assert outcome.extra["tokens_per_step"] == round(outcome.output_tokens / outcome.steps, 1)
        assert outcome.wall_seconds > 0
        tool_messages = [entry for entry in outcome.transcript if entry["role"] == "tool"]
        assert len(tool_messages) == len(task.reference) == outcome.extra["tool_calls"]
        assert outcome.transcript[-1]["role"] == "check" and outcome.transcript[-1]["passed"]


async def test_tool_results_go_back_as_tool_messages_with_their_call_id(scripted):
    task = TASKS["count_errors"]
    sim = scripted({"rules": [agent_rule(task)]})
    outcome = await run_scripted(sim, task)
    calls = [entry for entry in outcome.transcript if entry["role"] == "assistant" and entry.get("tool_calls")]
    results = [entry for entry in outcome.transcript if entry["role"] == "tool"]
    assert [call["tool_calls"][0]["id"] for call in calls] == [result["tool_call_id"] for result in results]
    assert results[0]["content"] == "logs/app.log (2581 bytes)"
    # The sim answered turn n with reply n: it counted the assistant messages run_agent sent back.
    assert outcome.status == PASS


async def test_repeating_one_call_is_looped(scripted):
    task = TASKS["shop_bugs"]
    sim = scripted({"rules": [agent_rule(task, [task.reference[0]] * 10)]})
    outcome = await run_scripted(sim, task)
    assert outcome.status == LOOPED
    assert outcome.steps == REPEAT_LIMIT
    assert outcome.extra["looped"] and not outcome.extra["complete"]
    assert "the same call 3 times" in outcome.detail and "list_dir" in outcome.detail


async def test_no_progress_is_looped(scripted):
    task = TASKS["median_bug"]
    wandering = [ToolCall("read_file", {"path": f"notes{n}.txt"}) for n in range(IDLE_TURNS)] * 3
    sim = scripted({"rules": [agent_rule(task, wandering)]})
    outcome = await run_scripted(sim, task)
    assert outcome.status == LOOPED and outcome.steps == 2 * IDLE_TURNS
    assert "turns in a row without a new call or a change" in outcome.detail


async def test_escapes_are_refused_through_the_model_too(scripted, tmp_path):
    task = TASKS["count_errors"]
    target = tmp_path / "escaped.txt"
    calls = [
        ToolCall("write_file", {"path": str(target), "content": "7"}),
        ToolCall("write_file", {"path": "../../../../../../" + str(target), "content": "7"}),
        ToolCall("read_file", {"path": "/etc/hostname"}),
    ]
    sim = scripted({"rules": [agent_rule(task, calls)]})
    outcome = await run_scripted(sim, task)
    results = [entry for entry in outcome.transcript if entry["role"] == "tool"]
    assert all(result["error"] and "outside the workspace" in result["content"] for result in results)
    assert not target.exists()
    assert outcome.status == FAIL and outcome.extra["complete"]


async def test_an_answer_without_work_fails_and_a_cut_answer_is_truncated(scripted):
    lazy, cut = TASKS["add_slugify"], TASKS["module_from_spec"]
    sim = scripted({"rules": [
        {"match": re.escape(lazy.prompt[:160]), "replies": ["It is done."]},
        {"match": re.escape(cut.prompt[:160]), "replies": [{"reasoning": "First I will", "finish_reason": "length"}]},
    ]})
    lazy_outcome = await run_scripted(sim, lazy)
    assert lazy_outcome.status == FAIL and lazy_outcome.steps == 1 and lazy_outcome.extra["complete"]
    cut_outcome = await run_scripted(sim, cut)
    assert cut_outcome.status == TRUNCATED and "budget ran out" in cut_outcome.detail


async def test_max_steps_and_malformed_arguments(scripted):
    task = TASKS["median_bug"]
    script = {"rules": [{
        "match": re.escape(task.prompt[:160]),
        "replies": [
            {"tool_calls": [{"name": "read_file", "arguments": "{\"path\": "}]},  # cut JSON
            *({"tool_calls": [{"name": "write_file", "arguments": {"path": f"f{n}.txt", "content": "x"}}]}
              for n in range(10)),
        ],
    }]}
    sim = scripted(script)
    outcome = await run_scripted(sim, task, max_steps=4)
    first_result = next(entry for entry in outcome.transcript if entry["role"] == "tool")
    assert first_result["error"] and "not valid JSON" in first_result["content"]
    assert outcome.steps == 4 and outcome.extra["ended"] == "max_steps" and not outcome.extra["complete"]
    assert outcome.status == FAIL and "still calling tools after 4 steps" in outcome.detail
