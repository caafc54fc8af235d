"""What a swap costs with `sleep:` and without: time to first token over an A B A B sequence.

Two models that cannot run together (llama-swap's default group: one at a time), each a
`swaplab sim` with a cold start of `--cold-seconds` and a wake of `--wake-seconds`. Two
routers run side by side, one config each, identical but for the `sleep:` blocks:

  stop   a swap stops the other model; asking for it again pays the whole cold start
  sleep  a swap puts the other model to sleep (its process kept); asking for it again wakes it

Each router gets the same sequence (A B A B for `--rounds 2`) of streaming chat requests,
one at a time, and the client measures each one's time to first token. Both routers spend
nearly all their time waiting on a simulated load, so running them at once costs neither
anything measurable, and the run takes as long as the slower sequence (about 2.5 minutes
at the defaults). It prints the TTFT of each step under both, their ratios (per step and
in total), each router's start, sleep and wake counters from /metrics, and the pids of the
sleep run's models from /running, which must not change. A request that fails, a pid that
changes or a model not asleep after its swap ends the run with exit status 1 and the
tail of that router's log.

    .venv/bin/python benchmarks/sleep.py [--cold-seconds 30] [--wake-seconds 1] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from soak import (  # beside this script
    RouterProcess,
    free_port,
    free_port_block,
    kill_leftovers,
    scan_backends,
)

from swaplab.sim.personality import sleep_ready

PYTHON = sys.executable
ENGINES = {"a": "vllm", "b": "sglang"}  # one model per sleep API the sim serves
HOST_MEMORY_GIB = 1
BUDGET_GIB = 64
RUNS = ("stop", "sleep")
COUNTERS = ("swaplab:backend_starts_total", "swaplab:backend_sleeps_total", "swaplab:backend_wakes_total")
SAMPLE = re.compile(r"^(?P<name>[^{\s]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


class Misbehaviour(Exception):
    """The router did something a swap must not: the run stops and says what."""

    def __init__(self, run: str, message: str):
        super().__init__(f"{run} run: {message}")
        self.run = run


@dataclass
class Step:
    """One request of the sequence and what /running said right after it."""

    model: str
    ttft: float
    pid: int
    other_state: str  # the model swapped out: "sleeping", or "stopped" when /running no longer lists it
    other_pid: int | None


@dataclass
class Run:
    """One router, its sequence's steps and, at the end, its counters."""

    name: str
    router: RouterProcess
    steps: list[Step] = field(default_factory=list)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(step.ttft for step in self.steps)


def render_config(marker: str, run: str, start_port: int, cold: float, wake: float) -> str:
    """Both runs' config: the same commands, with `sleep:` blocks only in the sleep run's."""
    lines = [f"startPort: {start_port}", f"hostMemory:\n  budgetGiB: {BUDGET_GIB}", "models:"]
    for model, engine in ENGINES.items():
        # `--model MARKER...` makes every backend findable by its command line, so none outlives the run.
        # Started as each engine must be to sleep (its contract's flags and environment), serving the model's id.
        flags, env = sleep_ready(engine)
        argv = [PYTHON, "-m", "swaplab", "sim", "--port", "${PORT}", "--model", f"{marker}{run}-{model}",
                "--served-model-name", model, "--load-seconds", f"{cold:g}", "--engine", engine,
                "--wake-seconds", f"{wake:g}", *flags]
        lines += [f"  {model}:", f"    cmd: {shlex.join(argv)}"]
        if env:
            lines.append(f"    env: [{', '.join(f'{name}={value}' for name, value in env.items())}]")
        if run == "sleep":
            level = "level: 1, " if engine == "vllm" else ""
            lines.append(f"    sleep: {{engine: {engine}, {level}hostMemoryGiB: {HOST_MEMORY_GIB}}}")
    return "\n".join(lines) + "\n"


async def time_to_first_token(session: aiohttp.ClientSession, url: str, model: str) -> float:
    """Seconds from sending a streaming chat request to its first content delta; the stream is read to its end."""
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 4, "stream": True}
    sent = time.perf_counter()
    first = None
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:500]}")
        async for line in response.content:
            if first is not None or not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = time.perf_counter()
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first - sent


