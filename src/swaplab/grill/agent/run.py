"""Running an agent task: a model through native OpenAI tool calling, or the task's reference trajectory.

Both go through the same tools, the same loop rules and the same check, so a reference
that passes here proves the task can be solved the way a model is asked to solve it.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from swaplab.client import OpenAIClient
from swaplab.grill.agent.loop import LoopGuard
from swaplab.grill.agent.tasks import AgentTask, agent_tasks
from swaplab.grill.agent.tools import (
    TOOL_SCHEMAS,
    ToolCall,
    ToolError,
    ToolResult,
    Workspace,
)
from swaplab.grill.outcome import (
    ERROR,
    FAIL,
    LOOPED,
    PASS,
    TRUNCATED,
    Sampling,
    TaskOutcome,
)

MAX_STEPS = 30
SYSTEM_PROMPT = (
    "You are a software engineer working in a project directory through tools: list_dir, read_file, "
    "write_file, run_tests and run_python. Paths are relative to the project's root. Do the task by calling "
    "the tools. When the task is done, reply with a short summary and no tool call."
)

# How a run ended.
ANSWERED = "answered"  # the model replied without a tool call
ENDED_LOOPED = "looped"
ENDED_MAX_STEPS = "max_steps"
ENDED_ERROR = "error"


@dataclass(frozen=True)
class _Call:
    """A tool call as the model sent it, parsed (or refused) and ready to carry out."""

    id: str
    name: str
    raw_arguments: str
    call: ToolCall | None  # None: the arguments did not parse
    refusal: str | None

    @property
    def key(self) -> str:
        return self.call.key() if self.call is not None else f"{self.name} {self.raw_arguments}"

    @property
    def message(self) -> dict[str, Any]:
        """The call as the assistant message that made it carries it back to the server."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.raw_arguments}}


def _parse_call(raw: dict[str, Any], step: int, index: int) -> _Call:
    function = raw.get("function") or {}
    name = str(function.get("name") or "")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):  # a server that sends the object itself
        arguments = json.dumps(arguments if arguments is not None else {})
    call_id = raw.get("id") or f"call_{step}_{index}"
    try:
        return _Call(call_id, name, arguments, ToolCall.from_wire(name, arguments), None)
    except ToolError as error:
        return _Call(call_id, name, arguments, None, f"error: {error}")


def _carry_out(
    workspace: Workspace, call: ToolCall | None, refusal: str | None, before: dict[str, str]
) -> tuple[ToolResult, dict[str, str], bool]:
    """Run one call; returns its result, the workspace's new snapshot and whether the call changed it."""
    result = ToolResult(refusal or "", True) if call is None else workspace.execute(call)
    after = workspace.snapshot()
    return result, after, after != before


