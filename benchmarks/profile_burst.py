"""Where does a proxy's time go when 64 streaming requests arrive at one instant?

The setup of benchmarks/overhead.py (`swaplab sim` unpaced or paced, `swaplab serve`
with it as a model, benchmarks/passthrough.py in front of the same sim), then bursts of
64 streaming requests (benchmarks/burst.py: prebuilt bytes on warm connections) against
ONE proxy, swaplab or the passthrough, while py-spy samples it or while it runs under
cProfile. It prints the proxy's CPU time per request, counted over all the bursts so
that work a proxy defers past a burst (swaplab's batched bookkeeping) counts too, first
without a profiler and then profiled (what the profiler itself costs is shown, not
hidden), and three tables, waits left out:

  own time         the function on top of the stack (where the CPU was)
  steps            each sample charged to the deepest frame of the proxy's own code, so
                   library time counts for the function of ours that called it
  cumulative       the proxy's own functions, callees included (they nest: no sum)

`run` writes PREFIX.json (how it was run, CPU, TTFB) and the profile (PREFIX.pyspy.txt,
py-spy's collapsed stacks, or PREFIX.prof); `tables` prints them again, or side by side
with another run's (--against), in µs per request: a row's share of the profile times
the CPU per request measured without a profiler. The code profiled is whatever
`python -m swaplab` imports, so PYTHONPATH=/other/checkout/src profiles another version
with the same tool.

py-spy is not a dependency of swaplab: `pip install py-spy` (it attaches with ptrace:
root, or kernel.yama.ptrace_scope=0).

    .venv/bin/python benchmarks/profile_burst.py run --target swaplab --upstream unpaced --out /tmp/prof/sw
    PYTHONPATH=/tmp/old/src .venv/bin/python benchmarks/profile_burst.py run --out /tmp/prof/sw-old
    .venv/bin/python benchmarks/profile_burst.py tables /tmp/prof/sw --against /tmp/prof/sw-old
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import os
import platform
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
from burst import Burst, chat_request  # benchmarks/, beside this script
from overhead import HERE, PY, Fleet, chat_body, free_port, router_config, wait_http

STREAMS = 64
# (measured tokens, warm-up tokens) per upstream, as in overhead.py's burst measure: the
# warm-up streams are long enough that all 64 overlap, so the proxy's own pool to the sim
# holds 64 connections before anything is measured.
TOKENS = {"unpaced": (16, 300), "paced": (8, 8)}
MODEL_OF = {"unpaced": "fast", "paced": "paced"}
SETTLE_SECONDS = 0.01  # after each burst, as overhead.py: the proxy's bookkeeping after the last byte

# Leaf frames of a thread that waits rather than works. py-spy is told to skip idle
# threads, but in containers it often sees a thread blocked in these as running.
WAITS = {
    ("EpollSelector.select", "selectors.py"),
    ("Condition.wait", "threading.py"),
    ("ThreadedChildWatcher._do_waitpid", "asyncio/unix_events.py"),
    ("_worker", "concurrent/futures/thread.py"),
}
# The frame under which the event loop runs its callbacks: frames above it (the entry
# point, the CLI, asyncio.run) are on every sample of the main thread and say nothing.
LOOP_FRAME = "BaseEventLoop._run_once"
OWN_CODE = {"swaplab": "swaplab/", "passthrough": "passthrough.py"}
# cProfile's counterparts of WAITS: where the loop or a thread sleeps.
CPROFILE_WAITS = ("<method 'poll' of 'select.epoll' objects>", "<method 'acquire' of '_thread.lock' objects>")
# Runs a proxy (`-m module ...` or `script.py ...`) with cProfile off until SIGUSR1; SIGUSR2
# stops it and writes the profile. Only the event loop's thread is profiled (the one that
# runs signal handlers), and only the measured bursts: no start-up, no warm-up.
CPROFILE_WRAPPER = """
import cProfile, runpy, signal, sys
out, *argv = sys.argv[1:]
profiler = cProfile.Profile()
def stop(*_):
    profiler.disable()
    profiler.dump_stats(out)
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
signal.signal(signal.SIGUSR2, stop)
if argv[0] == "-m":
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
else:
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")
"""


def beside(prefix: Path, suffix: str) -> Path:
    """One of a run's files: its --out prefix with `suffix` appended."""
    return prefix.parent / (prefix.name + suffix)


# -- reading profiles (pure functions over their text) ---------------------------

