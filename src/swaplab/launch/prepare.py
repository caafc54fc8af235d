"""Before the ranks start: the plan's local steps (once, here) and every node's prepare steps
(nodes side by side), each run to completion with its output shown and its last lines kept
for the failure it may become."""

from __future__ import annotations

import asyncio
import os
import shlex
from collections import deque
from collections.abc import Mapping, Sequence

from swaplab.launch import remote
from swaplab.launch.output import Observer, read_lines
from swaplab.launch.plan import NodePlan, Plan, expand_home
from swaplab.launch.remote import SshTarget
from swaplab.launch.spec import Step
from swaplab.launch.supervise import TAIL_LINES, GangFailed, tail_text


async def prepare(plan: Plan, observer: Observer, secrets: Mapping[str, str] | None = None) -> None:
    """The local steps (once, here), then every node's prepare steps (nodes side by side);
    `secrets` (the recipe's `${env.NAME}` keys, filled in) reach the steps that name them."""
    for node in plan.nodes:
        for step in node.steps:
            if step.kind == "local":
                await _run_local(step, observer)
    await asyncio.gather(*(_prepare_node(plan, node, observer, secrets or {}) for node in plan.nodes))


async def node_home(target: SshTarget, steps: Sequence[Step]) -> str:
    """The node user's home, asked only when a step has a `~/` to expand."""
    words = [word for step in steps for word in (*step.argv, *step.skip_if)]
    if not any(word == "~" or word.startswith("~/") for word in words):
        return "~"
    return (await remote.check(target, ["printenv", "HOME"], what="reading $HOME")).strip()


async def _run_local(step: Step, observer: Observer) -> None:
    observer.message(f"{step.name} (here): {shlex.join(step.argv)}")
    try:
        process = await asyncio.create_subprocess_exec(
            *step.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as error:
        raise GangFailed(f"{step.name} could not start here: {error}") from None
    tail = await _show_output(process, "[local] ", observer)
    if await process.wait() != 0:
        raise GangFailed(f"{step.name} failed here with code {process.returncode}; its last lines:\n{tail}")


async def _show_output(process: asyncio.subprocess.Process, prefix: str, observer: Observer) -> str:
    """Show a process's output with `prefix` as it comes; returns its last lines."""
    assert process.stdout is not None
    last: deque[str] = deque(maxlen=TAIL_LINES)

    def on_line(line: str) -> None:
        last.append(line)
        observer.output(f"{prefix}{line}")

    await read_lines(process.stdout, on_line)
    return tail_text(last)


async def _prepare_node(plan: Plan, node: NodePlan, observer: Observer, secrets: Mapping[str, str]) -> None:
    target = remote.target_for(plan.cluster, node.host)
    home = await node_home(target, node.steps)
    for step in node.steps:
        if step.kind != "prepare":
            continue
        argv = expand_home(step.argv, home)
        if step.skip_if and (await remote.run(target, expand_home(step.skip_if, home))).ok:
            observer.message(f"{step.name} on {node.host.name}: already done")
            continue
        if step.skip_if_same and await _same_here_and_there(target, step.skip_if_same):
            observer.message(f"{step.name} on {node.host.name}: already done (same as here)")
            continue
        observer.message(f"{step.name} on {node.host.name}: {shlex.join(argv)}")
        await _run_prepare(target, node, step, argv, observer, {key: secrets[key] for key in step.secrets})


async def _same_here_and_there(target: SshTarget, argv: tuple[str, ...]) -> bool:
    here = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    local_output, _ = await here.communicate()
    there = await remote.run(target, argv)
    local_text = local_output.decode(errors="replace").strip()
    return here.returncode == 0 and there.ok and bool(local_text) and local_text == there.stdout.strip()


async def _run_prepare(
    target: SshTarget, node: NodePlan, step: Step, argv: tuple[str, ...], observer: Observer, secrets: Mapping[str, str]
) -> None:
    """A prepare step to completion, output shown; its input piped from a local command when it has one,
    or its secrets put into its environment through ssh's stdin."""
    feeder = None
    read_end = None
    if secrets:
        # A few hundred bytes: the pipe holds them all, so writing cannot block.
        read_end, write_end = os.pipe()
        os.write(write_end, remote.secrets_script(secrets))
        os.close(write_end)
        argv = tuple(remote.with_secrets(argv))
    elif step.stdin_from:
        read_end, write_end = os.pipe()
        try:
            feeder = await asyncio.create_subprocess_exec(
                *step.stdin_from, stdin=asyncio.subprocess.DEVNULL, stdout=write_end, stderr=asyncio.subprocess.PIPE
            )
        finally:
            os.close(write_end)
    try:
        process = await remote.open_stream(target, argv, with_stderr=True, stdin=read_end)
    finally:
        if read_end is not None:
            os.close(read_end)
    tail = await _show_output(process, f"[rank {node.rank} {step.name}] ", observer)
    code = await process.wait()
    if feeder is not None:
        _, feeder_errors = await feeder.communicate()
        if feeder.returncode != 0:
            raise GangFailed(
                f"{step.name}: `{shlex.join(step.stdin_from)}` failed here with code {feeder.returncode}: "
                f"{feeder_errors.decode(errors='replace').strip()}"
            )
    if code == remote.SSH_EXIT_CONNECTION_FAILED:
        raise remote.unreachable(target, tail)
    if code != 0:
        raise GangFailed(f"{step.name} failed on {node.host.name} with code {code}; its last lines:\n{tail}")