async def run_agent(
    client: OpenAIClient, model: str, task: AgentTask, sampling: Sampling, *, max_steps: int = MAX_STEPS
) -> TaskOutcome:
    """Let `model` work on `task` through native tool calling; judged from the final workspace.

    Ends when the model answers without a tool call, when it is LOOPED (see
    swaplab.grill.agent.loop), after `max_steps` turns, or when a request fails.
    """
    started = perf_counter()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
    ]
    transcript = [dict(message) for message in messages]
    guard = LoopGuard()
    requests = []
    ended = ENDED_MAX_STEPS
    with tempfile.TemporaryDirectory(prefix="swaplab-agent-") as directory:
        workspace = await asyncio.to_thread(Workspace.create, Path(directory) / "workspace", task.files)
        snapshot = await asyncio.to_thread(workspace.snapshot)
        for step in range(1, max_steps + 1):
            result = await client.chat(
                model, messages, max_tokens=sampling.max_tokens, tools=TOOL_SCHEMAS, **sampling.parameters()
            )
            requests.append(result)
            if not result.ok:
                ended = ENDED_ERROR
                transcript.append({"role": "error", "content": result.error})
                break
            calls = [_parse_call(raw, step, index) for index, raw in enumerate(result.tool_calls)]
            assistant: dict[str, Any] = {"role": "assistant", "content": result.text}
            if calls:
                assistant["tool_calls"] = [call.message for call in calls]
            messages.append(assistant)
            transcript.append(
                {**assistant, "reasoning": result.reasoning, "finish_reason": result.finish_reason,
                 "completion_tokens": result.completion_tokens}
            )
            if not calls:
                ended = ANSWERED
                break
            for call in calls:
                tool_result, snapshot, changed = await asyncio.to_thread(
                    _carry_out, workspace, call.call, call.refusal, snapshot
                )
                message = {"role": "tool", "tool_call_id": call.id, "content": tool_result.text}
                messages.append(message)
                transcript.append({**message, "name": call.name, "error": tool_result.error})
                if guard.call(call.key, changed):
                    break
            if guard.reason or guard.end_turn():
                ended = ENDED_LOOPED
                break
        wall_seconds = perf_counter() - started
        passed, check_detail = await asyncio.to_thread(task.check, workspace.root)
    transcript.append({"role": "check", "passed": passed, "content": check_detail})

    steps = len(requests)
    output_tokens = sum(result.completion_tokens or 0 for result in requests)
    last = requests[-1] if requests else None
    if ended == ENDED_ERROR:
        status, detail = ERROR, f"request {steps} failed: {last.error if last else ''}"
    elif ended == ENDED_LOOPED:
        status, detail = LOOPED, f"LOOPED at step {steps}: {guard.reason}"
    elif passed:
        status, detail = PASS, check_detail
    elif ended == ANSWERED and last is not None and last.finish_reason == "length":
        status, detail = TRUNCATED, f"the answer budget ran out at step {steps}; {check_detail}"
    else:
        status, detail = FAIL, check_detail
    if ended == ENDED_MAX_STEPS:
        detail += f" (still calling tools after {max_steps} steps)"
    extra = {
        "tokens_per_step": round(output_tokens / steps, 1) if steps else 0.0,
        "looped": ended == ENDED_LOOPED,
        "complete": ended == ANSWERED,
        "ended": ended,
        "tool_calls": sum(1 for entry in transcript if entry.get("role") == "tool"),
        "check_passed": passed,
    }
    missing_usage = sum(1 for result in requests if result.ok and result.completion_tokens is None)
    if missing_usage:
        extra["requests_without_usage"] = missing_usage
    return TaskOutcome(
        suite="agent", round=task.round, task=task.name, status=status, detail=detail, transcript=transcript,
        requests=requests, steps=steps, output_tokens=output_tokens, wall_seconds=wall_seconds, extra=extra,
    )


def replay_reference(task: AgentTask, calls: tuple[ToolCall, ...] | None = None) -> TaskOutcome:
    """Run the task's reference trajectory (or `calls`) through the same tools, loop rules and check."""
    calls = task.reference if calls is None else calls
    started = perf_counter()
    transcript: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    guard = LoopGuard()
    with tempfile.TemporaryDirectory(prefix="swaplab-agent-") as directory:
        workspace = Workspace.create(Path(directory) / "workspace", task.files)
        snapshot = workspace.snapshot()
        for step, call in enumerate(calls, start=1):
            call_id = f"call_{step}_0"
            arguments = json.dumps(dict(call.arguments))
            transcript.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": arguments}}
            ]})
            result, snapshot, changed = _carry_out(workspace, call, None, snapshot)
            transcript.append({"role": "tool", "tool_call_id": call_id, "name": call.name,
                               "content": result.text, "error": result.error})
            if guard.call(call.key(), changed) or guard.end_turn():
                break
        wall_seconds = perf_counter() - started
        passed, check_detail = task.check(workspace.root)
    transcript.append({"role": "check", "passed": passed, "content": check_detail})
    if guard.reason:
        status, detail = LOOPED, f"LOOPED: {guard.reason}"
    else:
        status, detail = (PASS if passed else FAIL), check_detail
    return TaskOutcome(
        suite="agent", round=task.round, task=task.name, status=status, detail=detail, transcript=transcript,
        steps=len(calls), wall_seconds=wall_seconds,
        extra={"looped": guard.reason is not None, "complete": guard.reason is None, "check_passed": passed},
    )


@dataclass(frozen=True)
class AgentSelfCheck:
    """One task's self-check: its reference solves it, and doing nothing does not."""

    name: str  # the task's
    reference_ok: bool  # the reference trajectory passes the check (and is not LOOPED)
    noop_fails: bool  # the untouched starting workspace fails the check
    detail: str

    @property
    def ok(self) -> bool:
        return self.reference_ok and self.noop_fails


def selfcheck_agent(tasks: list[AgentTask] | None = None) -> list[AgentSelfCheck]:
    """Prove the agent suite: every reference trajectory passes its check; an empty trajectory fails every one."""
    checks = []
    for task in tasks if tasks is not None else agent_tasks():
        reference = replay_reference(task)
        noop = replay_reference(task, ())
        detail = f"reference: {reference.status} ({reference.detail}); no-op: {noop.status} ({noop.detail})"
        checks.append(AgentSelfCheck(task.name, reference.status == PASS, noop.status == FAIL, detail))
    return checks
