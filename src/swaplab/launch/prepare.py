"""Before the ranks start: the plan's local steps (once, here) and every node's prepare and
send steps (nodes side by side; a worker's step that needs the head's models waits for them),
each run to completion with its output shown and its last lines kept for the failure it may
become. The first failure stops every other node's steps."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shlex
import sys
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from swaplab.launch import remote
from swaplab.launch.output import CHUNK_BYTES, Observer, ProgressLines, read_lines
from swaplab.launch.plan import (
    DOWNLOAD_STEP,
    IMAGE_ID,
    NodePlan,
    Plan,
    expand_home,
    image_from_head,
)
from swaplab.launch.remote import SshTarget
from swaplab.launch.spec import Step
from swaplab.launch.supervise import TAIL_LINES, GangFailed, tail_text


async def prepare(plan: Plan, observer: Observer, secrets: Mapping[str, str] | None = None) -> None:
    """The local steps (once, here), then every node's prepare steps (nodes side by side);
    `secrets` (the recipe's `${env.NAME}` keys, filled in) reach the steps that name them."""
    secrets = secrets or {}
    for node in plan.nodes:
        for step in node.steps:
            if step.kind == "local" and step.name == DOWNLOAD_STEP and importlib.util.find_spec("huggingface_hub") is None:
                raise GangFailed(
                    "download = \"here\" fetches the models with huggingface_hub in swaplab's own Python, which "
                    f"lacks it: `{sys.executable} -m pip install 'swaplab[launch]'` (or huggingface-hub), "
                    "or set download = \"head\" in the clusters file"
                )
            if step.kind == "local":
                await _run_local(step, observer, {key: secrets[key] for key in step.secrets})
    # Each head step's end, for the workers' steps that wait for it (Step.after_head).
    head_done = {step.name: asyncio.Event() for step in plan.nodes[0].steps}
    # The image's id here, asked once (after a local build) for every node's image step.
    images = {step.image for node in plan.nodes for step in node.steps if step.image}
    here_ids = {image: await _local_output((*IMAGE_ID, image)) for image in images}
    tasks = [
        asyncio.create_task(_prepare_node(plan, node, observer, secrets, head_done, here_ids)) for node in plan.nodes
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        # A failure, or `up` itself cancelled: nothing of the other nodes goes on.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error


async def node_home(target: SshTarget, words: Iterable[str]) -> str:
    """The node user's home, asked only when one of `words` has a `~/` to expand."""
    if not any(word == "~" or word.startswith("~/") for word in words):
        return "~"
    return (await remote.check(target, ["printenv", "HOME"], what="reading $HOME")).strip()


async def _run_local(
    step: Step, observer: Observer, secrets: Mapping[str, str], prefix: str = "[local] ", into: str | None = None
) -> None:
    """A step on this machine (`~/` is this user's home), its secrets in its environment only;
    `into`: the node it sends to."""
    argv = expand_home(step.argv, str(Path.home()))
    observer.message(f"{step.name} (here{f', into {into}' if into else ''}): {shlex.join(argv)}")
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env={**os.environ, **secrets} if secrets else None,
        )
    except OSError as error:
        raise GangFailed(f"{step.name} could not start here: {error}") from None
    try:
        tail = await _show_output(process, prefix, observer, progress=step.progress)
        code = await process.wait()
    finally:
        await _end(process)
    if code != 0:
        raise GangFailed(f"{step.name} failed here with code {code}; its last lines:\n{tail}")


async def _end(process: asyncio.subprocess.Process) -> None:
    """A step abandoned half way (another node failed, `up` stopped) leaves no process behind."""
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass
        await process.wait()


async def _show_output(process: asyncio.subprocess.Process, prefix: str, observer: Observer, *, progress: bool = False) -> str:
    """Show a process's output with `prefix` as it comes (progress lines thinned out when the
    step makes them); returns its last lines."""
    assert process.stdout is not None
    last: deque[str] = deque(maxlen=TAIL_LINES)

    def on_line(line: str) -> None:
        last.append(line)
        observer.output(f"{prefix}{line}")

    if not progress:
        await read_lines(process.stdout, on_line)
        return tail_text(last)
    lines = ProgressLines(on_line)
    while chunk := await process.stdout.read(CHUNK_BYTES):
        lines.feed(chunk)
    lines.close()
    return tail_text(last)


async def _prepare_node(
    plan: Plan, node: NodePlan, observer: Observer, secrets: Mapping[str, str], head_done: Mapping[str, asyncio.Event],
    here_ids: Mapping[str, str | None],
) -> None:
    target = remote.target_for(plan.cluster, node.host)
    home = await node_home(target, [word for step in node.steps for word in (*step.argv, *step.skip_if)])
    for step in node.steps:
        if step.kind not in ("prepare", "send"):
            continue
        if step.image:
            await _bring_image(plan, target, node, step, observer, head_done, here_ids[step.image])
        else:
            if step.after_head and node.rank != 0:
                await head_done[step.after_head].wait()
            await _prepare_step(target, node, step, home, observer, secrets)
        if node.rank == 0:
            head_done[step.name].set()


async def _prepare_step(
    target: SshTarget, node: NodePlan, step: Step, home: str, observer: Observer, secrets: Mapping[str, str]
) -> None:
    step_secrets = {key: secrets[key] for key in step.secrets}
    if step.kind == "send":
        await _run_local(step, observer, step_secrets, prefix=f"[rank {node.rank} {step.name}] ", into=node.host.name)
        return
    argv = expand_home(step.argv, home)
    if step.skip_if and (await remote.run(target, expand_home(step.skip_if, home))).ok:
        observer.message(f"{step.name} on {node.host.name}: already done")
        return
    if step.skip_if_same and await _same_here_and_there(target, step.skip_if_same):
        observer.message(f"{step.name} on {node.host.name}: already done (same as here)")
        return
    observer.message(f"{step.name} on {node.host.name}: {shlex.join(argv)}")
    await _run_prepare(target, node, step, argv, observer, step_secrets)


async def _bring_image(
    plan: Plan, target: SshTarget, node: NodePlan, step: Step, observer: Observer, head_done: Mapping[str, asyncio.Event],
    here: str | None,
) -> None:
    """The recipe's image onto the node, from the nearest place that has it (see Step.image);
    `here`: its id on this machine."""
    assert step.image is not None
    id_argv = (*IMAGE_ID, step.image)
    there = await remote.run(target, id_argv)
    head = None
    if not here and not step.stdin_from and node.rank != 0:
        # The head brings it first (from the registry at worst); then one copy over the fabric.
        await head_done[step.name].wait()
        asked = await remote.run(remote.target_for(plan.cluster, plan.cluster.head), id_argv)
        head = asked.stdout.strip() if asked.ok else None
    source, why = image_source(
        here=here, there=there.stdout.strip() if there.ok else None, head=head, built=bool(step.stdin_from)
    )
    where = node.host.name
    observer.message(f"{step.name} on {where}: {why}")
    if source == "here":
        await _run_prepare(target, node, replace(step, stdin_from=("docker", "save", step.image)), ("docker", "load"), observer, {})
    elif source == "head":
        await _run_prepare(target, node, step, image_from_head(plan.cluster, step.image), observer, {})
    elif source == "registry":
        await _run_prepare(target, node, step, step.argv, observer, {})
    elif source == "missing":
        raise GangFailed(f"{step.name} on {where}: {why}")


def image_source(*, here: str | None, there: str | None, head: str | None, built: bool) -> tuple[str, str]:
    """Where a node's image comes from, given the image ids here, there and on the head (None:
    absent, or not asked): "here", "head", "registry", "none" (the node has the right one) or
    "missing" (an image built here is gone); and why, for people."""
    if here:
        if there == here:
            return "none", "already there, the same id as here"
        return "here", "docker save (here) | docker load (there): " + ("not there" if there is None else "another id there")
    if built:
        return "missing", "built here, but `docker image inspect` cannot find it here any more"
    if head:
        if there == head:
            return "none", "already there, the same id as the head's"
        return "head", "the head's copy over the fabric (docker save there | docker load here): " + (
            "not there" if there is None else "another id there"
        )
    if there:
        return "none", "already there"
    return "registry", "docker pull"


async def _local_output(argv: Sequence[str]) -> str | None:
    """What `argv` prints here when it succeeds (None when it fails or is not installed)."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
    except OSError:
        return None
    output, _ = await process.communicate()
    return output.decode(errors="replace").strip() or None if process.returncode == 0 else None


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
    try:
        tail = await _show_output(process, f"[rank {node.rank} {step.name}] ", observer, progress=step.progress)
        code = await process.wait()
    finally:
        await _end(process)
        if feeder is not None:
            await _end(feeder)
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