@dataclass(frozen=True, slots=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def key(self) -> str:
        """The function, by name and file (lines move between versions; functions mostly do not)."""
        return f"{self.function} ({self.file})"


@dataclass(frozen=True, slots=True)
class Stack:
    thread: str
    frames: tuple[Frame, ...]  # outermost first
    samples: int


_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?):(?P<line>\d+)\)$")


def parse_collapsed(text: str) -> list[Stack]:
    """py-spy's `--format raw --threads` output: `thread (id): name;frame;frame... count` per line."""
    stacks = []
    for line in text.splitlines():
        body, _, count = line.rpartition(" ")
        if not body:
            continue
        thread, *frames = body.split(";")
        parsed = []
        for frame in frames:
            match = _FRAME.match(frame)
            parsed.append(Frame(match["function"], match["file"], int(match["line"])) if match else Frame(frame, "?", 0))
        stacks.append(Stack(thread.rpartition(": ")[2], tuple(parsed), int(count)))
    return stacks


def is_wait(stack: Stack) -> bool:
    return bool(stack.frames) and (stack.frames[-1].function, stack.frames[-1].file) in WAITS


def working_frames(stack: Stack) -> tuple[Frame, ...]:
    """The frames below the event loop's dispatch (all of them on a thread without a loop)."""
    names = [frame.function for frame in stack.frames]
    if LOOP_FRAME in names:
        return stack.frames[len(names) - names[::-1].index(LOOP_FRAME):]
    return stack.frames


def loop_callback(stack: Stack) -> str:
    """What the event loop was running: the callback's first frame, or the loop itself."""
    frames = working_frames(stack)
    if frames and frames[0].function == "Handle._run" and len(frames) > 1:
        frames = frames[1:]
    return frames[0].key if frames else f"{LOOP_FRAME} itself (polling, scheduling)"


def step_of(stack: Stack, own_code: str) -> str:
    """The deepest frame of our own code on the stack, or, if none, what the loop was running."""
    for frame in reversed(working_frames(stack)):
        if own_code in frame.file:
            return frame.key
    return f"[no own frame] {loop_callback(stack)}"


def sample_tables(stacks: list[Stack], own_code: str) -> dict[str, collections.Counter]:
    """Samples by own (leaf) function, by step, and cumulative over own functions; waits left out."""
    own, steps, cumulative = collections.Counter(), collections.Counter(), collections.Counter()
    for stack in stacks:
        if is_wait(stack) or not stack.frames:
            continue
        own[stack.frames[-1].key] += stack.samples
        steps[step_of(stack, own_code)] += stack.samples
        for key in {frame.key for frame in working_frames(stack) if own_code in frame.file}:
            cumulative[key] += stack.samples
    return {"own": own, "steps": steps, "cumulative": cumulative}


def sample_summary(stacks: list[Stack]) -> dict:
    working = [stack for stack in stacks if not is_wait(stack)]
    threads = collections.Counter()
    for stack in working:
        threads[stack.thread] += stack.samples
    return {
        "samples": sum(stack.samples for stack in working),
        "waits_left_out": sum(stack.samples for stack in stacks if is_wait(stack)),
        "by_thread": dict(threads.most_common()),
    }


def short_file(path: str) -> str:
    """A path as py-spy writes it: from the package (or the script) on."""
    for marker in ("/site-packages/", "/src/", "/lib/python3."):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3." else tail
    return Path(path).name if "/" in path else path


def cprofile_tables(path: Path, own_code: str) -> dict[str, collections.Counter]:
    """Seconds by function from a cProfile file: own (tottime) and cumulative over own functions; waits left out."""
    own, cumulative = collections.Counter(), collections.Counter()
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    for (file, _line, function), (_calls, _primitive, tottime, cumtime, _callers) in stats.items():
        if function in CPROFILE_WAITS:
            continue
        key = f"{function} ({short_file(file)})"
        own[key] += tottime
        if own_code in key:
            cumulative[key] += cumtime
    return {"own": own, "cumulative": cumulative}


# -- driving the proxy ------------------------------------------------------------

@dataclass
class Phase:
    """Bursts fired at the proxy, and what it cost it."""

    name: str
    rounds: int
    cpu_seconds: float
    wall_seconds: float
    ttfb_p50s: list[float]  # per burst: the median of its 64 times to first byte

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "rounds": self.rounds,
            "requests": self.rounds * STREAMS,
            "cpu_ms_per_request": self.cpu_ms_per_request,
            "wall_seconds": self.wall_seconds,
            "ttfb_p50_ms_median": statistics.median(self.ttfb_p50s) * 1e3,
        }

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_seconds * 1e3 / (self.rounds * STREAMS)