async def running(session: aiohttp.ClientSession, url: str) -> dict[str, dict]:
    async with session.get(f"{url}/running") as response:
        return {entry["model"]: entry for entry in (await response.json())["running"]}


async def counters(session: aiohttp.ClientSession, url: str) -> dict[str, dict[str, float]]:
    """COUNTERS by model, from /metrics; starts count only those that succeeded (`outcome="ok"`)."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    found: dict[str, dict[str, float]] = {name: {} for name in COUNTERS}
    for match in SAMPLE.finditer(text):
        labels = dict(LABEL.findall(match["labels"]))
        if match["name"] in found and labels.get("outcome", "ok") == "ok" and "model" in labels:
            found[match["name"]][labels["model"]] = float(match["value"])
    return found


async def play(run: Run, sequence: list[str], began: float) -> None:
    """Send the sequence to one router, step by step, checking after each what the swap left behind."""
    url = run.router.url
    pids: dict[str, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        for index, model in enumerate(sequence, 1):
            try:
                ttft = await time_to_first_token(session, url, model)
            except (RuntimeError, aiohttp.ClientError) as error:
                raise Misbehaviour(run.name, f"step {index} ({model.upper()}) failed: {error}") from None
            now = await running(session, url)
            other = next(m for m in ENGINES if m != model)
            entry, other_entry = now.get(model), now.get(other)
            if entry is None or entry["state"] != "ready":
                raise Misbehaviour(run.name, f"step {index}: {model.upper()} answered but /running says {entry}")
            step = Step(model, ttft, entry["pid"], other_entry["state"] if other_entry else "stopped",
                        other_entry["pid"] if other_entry else None)
            run.steps.append(step)
            print(f"[{time.monotonic() - began:5.1f} s] {run.name:<5} step {index} {model.upper()}: "
                  f"TTFT {ttft:6.2f} s, pid {step.pid}, {other.upper()} {step.other_state}", flush=True)
            if run.name != "sleep":
                continue
            if index > 1 and step.other_state != "sleeping":
                raise Misbehaviour(run.name, f"step {index}: {other.upper()} is {step.other_state} after the swap, "
                                             f"not sleeping (/running: {other_entry})")
            for name, pid in ((model, step.pid), (other, step.other_pid)):
                if pid is not None and pids.setdefault(name, pid) != pid:
                    raise Misbehaviour(run.name, f"step {index}: {name.upper()}'s pid changed from {pids[name]} "
                                                 f"to {pid}: it was restarted, not woken")
        run.counters = await counters(session, url)


def log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


async def stop_router(router: RouterProcess) -> None:
    """SIGTERM, as a user would stop it, so it stops its backends; SIGKILL if it ignores that."""
    if router.popen.poll() is None:
        os.kill(router.pid, signal.SIGTERM)
        await router.wait_exit(30)
    router.close()


def report(runs: dict[str, Run], args: argparse.Namespace) -> dict:
    """Print the comparison; return it as the JSON document."""
    stop, sleep = runs["stop"], runs["sleep"]
    print()
    print(f"sim backends: cold start {args.cold_seconds:g} s, wake {args.wake_seconds:g} s, sleep 0 s "
          f"(the sim's default); A = vLLM sleep API (level 1), B = SGLang's")
    print("both routers ran at the same time: they mostly wait on the simulated loads, so neither slowed the other")
    print()
    print(f"{'step':<5} {'model':<6} {'TTFT without sleep':>19} {'TTFT with sleep':>16} {'ratio':>7}   "
          f"{'other model, without / with sleep'}")
    for index, (cold, warm) in enumerate(zip(stop.steps, sleep.steps, strict=True), 1):
        print(f"{index:<5} {cold.model.upper():<6} {cold.ttft:>17.2f} s {warm.ttft:>14.2f} s "
              f"{cold.ttft / warm.ttft:>6.1f}x   {cold.other_state} / {warm.other_state}")
    ratio = stop.total / sleep.total
    print(f"{'total':<12} {stop.total:>17.2f} s {sleep.total:>14.2f} s {ratio:>6.2f}x")
    print()
    names = {"swaplab:backend_starts_total": "starts", "swaplab:backend_sleeps_total": "sleeps",
             "swaplab:backend_wakes_total": "wakes"}
    for run in (stop, sleep):
        figures = ", ".join(
            f"{names[name]} " + " ".join(f"{m.upper()} {run.counters[name].get(m, 0):g}" for m in ENGINES)
            for name in COUNTERS
        )
        print(f"/metrics, {'without' if run.name == 'stop' else 'with'} sleep: {figures}")
    for run in (stop, sleep):
        pids = {m: list(dict.fromkeys(s.pid for s in run.steps if s.model == m)) for m in ENGINES}
        shown = ", ".join(f"{m.upper()} {' '.join(map(str, p))}" for m, p in pids.items())
        steps = {m: sum(s.model == m for s in run.steps) for m in ENGINES}
        if all(len(p) == 1 for p in pids.values()):
            verdict = "one process per model throughout: woken, not restarted"
        elif all(len(pids[m]) == steps[m] for m in ENGINES):
            verdict = "a new process at every step: started again"
        else:
            verdict = "some steps restarted their model"
        print(f"pids from /running, {'without' if run.name == 'stop' else 'with'} sleep: {shown} ({verdict})")
    return {
        "cold_seconds": args.cold_seconds, "wake_seconds": args.wake_seconds, "sleep_seconds": 0.0,
        "rounds": args.rounds, "sequence": [step.model for step in sleep.steps],
        "runs": {run.name: {"steps": [asdict(step) for step in run.steps], "total_ttft_s": run.total,
                            "counters": run.counters} for run in (stop, sleep)},
        "ratio_total": ratio,
        "ratio_per_step": [c.ttft / w.ttft for c, w in zip(stop.steps, sleep.steps, strict=True)],
    }


async def compare(args: argparse.Namespace, workdir: Path, marker: str, routers: dict[str, RouterProcess]) -> dict:
    base = free_port_block(2 * len(RUNS))  # each router numbers its models' ports from its own startPort
    for offset, name in enumerate(RUNS):
        home = workdir / name  # its own config, log, --state-dir and --db
        home.mkdir()
        config = home / "config.yaml"
        config.write_text(render_config(marker, name, base + 2 * offset, args.cold_seconds, args.wake_seconds))
        routers[name] = RouterProcess(config, home, free_port(), "router")
    await asyncio.gather(*(router.wait_ready() for router in routers.values()))
    runs = {name: Run(name, router) for name, router in routers.items()}
    sequence = ["a", "b"] * args.rounds
    print(f"{' '.join(m.upper() for m in sequence)} against both routers at once "
          f"(about {args.cold_seconds * len(sequence):g} s) ...", flush=True)
    began = time.monotonic()
    await asyncio.gather(*(play(run, sequence, began) for run in runs.values()))
    return report(runs, args)


async def shut_down(routers: dict[str, RouterProcess]) -> None:
    await asyncio.gather(*(stop_router(router) for router in routers.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold-seconds", type=float, default=30.0, help="the sims' cold start (default 30)")
    parser.add_argument("--wake-seconds", type=float, default=1.0, help="the sims' wake from sleep (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs in the sequence (default 2: A B A B)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    workdir = Path(tempfile.mkdtemp(prefix="swaplab-sleep-"))
    marker = f"sleepbench{os.getpid()}-"
    routers: dict[str, RouterProcess] = {}
    # Stopped with SIGTERM (`kill`, a CI timeout), it must still take its routers and
    # backends down: SystemExit unwinds through the finally below, the default action would not.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    failed = None
    try:
        document = asyncio.run(compare(args, workdir, marker, routers))
    except Misbehaviour as error:
        failed = error
    finally:
        asyncio.run(shut_down(routers))
        left = scan_backends(marker)
        kill_leftovers(marker)
    if left:
        print(f"backends still alive after the routers exited (killed now): {sorted(left)}")
    if failed is not None:
        log = workdir / failed.run / "router.log"
        print(f"\nFAILED: {failed}\n\nlast lines of {log}:\n{log_tail(log)}")
        print(f"\nwork dir kept: {workdir}")
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