def process_cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def burst_rounds(burst: Burst, request: bytes, rounds: int, gap: float, proxy: psutil.Process, name: str) -> Phase:
    """`rounds` bursts, `gap` seconds apart; the proxy's CPU counted over all of them, whenever it spent it."""
    cpu_before, began = process_cpu(proxy), time.perf_counter()
    p50s = []
    for _ in range(rounds):
        await asyncio.sleep(gap)
        replies = await burst.fire(request)
        if any(reply.events < 2 for reply in replies):
            raise RuntimeError("a burst's response was not a stream of events")
        p50s.append(statistics.median(reply.first_byte for reply in replies))
        await asyncio.sleep(SETTLE_SECONDS)
    await asyncio.sleep(0.2)  # work deferred past the last burst (swaplab's batched bookkeeping) is its cost too
    return Phase(name, rounds, process_cpu(proxy) - cpu_before, time.perf_counter() - began, p50s)


class PySpy:
    """py-spy attached to the proxy, recording collapsed stacks per thread."""

    label = "py-spy sampling"

    def __init__(self, executable: str, pid: int, rate: int, nonblocking: bool, out: Path):
        self.argv = [executable, "record", "-p", str(pid), "-r", str(rate), "--threads", "--format", "raw", "-o", str(out)]
        if nonblocking:
            self.argv.append("--nonblocking")
        self.log = beside(out, ".log")
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """Returns once py-spy samples."""
        self.process = subprocess.Popen(self.argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while "Sampling process" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"py-spy did not start sampling:\n{self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        self.process.wait(60)


class CProfileToggle:
    """cProfile inside the proxy (started under CPROFILE_WRAPPER), switched on and off by signals."""

    label = "under cProfile"

    def __init__(self, pid: int, out: Path):
        self.pid, self.out = pid, out

    def start(self) -> None:
        self.out.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        time.sleep(0.1)  # the handler runs when the loop next wakes

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not (self.out.exists() and self.out.stat().st_size):
            if time.monotonic() > deadline:
                raise SystemExit(f"the proxy wrote no profile to {self.out}")
            time.sleep(0.05)
        time.sleep(0.2)  # dump_stats writes in one go; let it finish


def code_under_test() -> dict:
    """Which swaplab `python -m swaplab` imports here (PYTHONPATH included), and its commit."""
    found = subprocess.run([PY, "-c", "import swaplab; print(swaplab.__file__)"], capture_output=True, text=True, check=True)
    package = Path(found.stdout.strip()).parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(package), *args], check=False, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "swaplab": str(package),
        "commit": git("rev-parse", "--short", "HEAD"),
        "changed_files": git("status", "--porcelain", "--", ".").splitlines(),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }


async def load_model(router_url: str, model: str) -> None:
    """One request through the router, which starts the model's server."""
    body = chat_body(model, False, 1)
    async with aiohttp.ClientSession() as session, session.post(f"{router_url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise SystemExit(f"loading {model} through the router: HTTP {response.status}: {await response.text()}")


async def start_target(fleet: Fleet, workdir: Path, args: argparse.Namespace) -> tuple[str, int]:
    """Start the sims, the router and, for the passthrough, the passthrough; the target's URL and pid."""
    fast, paced = free_port(), free_port()
    config = workdir / "config.yaml"
    config.write_text(router_config(fast, paced, None, None))
    profiled = [PY, "-c", CPROFILE_WRAPPER, str(beside(args.out, ".prof"))]
    python = profiled if args.profiler == "cprofile" and args.target == "swaplab" else [PY]
    router_port = free_port()
    router = fleet.spawn("router", [
        *python, "-m", "swaplab", "serve", "--config", str(config), "--db", str(workdir / "swaplab.db"),
        "--listen", f"127.0.0.1:{router_port}", "--state-dir", str(workdir / "state"),
    ])
    router_url = f"http://127.0.0.1:{router_port}"
    await wait_http(f"{router_url}/health")
    model = MODEL_OF[args.upstream]
    await load_model(router_url, model)
    if args.target == "swaplab":
        return router_url, router.pid
    port = free_port()
    python = profiled if args.profiler == "cprofile" else [PY]
    upstream = f"http://127.0.0.1:{fast if model == 'fast' else paced}"
    passthrough = fleet.spawn("passthrough", [
        *python, str(HERE / "passthrough.py"), "--port", str(port), "--upstream", upstream,
    ])
    url = f"http://127.0.0.1:{port}"
    await wait_http(f"{url}/health")
    return url, passthrough.pid


def choose_profiler(args: argparse.Namespace, pid: int) -> PySpy | CProfileToggle | None:
    if args.profiler == "py-spy":
        return PySpy(args.py_spy, pid, args.rate, args.nonblocking, beside(args.out, ".pyspy.txt"))
    if args.profiler == "cprofile":
        return CProfileToggle(pid, beside(args.out, ".prof"))
    return None


async def profile(args: argparse.Namespace) -> dict:
    """Start everything, warm, burst the target (clean, then profiled), and return what was seen."""
    workdir = Path(tempfile.mkdtemp(prefix="swaplab-profile-burst-"))
    fleet = Fleet(workdir)
    model = MODEL_OF[args.upstream]
    tokens, warm_tokens = TOKENS[args.upstream]
    phases: list[Phase] = []
    try:
        url, pid = await start_target(fleet, workdir, args)
        proxy = psutil.Process(pid)
        burst = Burst(url, STREAMS)
        await burst.open()
        try:
            for _ in range(2):
                await burst.fire(chat_request(url, chat_body(model, True, warm_tokens)))
            request = chat_request(url, chat_body(model, True, tokens))
            phases.append(await burst_rounds(burst, request, args.rounds, args.gap, proxy, "no profiler"))
            profiler = choose_profiler(args, pid)
            if profiler is not None:
                profiler.start()
                try:
                    phases.append(await burst_rounds(burst, request, args.rounds, args.gap, proxy, profiler.label))
                finally:
                    profiler.stop()
        finally:
            await burst.close()
    finally:
        fleet.close()
    return {
        "target": args.target,
        "upstream": args.upstream,
        "profiler": args.profiler,
        "rate": args.rate,
        "nonblocking": args.nonblocking,
        "gap_seconds": args.gap,
        "streams": STREAMS,
        "tokens": tokens,
        "code": code_under_test(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "phases": [phase.as_json() for phase in phases],
    }


# -- printing -------------------------------------------------------------------

def describe(run: dict) -> list[str]:
    code = run["code"]
    commit = code["commit"] + (" + uncommitted changes" if code["changed_files"] else "")
    lines = [
        (f"{run['target']}, {run['upstream']} sim, bursts of {run['streams']} streams of {run['tokens']} tokens, "
         f"{run['gap_seconds'] * 1e3:.0f} ms apart"),
        f"code: {code['swaplab']} ({commit or 'not a git checkout'}); Python {run['python']}, aiohttp {run['aiohttp']}",
        "CPU of the proxy process per request (user + system, over all the phase's bursts):",
    ]
    clean = run["phases"][0]["cpu_ms_per_request"]
    for phase in run["phases"]:
        note = ""
        if phase is not run["phases"][0]:
            note = f"  x{phase['cpu_ms_per_request'] / clean:.2f} the unprofiled figure: the profiler's own cost"
        lines.append(
            f"  {phase['name']:<16} {phase['cpu_ms_per_request']:.3f} ms  ({phase['requests']} requests; "
            f"TTFB p50 {phase['ttfb_p50_ms_median']:.1f} ms){note}"
        )
    return lines


def load_run(prefix: Path) -> tuple[dict, dict[str, collections.Counter], float, list[str]]:
    """A run's record, its tables in µs per request, their total, and notes on how they were made.

    Either profiler's figures are shares of what it saw, applied to the CPU per request
    measured without a profiler: both inflate what they watch (py-spy by stopping the
    process, cProfile most in the smallest functions), the shares less than the sums.
    """
    run = json.loads(beside(prefix, ".json").read_text())
    own_code = OWN_CODE[run["target"]]
    total = run["phases"][0]["cpu_ms_per_request"] * 1e3
    if run["profiler"] == "py-spy":
        stacks = parse_collapsed(beside(prefix, ".pyspy.txt").read_text())
        summary = sample_summary(stacks)
        counts, seen = sample_tables(stacks, own_code), summary["samples"]
        notes = [
            (f"py-spy: {seen} samples at {run['rate']} Hz, threads {summary['by_thread']}; "
             f"{summary['waits_left_out']} samples of waiting threads left out (epoll, Condition.wait, waitpid, idle pool)"),
            "µs/req: a row's share of the samples times the CPU per request without a profiler (py-spy counts a",
            "thread that waits for a core as running: shares are of runnable time, an estimate of CPU's)",
        ]
    elif run["profiler"] == "cprofile":
        counts = cprofile_tables(beside(prefix, ".prof"), own_code)
        seen = sum(counts["own"].values())
        notes = [
            f"cProfile: {seen:.2f} s in the event loop's thread over the profiled bursts, epoll waits left out",
            "µs/req: a row's share of that time times the CPU per request without a profiler (cProfile inflates",
            "small functions most: rank with these figures rather than add them)",
        ]
    else:
        return run, {}, total, ["no profile (--profiler none)"]
    tables = {name: collections.Counter({key: value * total / seen for key, value in counter.items()})
              for name, counter in counts.items()}
    return run, tables, total, notes


TITLES = {
    "own": "Own time: the function on top of the stack",
    "steps": "Steps: each sample charged to the deepest frame of the proxy's own code "
             "(library time to the function of ours that called it)",
    "cumulative": "Cumulative: the proxy's own functions, callees included (nested: rows overlap)",
}


def print_table(title: str, rows: list[tuple[str, float]], total: float) -> None:
    print(f"\n{title}")
    print(f"{'µs/req':>8} {'%':>6}  function")
    for key, value in rows:
        print(f"{value:>8.1f} {100 * value / total:>5.1f}%  {key}")


def print_comparison(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{title}")
    print(f"{'this':>8} {'against':>8} {'change':>8}  function   (µs per request)")
    for key, mine, theirs in rows:
        print(f"{mine:>8.1f} {theirs:>8.1f} {mine - theirs:>+8.1f}  {key}")


def print_tables(prefix: Path, top: int, against: Path | None) -> None:
    run, tables, total, notes = load_run(prefix)
    print("\n".join(describe(run)))
    if against is not None:
        other, other_tables, other_total, other_notes = load_run(against)
        print(f"\nagainst {against}:")
        print("\n".join("  " + line for line in describe(other)))
        for note in notes + other_notes:
            print(note)
        for name in tables:
            mine, theirs = tables[name], other_tables.get(name, collections.Counter())
            keys = sorted(set(mine) | set(theirs), key=lambda key: -max(mine[key], theirs[key]))[:top]
            print_comparison(TITLES[name], [(key, mine[key], theirs[key]) for key in keys])
        print(f"\n{total:>8.1f} {other_total:>8.1f} {total - other_total:>+8.1f}  in all (CPU per request, no profiler)")
        return
    for note in notes:
        print(note)
    for name, counter in tables.items():
        print_table(TITLES[name], counter.most_common(top), total)


# -- command line ------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="start everything, burst one proxy while it is profiled, print the tables")
    run.add_argument("--target", choices=OWN_CODE, default="swaplab", help="the proxy to burst and profile")
    run.add_argument("--upstream", choices=MODEL_OF, default="unpaced",
                     help="the sim behind it: unpaced (16-token streams) or paced at 50 tok/s (8 tokens)")
    run.add_argument("--rounds", type=int, default=200,
                     help="bursts of 64 per phase: first without a profiler (the CPU figure), then profiled")
    run.add_argument("--profiler", choices=("py-spy", "cprofile", "none"), default="py-spy",
                     help="py-spy attaches for the profiled phase; cProfile is loaded with the proxy and "
                     "switched on (SIGUSR1) and off (SIGUSR2) around that phase")
    run.add_argument("--rate", type=int, default=250, help="py-spy's samples per second")
    run.add_argument("--nonblocking", action="store_true",
                     help="py-spy reads the process without stopping it (cheaper, stacks can tear)")
    run.add_argument("--gap", type=float, default=0.03,
                     help="seconds of pause before each burst, as overhead.py (each is also followed by 10 ms)")
    run.add_argument("--out", type=Path, help="prefix of the files written (default: a new temporary folder)")
    run.add_argument("--top", type=int, default=15, help="rows per table")
    run.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(PY).parent / "py-spy"),
                     help="the py-spy executable (`pip install py-spy`)")
    tables = commands.add_parser("tables", help="print a run's tables again, or two runs side by side")
    tables.add_argument("prefix", type=Path, help="the --out of a run")
    tables.add_argument("--against", type=Path, help="another run's --out, to compare with")
    tables.add_argument("--top", type=int, default=15, help="rows per table")
    return top


def main() -> int:
    args = parser().parse_args()
    if args.command == "tables":
        print_tables(args.prefix, args.top, args.against)
        return 0
    if args.profiler == "py-spy" and not Path(args.py_spy).exists():
        raise SystemExit(f"{args.py_spy}: no py-spy here; `pip install py-spy`, or --py-spy PATH")
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="profile-burst-")) / f"{args.target}-{args.upstream}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run = asyncio.run(profile(args))
    beside(args.out, ".json").write_text(json.dumps(run, indent=2))
    print_tables(args.out, args.top, None)
    written = f"{args.out}.json" + (" and the profile beside it" if args.profiler != "none" else "")
    print(f"\n(written: {written}; `tables {args.out}` prints this again)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
