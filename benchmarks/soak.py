"""A randomized fault soak of the router: many clients, every fault at once, invariants checked all along.

For `--seconds`, `--clients` concurrent clients send chat requests (streaming and not)
through `swaplab serve` to `swaplab sim` backends in an exclusive swap group (two of
whose models are swapped out by sleep, imitating vLLM's and SGLang's sleep APIs), a
non-swapping group, a persistent group and the implicit group of ungrouped models,
while faults are injected: client disconnects before and after the first byte,
backend crashes (`--crash-after-tokens`) and SIGKILLs from outside, `/unload` (all and
one), `/load`, config reloads by SIGHUP (one entry changed, or only a comment), TTL
expiries, slow loads and a backend whose health check lies. Invariants are checked
continuously (see docs/reliability.md): one process per model, `/running` agreeing
with the processes that exist, every request ending in success or a clean, explained
error before its deadline, batching in the swap group; then no backend may outlive the
router, stopped by SIGTERM and, in a second phase, by SIGKILL.

    .venv/bin/python benchmarks/soak.py --seconds 600 [--seed N] [--clients 24] [--json out.json]

Exit status 0 only with no invariant violated. The seed fixes the config, every
client's choices and the fault schedule, so a failing run can be replayed (the
timing, and so the interleaving, still varies from run to run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp

from swaplab.sim.personality import sleep_ready

PYTHON = sys.executable

# The kinds of fault the summary reports, in its order; the test requires each at least once.
FAULT_KINDS = (
    "crash", "kill", "disconnect-before", "disconnect-after", "unload", "load", "reload",
    "slow load", "ttl expiry", "lying health",
)
# What the injector does on its own schedule (the other kinds come from clients and traffic).
INJECTED_ACTIONS = (
    "kill", "unload-all", "unload-one", "unload-while-starting", "load", "reload-changed", "reload-unchanged",
)

# A 502 for a backend the router could not reach, or that dropped the connection...
CONNECT_FAILURE = re.compile(
    r"cannot connect|connect call failed|connection refused|could not connect|connection reset|reset by peer"
    r"|closed the connection|broken pipe",
    re.IGNORECASE,
)
# ...unless it says why: the model crashed and did not come back, is backing off, was stopped.
EXPLAINED_FAILURE = re.compile(r"crash|restart|exited|back.?off|in a row|unload|stopped|reload", re.IGNORECASE)
# aiohttp's own words in an error message: the router must explain in its own.
INTERNALS = re.compile(
    r"TransferEncodingError|ClientPayloadError|ClientConnectorError|ClientOSError|ServerDisconnectedError"
    r"|ContentLengthError|Connect call failed|Response payload is not completed|Cannot connect to host"
    r"|Server disconnected|aiohttp\.|Traceback"
)
LOADING = re.compile(r"\bis loading\b|loading model", re.IGNORECASE)


# -- the config ---------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """One sim backend of the soak's config, and how much of the traffic it gets."""

    id: str
    group: str | None  # "swap", "side", "keep"; None = ungrouped
    weight: float
    ttft_ms: int = 0
    tokens_per_second: float = 0.0
    load_seconds: float = 0.0
    health_before_ready: bool = False
    crash_after_tokens: int = 0
    ttl: int = 0
    check_endpoint: str | None = None
    sleep: str | None = None  # a swap puts it to sleep through this engine's API (vllm, sglang)

    def argv(self, marker: str) -> list[str]:
        # `--model MARKER-ID` makes each process findable by its command line and
        # attributable to its model, whatever the router says about it.
        argv = [PYTHON, "-m", "swaplab", "sim", "--port", "${PORT}", "--model", f"{marker}{self.id}"]
        if self.ttft_ms:
            argv += ["--ttft-ms", str(self.ttft_ms)]
        if self.tokens_per_second:
            argv += ["--tokens-per-second", f"{self.tokens_per_second:g}"]
        if self.load_seconds:
            argv += ["--load-seconds", f"{self.load_seconds:g}"]
        if self.health_before_ready:
            argv.append("--health-before-ready")
        if self.crash_after_tokens:
            argv += ["--crash-after-tokens", str(self.crash_after_tokens)]
        if self.sleep:
            # Started as the engine must be to sleep (its contract's flags), serving the model's id.
            argv += ["--engine", self.sleep, "--served-model-name", self.id, *sleep_ready(self.sleep)[0],
                     "--sleep-seconds", "0.05", "--wake-seconds", f"{SLEEP_WAKE_SECONDS:g}"]
        return argv


GROUPS = {
    # One member at a time, and starting one stops every other non-persistent group.
    "swap": {"swap": True, "exclusive": True},
    # Members run together and stop nobody.
    "side": {"swap": False, "exclusive": False},
    # Never stopped to make room: only its ttl, /unload, a reload or a fault stops it,
    # so a disappearance that none of those explains is a ttl expiry.
    "keep": {"swap": False, "exclusive": False, "persistent": True},
}

# The sleeping models: each holds this much host RAM asleep (declared), within a budget
# that takes both; a wake takes a moment, a tenth of swap-slow's cold start.
SLEEP_HOST_GIB = 1
SLEEP_BUDGET_GIB = 2
SLEEP_WAKE_SECONDS = 0.15
# The states in which a model's process runs.
LIVE_STATES = ("starting", "ready", "stopping", "falling_asleep", "sleeping", "waking")

# keep-ttl's traffic comes in bursts, so that its ttl expires in every gap.
TTL_BURST_SECONDS = 2.0
TTL_GAP_SECONDS = 3.5


def crash_after(rng: random.Random) -> int:
    # Requests ask for 2-24 tokens (13 on average) and a swapped-out process starts its count
    # again, so the crash point must fall within a residency's first few requests: with
    # 25-90 a clean clone on a loaded CI machine ran a 40 s soak without a single crash.
    return rng.randint(8, 36)


def model_specs(rng: random.Random) -> list[ModelSpec]:
    return [
        ModelSpec("swap-fast", "swap", 14, ttft_ms=20, tokens_per_second=300),
        ModelSpec("swap-slow", "swap", 10, ttft_ms=30, tokens_per_second=200, load_seconds=1.5),
        ModelSpec("swap-crash", "swap", 10, ttft_ms=25, tokens_per_second=200, crash_after_tokens=crash_after(rng)),
        # Swapped out by sleep, not stop: its process stays through every swap until a fault ends it.
        ModelSpec("swap-sleepy", "swap", 10, ttft_ms=20, tokens_per_second=300, sleep="vllm"),
        ModelSpec("swap-sleepy-sglang", "swap", 6, ttft_ms=20, tokens_per_second=300, load_seconds=1.0,
                  sleep="sglang"),
        # /health says 200 while generation still answers 503 "loading": requests in
        # that window get the backend's 503, a clean error.
        ModelSpec("side-lying", "side", 10, ttft_ms=15, load_seconds=2.0, health_before_ready=True, ttl=3),
        # The same lie, but readiness is a real one-token generation: never a 503 "loading".
        ModelSpec("side-generate", "side", 10, ttft_ms=15, load_seconds=1.0, health_before_ready=True,
                  check_endpoint="generate"),
        ModelSpec("side-crash", "side", 10, ttft_ms=40, tokens_per_second=100, crash_after_tokens=crash_after(rng)),
        ModelSpec("keep-ttl", "keep", 14, ttft_ms=10, tokens_per_second=400, ttl=2),
        ModelSpec("solo", None, 5, ttft_ms=20),
    ]


def render_config(specs: Iterable[ModelSpec], start_port: int, marker: str, generation: int) -> str:
    """The YAML the router reads; `generation` only changes a comment (a reload that changes nothing)."""
    specs = list(specs)
    lines = [
        f"# swaplab soak, config generation {generation}",
        "healthCheckTimeout: 15",
        "unloadTimeout: 3",
        f"startPort: {start_port}",
        f"hostMemory: {{budgetGiB: {SLEEP_BUDGET_GIB}}}",
        "models:",
    ]
    for spec in specs:
        lines += [f"  {spec.id}:", f"    cmd: {shlex.join(spec.argv(marker))}", "    concurrencyLimit: 200"]
        if spec.ttl:
            lines.append(f"    ttl: {spec.ttl}")
        if spec.check_endpoint:
            lines.append(f"    checkEndpoint: {spec.check_endpoint}")
        if spec.sleep:
            lines.append(f"    sleep: {{engine: {spec.sleep}, hostMemoryGiB: {SLEEP_HOST_GIB}, timeout: 10}}")
            env = sleep_ready(spec.sleep)[1]
            if env:
                lines.append(f"    env: [{', '.join(f'{name}={value}' for name, value in env.items())}]")
    lines.append("groups:")
    for name, flags in GROUPS.items():
        members = [spec.id for spec in specs if spec.group == name]
        options = ", ".join(f"{key}: {str(value).lower()}" for key, value in flags.items())
        lines.append(f"  {name}: {{{options}, members: [{', '.join(members)}]}}")
    return "\n".join(lines) + "\n"


def changed_entry(spec: ModelSpec, rng: random.Random) -> ModelSpec:
    """The same model with a different entry: a new crash point, or a new TTFT."""
    if spec.crash_after_tokens:
        return replace(spec, crash_after_tokens=crash_after(rng))
    return replace(spec, ttft_ms=max(5, spec.ttft_ms + rng.choice((-5, 5))))


# -- processes ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_block(size: int) -> int:
    """The first of `size` consecutive free ports, below the ephemeral range."""
    for _ in range(200):
        base = random.randrange(20000, 32000 - size)
        sockets = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no block of free ports found")


@dataclass(frozen=True)
class BackendProcess:
    """A live (not zombie) sim process of the soak, identified by pid and start time."""

    pid: int
    start_ticks: int
    parent: int


def scan_backends(marker: str) -> dict[str, list[BackendProcess]]:
    """Every live process whose argv has `--model MARKER<id>`, by model id.

    Reads /proc directly: a full scan costs under a millisecond, so it can run ten
    times a second on the event loop. Zombies (exited, not yet reaped) do not count.
    """
    needle = marker.encode()
    found: dict[str, list[BackendProcess]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as file:
                raw = file.read()
        except OSError:
            continue
        if needle not in raw:
            continue
        model = model_of(raw.split(b"\0"), needle)
        if model is None:
            continue
        stat = process_stat(int(entry.name))
        if stat is None or stat[0] in "ZX":
            continue
        found.setdefault(model, []).append(BackendProcess(int(entry.name), stat[2], stat[1]))
    return found


def model_of(argv: list[bytes], marker: bytes) -> str | None:
    for index, arg in enumerate(argv[:-1]):
        if arg == b"--model" and argv[index + 1].startswith(marker):
            return argv[index + 1][len(marker):].decode()
    return None


def process_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks) from /proc/PID/stat, or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def kill_backend(process: BackendProcess) -> bool:
    """SIGKILL it if it is still the same process (not a reused pid)."""
    stat = process_stat(process.pid)
    if stat is None or stat[2] != process.start_ticks or stat[0] in "ZX":
        return False
    try:
        os.kill(process.pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def kill_leftovers(marker: str) -> None:
    for processes in scan_backends(marker).values():
        for process in processes:
            kill_backend(process)


class RouterProcess:
    """`swaplab serve` as a child, its output in a file."""

    def __init__(self, config: Path, workdir: Path, port: int, name: str):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            [PYTHON, "-m", "swaplab", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}",
             "--state-dir", str(workdir / "state"), "--db", str(workdir / "swaplab.db")],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"the router exited with {self.popen.returncode}: see {self.log_path}")
                try:
                    async with session.get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=2)) as response:
                        if response.status == 200:
                            return
                except (TimeoutError, aiohttp.ClientError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the router did not answer /health within {timeout:g} s: see {self.log_path}")
                await asyncio.sleep(0.05)

    async def wait_exit(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.05)
        return self.popen.returncode

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._log.close()


# -- what a client saw, and what it means ----------------------------------------------


@dataclass
class Reply:
    """What came back for one request."""

    status: int | None  # None: no response at all
    event_stream: bool = False
    body: bytes = b""
    broke: str | None = None  # the client's error while reading, if the body broke off


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "ok", "clean" or "violation"
    kind: str  # for clean errors and violations: which
    message: str = ""  # the error the client was given, or what was wrong
    connect_failure: bool = False  # a bare "could not reach the backend" (see raw_connect_failure)


def expected_content(tokens: int) -> str:
    """The sim's answer to a request for `tokens` tokens (docs/sim.md)."""
    return "".join(f" tok{index}" for index in range(tokens))


def error_message(document: object) -> str | None:
    """The message of an OpenAI-style error document, or None when it is not one."""
    if isinstance(document, dict) and isinstance(document.get("error"), dict):
        message = document["error"].get("message")
        if isinstance(message, str) and message.strip():
            return message
    return None


def sse_data(body: bytes) -> list[str]:
    """The `data:` payloads of an event stream, in order."""
    payloads = []
    for event in body.decode(errors="replace").split("\n\n"):
        for line in event.splitlines():
            if line.startswith("data:"):
                payloads.append(line[5:].strip())
    return payloads


def raw_connect_failure(message: str) -> bool:
    """A bare "could not reach the backend", with no word of a crash, a restart or a stop."""
    return CONNECT_FAILURE.search(message) is not None and EXPLAINED_FAILURE.search(message) is None


def _explained(status: int, message: str, kind: str) -> Verdict:
    connect = raw_connect_failure(message)
    if INTERNALS.search(message):
        return Verdict("violation", "internals in error", message, connect_failure=connect)
    return Verdict("clean", kind, message, connect_failure=connect)


def classify(reply: Reply, tokens: int) -> Verdict:
    """Success, a clean explained error, or a violation, from what the client saw alone.

    A connection failure to the backend is flagged (`connect_failure`), not judged:
    whether the router could have restarted the backend depends on what was going on
    (see `Soak._judge`).
    """
    if reply.status is None:
        return Verdict("violation", "no response", reply.broke or "the connection closed before any response")
    if reply.status == 200 and reply.event_stream:
        payloads = sse_data(reply.body)
        last = payloads[-1] if payloads else ""
        if last == "[DONE]":
            content = ""
            for payload in payloads[:-1]:
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    return Verdict("violation", "corrupt", f"not JSON: {payload[:200]}")
                for choice in chunk.get("choices") or ():
                    content += (choice.get("delta") or {}).get("content") or ""
            if content != expected_content(tokens):
                return Verdict("violation", "corrupt", f"stream content {content[:120]!r} for {tokens} tokens")
            return Verdict("ok", "")
        try:
            message = error_message(json.loads(last)) if last else None
        except ValueError:
            message = None
        if message is None:
            detail = reply.broke or "the stream ended without [DONE] or an error event"
            return Verdict("violation", "truncated", f"{detail}; last event: {last[:200]!r}")
        return _explained(200, message, "stream error event")
    try:
        document = json.loads(reply.body)
    except ValueError:
        document = None
    if reply.status == 200:
        try:
            content = document["choices"][0]["message"]["content"]
        except (TypeError, KeyError, IndexError):
            detail = reply.broke or f"not a completion: {reply.body[:200]!r}"
            return Verdict("violation", "truncated", detail)
        if content != expected_content(tokens):
            return Verdict("violation", "corrupt", f"content {str(content)[:120]!r} for {tokens} tokens")
        return Verdict("ok", "")
    message = error_message(document)
    if message is None:
        return Verdict("violation", "unexplained error", f"HTTP {reply.status}: {reply.body[:200]!r}")
    if reply.status == 429:
        return _explained(429, message, "429 concurrency limit")
    if reply.status == 503 and LOADING.search(message):
        return _explained(503, message, "503 backend loading")
    return _explained(reply.status, message, f"HTTP {reply.status}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the soak ------------------------------------------------------------------------


@dataclass
class Call:
    """One request in flight, as the client tracks it."""

    id: str
    model: str
    stream: bool
    tokens: int
    disconnect: str | None  # "before", "after" or None
    sent: float
    deadline: float
    ttft_ms: int
    phase: str = "sent"  # sent -> headers -> body (the first byte of the answer itself)
    status: int | None = None
    first_byte: float | None = None
    received: int = 0
    preview: bytes = b""  # the first body bytes, for a hang's report
    before: Sample | None = None


@dataclass
class Sample:
    """One look at the router and the processes, as close together as they can be read."""

    time: float
    running: dict[str, dict]
    processes: dict[str, list[BackendProcess]]


@dataclass
class Event:
    """Something the soak did, or saw happen, to one model (None: all of them), over a time span."""

    kind: str
    model: str | None
    start: float
    end: float
    until_gone: tuple[BackendProcess, ...] = ()  # the event lasts until these processes have exited


@dataclass
class Violation:
    time: float
    kind: str
    model: str | None
    request: str | None
    detail: str


@dataclass
class Figures:
    requests: Counter = field(default_factory=Counter)  # ok, clean, violation, disconnected, shutdown
    requests_by_model: Counter = field(default_factory=Counter)
    ok_by_model: Counter = field(default_factory=Counter)
    clean: Counter = field(default_factory=Counter)
    clean_examples: dict[str, str] = field(default_factory=dict)
    faults: Counter = field(default_factory=Counter)
    injected: Counter = field(default_factory=Counter)  # the injector's actions, finer than `faults`
    starts: Counter = field(default_factory=Counter)
    added_latency: list[float] = field(default_factory=list)
    success_latency: list[float] = field(default_factory=list)
    running_read_max: float = 0.0


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.marker = f"soak-{self.rng.getrandbits(32):08x}-"
        self.specs = {spec.id: spec for spec in model_specs(self.rng)}
        self.start_port = free_port_block(len(self.specs))
        self.config_path = workdir / "config.yaml"
        self.generation = 0
        self.figures = Figures()
        # Set when a fault counted from what the soak watches is first seen (see provoke_missing).
        self.seen_fault = {kind: asyncio.Event() for kind in ("crash", "ttl expiry")}
        self.violations: list[Violation] = []
        self.events: list[Event] = []
        self.samples: deque[Sample] = deque(maxlen=600)
        self.logs: deque[tuple[float, str, str]] = deque(maxlen=5000)
        self.router: RouterProcess | None = None
        self.session: aiohttp.ClientSession | None = None
        self.began = time.monotonic()
        self.stopping = False
        self.shutdown_at: float | None = None
        self.admin_tasks: set[asyncio.Task] = set()
        self.latency_pending: deque[Call] = deque()
        self.open_events: list[Event] = []
        self.last_swap_member: str | None = None
        self.swap_switches = 0
        self._ids = 0
        self._seen: dict[str, set[BackendProcess]] = {}
        self._mismatches: dict[tuple, tuple[float, int]] = {}
        self._reported: set[tuple] = set()
        self._printed: Counter = Counter()
        self._shutdown_report: list[str] = []

    # -- bookkeeping ---------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.began

    def violation(self, kind: str, model: str | None, request: str | None, detail: str) -> None:
        entry = Violation(round(self.now(), 3), kind, model, request, detail)
        self.violations.append(entry)
        self._printed[kind] += 1
        if self._printed[kind] <= self.args.print_violations:
            context = self._context(model)
            print(f"VIOLATION t={entry.time:.2f}s {kind} model={model} request={request}: {detail}{context}", flush=True)
        elif self._printed[kind] == self.args.print_violations + 1:
            print(f"VIOLATION ... further {kind!r} violations are counted, not printed", flush=True)

    def _context(self, model: str | None) -> str:
        """What /running and the router's log said about the model just before."""
        lines = []
        if self.samples and model:
            entry = self.samples[-1].running.get(model)
            processes = self.samples[-1].processes.get(model, [])
            lines.append(f"  /running: {json.dumps(entry) if entry else 'not listed'}; processes: "
                         f"{[p.pid for p in processes]}")
        if model:
            now = self.now()
            done = [f"{e.kind} at t={e.start:.2f}s" for e in self.events[-30:]
                    if e.model in (None, model) and now - 10 < e.start <= now]
            if done:
                lines.append(f"  faults on it in the last 10 s: {', '.join(done)}")
            recent = [text for _, source, text in list(self.logs)[-400:] if source == "router" and model in text][-4:]
            lines += [f"  router log: {text.splitlines()[0]}" for text in recent]
        return ("\n" + "\n".join(lines)) if lines else ""

    def event(self, kind: str, model: str | None, start: float, end: float) -> Event:
        entry = Event(kind, model, start, end)
        self.events.append(entry)
        return entry

    def deliberate_stop_near(self, model: str, start: float, end: float) -> bool:
        """Was `model` being stopped on purpose (unload, reload, ttl, shutdown) during [start, end]?"""
        return self.faults_touching(model, start, end, ("unload", "reload", "ttl", "shutdown"))

    def faults_touching(self, model: str, start: float, end: float, kinds: Iterable[str]) -> bool:
        """Did an event of one of `kinds` concern `model` (or every model) during [start, end]?"""
        kinds = set(kinds)
        for entry in reversed(self.events):
            if entry.start < start - self.args.deadline - 10:
                return False  # events are in order of start, and none lasts that long
            if entry.kind in kinds and entry.model in (None, model) and entry.start <= end and entry.end >= start:
                return True
        return False

    def write_config(self) -> None:
        text = render_config(self.specs.values(), self.start_port, self.marker, self.generation)
        temporary = self.config_path.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(self.config_path)  # the router never reads half a file

    # -- the run -------------------------------------------------------------------

    async def run(self) -> int:
        self.write_config()
        self.router = RouterProcess(self.config_path, self.workdir, free_port(), "router-1")
        await self.router.wait_ready()
        # A fresh connection per request: a failure is then always the router's doing, never
        # a pooled connection that happened to be closed as it was reused.
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        print(f"soak: {self.args.seconds:g} s, seed {self.args.seed}, {self.args.clients} clients, "
              f"router pid {self.router.pid} on {self.router.url}, work dir {self.workdir}", flush=True)
        print("models: " + ", ".join(f"{s.id} ({s.group or 'ungrouped'})" for s in self.specs.values()), flush=True)
        self.began = time.monotonic()
        background = [
            asyncio.ensure_future(self.watch_logs()),
            asyncio.ensure_future(self.monitor()),
            asyncio.ensure_future(self.progress()),
        ]
        injector = asyncio.ensure_future(self.injector())
        clients = [asyncio.ensure_future(self.client(index)) for index in range(self.args.clients)]
        await asyncio.sleep(self.args.seconds)
        # Drain: no new requests or faults; every request in flight ends, or hangs past its deadline.
        self.stopping = True
        await asyncio.gather(injector, *clients)
        if self.admin_tasks:
            await asyncio.gather(*self.admin_tasks, return_exceptions=True)
        await self.provoke_missing()
        await self.check_batching()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self.shutdown_by_sigterm()
        await self.session.close()
        await self.shutdown_by_sigkill()
        return self.report()

    # -- clients -------------------------------------------------------------------

    def weights(self) -> tuple[list[str], list[float]]:
        in_burst = self.now() % (TTL_BURST_SECONDS + TTL_GAP_SECONDS) < TTL_BURST_SECONDS
        models = [m for m in self.specs if m != "keep-ttl" or in_burst]
        return models, [self.specs[m].weight for m in models]

    async def client(self, index: int) -> None:
        rng = random.Random(f"{self.args.seed}-client-{index}")
        await asyncio.sleep(rng.uniform(0, 0.5))
        while not self.stopping:
            models, weights = self.weights()
            await self.request(rng, rng.choices(models, weights)[0])
            await asyncio.sleep(rng.uniform(0, self.args.think))

    async def provoke_missing(self) -> None:
        """In the drain, bring about each traffic-driven fault that the run did not produce.

        How often a crash point, a disconnect or a quiet spell longer than a ttl comes up
        depends on the random draws and on how fast this machine is right now (a loaded CI
        machine once ran 40 s with keep-ttl never idle for its 2 s; 5% of ~120 requests
        leave a disconnect after the first byte absent about one run in ten). Here nothing
        else runs: a request to swap-slow is abandoned 10 ms after it is sent (its load or
        its 30 ms TTFT is still ahead), a stream from it (24 tokens at 200 tokens/s) is
        closed after its first chunks, side-crash is sent requests of 24 tokens until it
        crashes (its crash point is at most 36 tokens into a process), each at most four
        times; then keep-ttl is loaded once and left idle, so its ttl must stop it. A fault still missing after
        that is the router's failure (or this machine's), reported by the summary.
        """
        rng = random.Random(f"{self.args.seed}-drain")
        for kind, model, disconnect in (("disconnect-before", "swap-slow", "before"),
                                        ("disconnect-after", "swap-slow", "after"),
                                        ("crash", "side-crash", None)):
            for _ in range(4):
                if self.figures.faults[kind]:
                    break
                await self.request(rng, model, tokens=24, disconnect=disconnect)
                if kind in self.seen_fault:  # counted from the log, which may trail the reply
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.seen_fault[kind].wait(), 2.0)
        expiry = self.seen_fault["ttl expiry"]
        if not expiry.is_set():
            await self.admin_call("load", "keep-ttl")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(expiry.wait(), self.specs["keep-ttl"].ttl + 15.0)

    def new_call(self, rng: random.Random, model: str, tokens: int | None = None,
                 disconnect: str | None = None) -> Call:
        """A request's draws; `tokens` and `disconnect` given instead (the drain's provocations)."""
        self._ids += 1
        stream = rng.random() < 0.6 or disconnect == "after"
        roll = rng.random()
        if disconnect is None and roll < self.args.disconnect_rate:
            disconnect = "before"
        elif disconnect is None and stream and roll < 2 * self.args.disconnect_rate:
            disconnect = "after"
        sent = self.now()
        return Call(
            f"r{self._ids}", model, stream, tokens or rng.randint(2, 24), disconnect, sent, sent + self.args.deadline,
            self.specs[model].ttft_ms, before=self.samples[-1] if self.samples else None,
        )

    async def request(self, rng: random.Random, model: str, tokens: int | None = None,
                      disconnect: str | None = None) -> None:
        call = self.new_call(rng, model, tokens, disconnect)
        self.figures.requests_by_model[model] += 1
        exchange = asyncio.ensure_future(self.exchange(call, rng))
        if call.disconnect == "before":
            await asyncio.wait({exchange}, timeout=0.01 if disconnect else rng.uniform(0.01, 1.5))
            if not exchange.done() and call.first_byte is None:
                exchange.cancel()  # the client gives up before any byte came back
                await asyncio.gather(exchange, return_exceptions=True)
                self.figures.faults["disconnect-before"] += 1
                self.figures.requests["disconnected by us"] += 1
                return
        try:
            reply = await asyncio.wait_for(exchange, max(0.0, call.deadline - self.now()))
        except TimeoutError:
            self.judge_hang(call)
            return
        if reply is None:  # we closed it mid-stream on purpose
            self.figures.faults["disconnect-after"] += 1
            self.figures.requests["disconnected by us"] += 1
            return
        self.judge(call, reply)

    async def exchange(self, call: Call, rng: random.Random) -> Reply | None:
        assert self.router is not None and self.session is not None
        body = {
            "model": call.model, "stream": call.stream, "max_tokens": call.tokens,
            "messages": [{"role": "user", "content": f"soak request {call.id}"}],
        }
        try:
            async with self.session.post(f"{self.router.url}/v1/chat/completions", json=body) as response:
                call.phase, call.status = "headers", response.status
                event_stream = response.content_type == "text/event-stream"
                chunks: list[bytes] = []
                closing_after = rng.randint(1, 4) if call.disconnect == "after" and response.status == 200 else None
                try:
                    async for chunk in response.content.iter_any():
                        # The first byte of the answer: an event stream's first `data:` event
                        # (a router may send `: keep-alive` comments while the request waits).
                        if call.first_byte is None and (not event_stream or b"data:" in chunk):
                            call.phase, call.first_byte = "body", self.now()
                        chunks.append(chunk)
                        call.received += len(chunk)
                        if len(call.preview) < 300:
                            call.preview += chunk[: 300 - len(call.preview)]
                        leaving = closing_after is not None and call.first_byte is not None
                        if leaving and len(chunks) >= closing_after and b"[DONE]" not in chunk:
                            response.close()  # the client goes away mid-stream
                            return None
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as error:
                    return Reply(response.status, event_stream, b"".join(chunks), f"{type(error).__name__}: {error}")
                return Reply(response.status, event_stream, b"".join(chunks))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            return Reply(None, broke=f"{type(error).__name__}: {error}")

    def judge_hang(self, call: Call) -> None:
        if self.shutdown_at is not None:
            self.figures.requests["cut by shutdown"] += 1
            return
        self.figures.requests["violation"] += 1
        where = {"sent": "no response header",
                 "headers": f"HTTP {call.status} header, then {call.received} bytes and no answer ({call.preview[:80]!r})",
                 "body": f"{call.received} body bytes ({call.preview[:300]!r}), then nothing"}[call.phase]
        self.violation("hang", call.model, call.id,
                       f"{'stream' if call.stream else 'non-stream'} request sent at t={call.sent:.2f}s "
                       f"still running at its deadline ({self.args.deadline:g} s): {where}")

    def judge(self, call: Call, reply: Reply) -> None:
        ended = self.now()
        if self.shutdown_at is not None and ended >= self.shutdown_at - 0.5:
            self.figures.requests["cut by shutdown"] += 1
            return
        verdict = classify(reply, call.tokens)
        spec = self.specs[call.model]
        if verdict.connect_failure and not self.deliberate_stop_near(call.model, call.sent - 1.0, ended + 0.5):
            verdict = Verdict("violation", "connect 502",
                              f"HTTP {reply.status} for a backend the router could have restarted: {verdict.message}")
        elif verdict.kind == "503 backend loading" and spec.check_endpoint == "generate":
            verdict = Verdict("violation", "served while loading",
                              f"checkEndpoint generate, yet the request reached a loading backend: {verdict.message}")
        self.figures.requests[verdict.outcome] += 1
        if verdict.outcome == "clean":
            self.note_clean(verdict.kind, verdict.message)
        elif verdict.outcome == "violation":
            self.violation(verdict.kind, call.model, call.id,
                           f"{'stream' if call.stream else 'non-stream'} sent t={call.sent:.2f}s, "
                           f"ended t={ended:.2f}s, HTTP {reply.status}: {verdict.message[:400]}")
        else:
            self.figures.ok_by_model[call.model] += 1
            self.figures.success_latency.append(ended - call.sent)
            if call.stream and call.first_byte is not None:
                self.latency_pending.append(call)  # judged once the monitor has looked again

    def note_added_latency(self, call: Call, after: Sample) -> None:
        """Router TTFB minus the sim's TTFT, for streams that went straight to an already ready backend.

        Straight: the last look before sending saw the model ready with nothing queued
        for it, the first look after the first byte (`after`) saw the same process still
        ready, and no fault touched the model in between.
        """
        before = call.before
        entry = before.running.get(call.model) if before is not None else None
        if before is None or call.sent - before.time > 0.3 or entry is None:
            return
        if entry.get("state") != "ready" or entry.get("queued"):
            return
        later = after.running.get(call.model, {})
        if later.get("state") != "ready" or later.get("pid") != entry.get("pid"):
            return
        if self.faults_touching(call.model, call.sent, call.first_byte, ("kill", "unload", "reload")):
            return
        self.figures.added_latency.append(call.first_byte - call.sent - call.ttft_ms / 1000)

    # -- faults --------------------------------------------------------------------

    async def injector(self) -> None:
        """One action every `--fault-interval` seconds or so; every kind once per shuffled round."""
        rng = random.Random(f"{self.args.seed}-faults")
        queue: list[str] = []
        await asyncio.sleep(1.0)
        while not self.stopping:
            if not queue:
                queue = list(INJECTED_ACTIONS)
                rng.shuffle(queue)
            action = queue.pop()
            if not await self.inject(action, rng):
                queue.append(action)  # nothing to act on yet: try it again next time
            await asyncio.sleep(rng.uniform(0.5, 1.5) * self.args.fault_interval)

    async def inject(self, action: str, rng: random.Random) -> bool:
        assert self.router is not None
        if action == "kill":
            live = [(m, p) for m, ps in (self.samples[-1].processes if self.samples else {}).items() for p in ps]
            if not live:
                return False
            model, process = rng.choice(sorted(live, key=lambda item: (item[0], item[1].pid)))
            if not kill_backend(process):
                return False
            self.event("kill", model, self.now(), self.now())
            self.figures.faults["kill"] += 1
            self.figures.injected[f"kill {model}"] += 1
            return True
        if action in ("unload-all", "unload-one"):
            model = rng.choice(sorted(self.specs)) if action == "unload-one" else None
            self.admin("unload", model)
            return True
        if action == "unload-while-starting":
            # /load a stopped model, then /unload it a moment later: the stop lands while
            # it spawns or loads, where a lifecycle race would leave its process behind.
            stopped = [m for m in sorted(self.specs) if m not in (self.samples[-1].running if self.samples else {})]
            if not stopped:
                return False
            model = rng.choice(stopped)
            self.admin("load", model)
            # Mostly right behind the load, to land while the process spawns; else during its load.
            await asyncio.sleep(rng.choice((0.0, rng.uniform(0.0, 0.01), rng.uniform(0.0, 0.3))))
            self.admin("unload", model)
            return True
        if action == "load":
            self.admin("load", rng.choice(sorted(self.specs)))
            return True
        if action == "reload-changed":
            model = rng.choice(sorted(self.specs))
            self.specs[model] = changed_entry(self.specs[model], rng)
            # The old entry's server stops once its requests in flight are done: the
            # reload is over when its processes are gone.
            old = tuple(self.samples[-1].processes.get(model, ())) if self.samples else ()
            reload = Event("reload", model, self.now() - 0.5, float("inf") if old else self.now() + 2.0, old)
            self.events.append(reload)
            if old:
                self.open_events.append(reload)
        self.generation += 1
        self.write_config()
        os.kill(self.router.pid, signal.SIGHUP)
        self.figures.faults["reload"] += 1
        self.figures.injected[action] += 1
        return True

    def admin(self, what: str, model: str | None) -> None:
        task = asyncio.ensure_future(self.admin_call(what, model))
        self.admin_tasks.add(task)
        task.add_done_callback(self.admin_tasks.discard)

    async def admin_call(self, what: str, model: str | None) -> None:
        """POST /unload[?model=] or /load?model=; its answer is judged like a request's."""
        assert self.router is not None and self.session is not None
        url = f"{self.router.url}/{what}" + (f"?model={model}" if model else "")
        self.figures.faults[what] += 1
        self.figures.injected[f"/{what}" + ("?model=" if what == "unload" and model else "")] += 1
        began = self.now()
        stop = self.event("unload", model, began - 0.5, began + self.args.deadline) if what == "unload" else None
        # Processes that existed before the unload was sent: it must have stopped them by its answer.
        existing = {
            (m, p) for m, ps in (self.samples[-1].processes.items() if self.samples else ()) for p in ps
            if model in (None, m)
        } if what == "unload" else set()
        try:
            async with self.session.post(url, timeout=aiohttp.ClientTimeout(total=self.args.deadline)) as response:
                status, body = response.status, await response.read()
        except TimeoutError:
            if self.shutdown_at is None:
                self.violation("hang", model, f"POST /{what}", f"no answer within {self.args.deadline:g} s")
            return
        except aiohttp.ClientError as error:
            if self.shutdown_at is None:
                self.violation("no response", model, f"POST /{what}", f"{type(error).__name__}: {error}")
            return
        finally:
            if stop is not None:
                stop.end = self.now() + 1.0
        if self.shutdown_at is not None:
            return
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if status == 200 and isinstance(document, dict) and ({"loaded", "unloaded"} & set(document)):
            if existing:
                await asyncio.sleep(1.0)
                live = scan_backends(self.marker)
                survivors = [(m, p.pid) for m, p in sorted(existing, key=str) if p in live.get(m, ())]
                if survivors and self.shutdown_at is None:
                    self.violation("survived /unload", model, f"POST /{what}",
                                   f"answered {body[:200]!r} at t={stop.end - 1.0:.2f}s, yet these processes, "
                                   f"seen before it was sent, still run 1 s later: {survivors}")
            return
        message = error_message(document)
        if message is None:
            self.violation("unexplained error", model, f"POST /{what}", f"HTTP {status}: {body[:200]!r}")
        elif INTERNALS.search(message):
            self.violation("internals in error", model, f"POST /{what}", f"HTTP {status}: {message[:400]}")
        elif raw_connect_failure(message) and not self.deliberate_stop_near(model or "", began - 1, self.now()):
            self.violation("connect 502", model, f"POST /{what}", f"HTTP {status}: {message[:400]}")
        else:
            self.note_clean(f"/{what} HTTP {status}", message)

    def note_clean(self, kind: str, message: str) -> None:
        self.figures.clean[kind] += 1
        self.figures.clean_examples.setdefault(kind, " | ".join(message.splitlines())[:300])

    # -- watching ------------------------------------------------------------------

    async def watch_logs(self) -> None:
        """The router's log stream: crashes announce themselves there ("sim: crashing after N tokens")."""
        assert self.router is not None and self.session is not None
        seen: set[tuple[float, str, str]] = set()
        while True:
            try:
                async with self.session.get(f"{self.router.url}/logs/stream?limit=1") as response:
                    async for raw in response.content:
                        if not raw.startswith(b"data:"):
                            continue
                        line = json.loads(raw[5:])
                        key = (line["time"], line["source"], line["text"])
                        if key in seen:
                            continue
                        seen.add(key)
                        self.logs.append(key)
                        if line["source"] in self.specs and "sim: crashing after" in line["text"]:
                            self.figures.faults["crash"] += 1
                            self.seen_fault["crash"].set()
                            self.figures.injected[f"crash {line['source']}"] += 1
            except (aiohttp.ClientError, ValueError):
                await asyncio.sleep(0.2)

    async def read_running(self) -> dict[str, dict] | str:
        """/running by model, or what went wrong reading it."""
        assert self.router is not None and self.session is not None
        began = time.monotonic()
        try:
            async with self.session.get(f"{self.router.url}/running", timeout=aiohttp.ClientTimeout(total=30)) as response:
                document = await response.json()
        except (TimeoutError, aiohttp.ClientError, ValueError) as error:
            return f"{type(error).__name__}: {error}"
        elapsed = time.monotonic() - began
        self.figures.running_read_max = max(self.figures.running_read_max, elapsed)
        return {entry["model"]: entry for entry in document["running"]}

    async def monitor(self) -> None:
        """Ten looks a second at /running and at the processes that exist."""
        assert self.router is not None
        failures = 0
        while True:
            running = await self.read_running()
            if self.router.popen.poll() is not None:
                self.violation("router exited", None, None, f"the router exited with {self.router.popen.returncode} "
                               f"in the middle of the soak: see {self.router.log_path}")
                return
            if isinstance(running, str):
                failures += 1
                if failures == 2:  # twice in a row, and once per spell
                    self.violation("router unresponsive", None, "GET /running", running)
            else:
                failures = 0
                sample = Sample(self.now(), running, scan_backends(self.marker))
                self.samples.append(sample)
                self.check_sample(sample)
            await asyncio.sleep(self.args.monitor_interval)

    def check_sample(self, sample: Sample) -> None:
        while self.latency_pending and self.latency_pending[0].first_byte < sample.time:
            self.note_added_latency(self.latency_pending.popleft(), sample)
        live = {p for processes in sample.processes.values() for p in processes}
        for entry in list(self.open_events):
            if not live & set(entry.until_gone):
                entry.end = sample.time + 0.5
                self.open_events.remove(entry)
            elif sample.time - entry.start > self.args.deadline + 5:
                # Its requests in flight were over by their deadline: the old server must be gone.
                entry.end = sample.time
                self.open_events.remove(entry)
                self.violation("outdated server kept", entry.model, None,
                               f"a reload at t={entry.start + 0.5:.2f}s changed its entry, yet its old process(es) "
                               f"{[p.pid for p in live & set(entry.until_gone)]} still run")
        for model, processes in sample.processes.items():
            seen = self._seen.setdefault(model, set())
            for process in processes:
                if process not in seen:
                    seen.add(process)
                    self.note_start(model)
            if len(processes) > 1:
                key = ("two processes", model, tuple(sorted(p.pid for p in processes)))
                if key not in self._reported:
                    self._reported.add(key)
                    self.violation("two processes", model, None,
                                   f"{len(processes)} live processes at once: pids {list(key[2])}")
        self.note_vanished(sample)
        # /running and the processes cannot be read at one instant: only a disagreement
        # seen again, with the same pids, at least `--persist` seconds later counts.
        current = set()
        for model, entry in sample.running.items():
            pids = [p.pid for p in sample.processes.get(model, [])]
            if entry.get("state") == "ready" and entry.get("pid") not in pids:
                current.add(("ready without its process", model, entry.get("pid"), tuple(pids)))
        for model, processes in sample.processes.items():
            state = sample.running.get(model, {}).get("state", "not listed")
            if state not in LIVE_STATES:
                current.add(("process the router disowns", model, state, tuple(p.pid for p in processes)))
        for key in list(self._mismatches):
            if key not in current:
                del self._mismatches[key]
        for key in current:
            first, count = self._mismatches.get(key, (sample.time, 0))
            self._mismatches[key] = (first, count + 1)
            if count + 1 >= 2 and sample.time - first >= self.args.persist and key not in self._reported:
                self._reported.add(key)
                kind, model = key[0], key[1]
                if kind == "ready without its process":
                    detail = f"/running says ready with pid {key[2]}, but its live processes are {list(key[3])}"
                else:
                    detail = f"live process(es) {list(key[3])}, but /running says {key[2]}"
                self.violation(kind, model, None, f"{detail} (for {sample.time - first:.2f} s)")

    def note_start(self, model: str) -> None:
        spec = self.specs[model]
        self.figures.starts[model] += 1
        if spec.group == "swap":
            # A swap is the group changing members; a member restarted (crash, kill, reload) is not one.
            if self.last_swap_member not in (None, model):
                self.swap_switches += 1
            self.last_swap_member = model
        if spec.load_seconds:
            self.figures.faults["slow load"] += 1
        if spec.health_before_ready and spec.check_endpoint != "generate":
            self.figures.faults["lying health"] += 1

    def note_vanished(self, sample: Sample) -> None:
        """keep-ttl is persistent and never crashes: when its process goes and nothing of ours stopped it, its ttl did."""
        if len(self.samples) < 2:
            return
        previous = self.samples[-2].processes.get("keep-ttl", [])
        gone = [p for p in previous if p not in sample.processes.get("keep-ttl", [])]
        if gone and not self.faults_touching("keep-ttl", sample.time - 1.0, sample.time,
                                             ("kill", "unload", "reload", "shutdown")):
            self.figures.faults["ttl expiry"] += 1
            self.seen_fault["ttl expiry"].set()
            self.event("ttl", "keep-ttl", sample.time - 1.0, sample.time + 1.0)

    async def check_batching(self) -> None:
        """Swaps in the exclusive swap group stay well below its requests: queued requests go in batches."""
        requests = sum(n for m, n in self.figures.requests_by_model.items() if self.specs[m].group == "swap")
        self.swap_requests = requests
        self.swaps_total = await self.metric("swaplab:swaps_total")
        swaps = self.swap_switches
        if swaps and requests / swaps < self.args.min_requests_per_swap:
            self.violation("no batching", None, None,
                           f"the swap group got {requests} requests and changed members {swaps} times "
                           f"({requests / swaps:.1f} requests per swap, below {self.args.min_requests_per_swap:g})")

    async def metric(self, name: str) -> float | None:
        assert self.router is not None and self.session is not None
        try:
            async with self.session.get(f"{self.router.url}/metrics") as response:
                text = await response.text()
        except aiohttp.ClientError:
            return None
        values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
        return values[0] if values else None

    async def progress(self) -> None:
        interval = max(10.0, min(30.0, self.args.seconds / 20))
        while True:
            await asyncio.sleep(interval)
            print(f"[{self.now():6.0f}s] {self.summary_requests()} | faults {self.summary_faults()} | "
                  f"violations {len(self.violations)}", flush=True)

    # -- shutdown ------------------------------------------------------------------

    async def shutdown_by_sigterm(self) -> None:
        """SIGTERM with requests in flight and a slow model starting: afterwards no backend may be left."""
        assert self.router is not None
        rng = random.Random(f"{self.args.seed}-shutdown")
        burst = [asyncio.ensure_future(self.request(rng, m)) for m in rng.choices(list(self.specs), k=12)]
        self.admin("load", "swap-slow")
        await asyncio.sleep(0.7)
        self.stopping = True
        self.shutdown_at = self.now()
        self.event("shutdown", None, self.shutdown_at, float("inf"))
        before = scan_backends(self.marker)
        os.kill(self.router.pid, signal.SIGTERM)
        code = await self.router.wait_exit(30)
        if code is None:
            self.violation("router did not exit", None, None, "still running 30 s after SIGTERM")
            self.router.close()
        exited = self.now() - self.shutdown_at
        left = await self.backends_left(2.0)
        self._shutdown_report.append(
            f"SIGTERM: {sum(map(len, before.values()))} backends, router exited in {exited:.1f} s "
            f"(code {code}), {len(left)} backend(s) left"
        )
        if left:
            self.violation("orphan after SIGTERM", None, None, f"backends alive after the router exited: {left}")
            kill_leftovers(self.marker)  # the next phase starts clean
        await asyncio.gather(*burst, return_exceptions=True)
        if self.admin_tasks:
            await asyncio.gather(*self.admin_tasks, return_exceptions=True)
        self.router.close()

    async def backends_left(self, grace: float) -> list[str]:
        deadline = time.monotonic() + grace
        while True:
            left = scan_backends(self.marker)
            if not left or time.monotonic() > deadline:
                return [f"{m} pid {p.pid} (parent {p.parent})" for m, ps in sorted(left.items()) for p in ps]
            await asyncio.sleep(0.05)

    async def shutdown_by_sigkill(self) -> None:
        """docs/router.md: a parent-death signal takes every backend down with a SIGKILLed router,
        and the next router of the same state directory reaps whatever escaped."""
        second = RouterProcess(self.config_path, self.workdir, free_port(), "router-2")
        try:
            await second.wait_ready()
            async with aiohttp.ClientSession() as session:
                async def post(path: str) -> None:
                    try:
                        async with session.post(f"{second.url}{path}", timeout=aiohttp.ClientTimeout(total=60)) as r:
                            await r.read()
                    except (TimeoutError, aiohttp.ClientError):
                        pass

                await asyncio.gather(post("/load?model=side-lying"), post("/load?model=keep-ttl"))
                loading = asyncio.ensure_future(post("/load?model=side-generate"))  # still starting when killed
                await asyncio.sleep(0.3)
                before = scan_backends(self.marker)
                killed_at = time.monotonic()
                second.popen.kill()
                second.popen.wait()
                left = await self.backends_left(5.0)
                took = time.monotonic() - killed_at
                await asyncio.gather(loading, return_exceptions=True)
            count = sum(map(len, before.values()))
            self._shutdown_report.append(
                f"SIGKILL: {count} backends ({', '.join(sorted(before))}); "
                + (f"{len(left)} still alive 5 s later" if left else f"all gone in {took:.2f} s")
            )
            if left:
                self.violation("orphan after SIGKILL", None, None,
                               f"backends outlived the SIGKILLed router by 5 s (no parent-death signal?): {left}")
            if count == 0:
                self.violation("sigkill phase empty", None, None, "no backend could be loaded to be orphaned")
        finally:
            second.close()
        # The next start of the same state directory reaps what is left, and starts clean.
        third = RouterProcess(self.config_path, self.workdir, free_port(), "router-3")
        try:
            await third.wait_ready()
            left = await self.backends_left(1.0)
            self._shutdown_report.append(f"next start: {len(left)} backend(s) left after it came up")
            if left:
                self.violation("orphan after restart", None, None, f"the next router did not reap: {left}")
            os.kill(third.pid, signal.SIGTERM)
            if await third.wait_exit(30) is None:
                self.violation("router did not exit", None, None, "the third router ignored SIGTERM for 30 s")
        finally:
            third.close()
        kill_leftovers(self.marker)  # never leave anything behind

    # -- the report ----------------------------------------------------------------

    def summary_requests(self) -> str:
        r = self.figures.requests
        total = sum(r.values())
        clean = ", ".join(f"{k} {v}" for k, v in self.figures.clean.most_common())
        return (f"requests: {total} (ok {r['ok']}, clean errors {r['clean']}{': ' + clean if clean else ''}; "
                f"disconnected by us {r['disconnected by us']}, cut by shutdown {r['cut by shutdown']}, "
                f"violations {r['violation']})")

    def summary_faults(self) -> str:
        return ", ".join(f"{kind} {self.figures.faults[kind]}" for kind in FAULT_KINDS)

    def report(self) -> int:
        figures = self.figures
        print()
        print(f"soak: {self.args.seconds:g} s, seed {self.args.seed}, {self.args.clients} clients, "
              f"deadline {self.args.deadline:g} s")
        print(self.summary_requests())
        print(f"faults injected: {self.summary_faults()}")
        detail = ", ".join(f"{k} {v}" for k, v in sorted(figures.injected.items()))
        print(f"  in detail: {detail}")
        ratio = self.swap_requests / self.swap_switches if self.swap_switches else float("nan")
        print(f"swap group: {self.swap_requests} requests, {self.swap_switches} swaps between its members "
              f"({ratio:.1f} requests per swap); router swaps_total {self.swaps_total}")
        print("backend starts: " + ", ".join(f"{m} {figures.starts[m]}" for m in self.specs))
        if figures.success_latency:
            print(f"successful requests, end to end: p50 {percentile(figures.success_latency, 0.5):.2f} s, "
                  f"p99 {percentile(figures.success_latency, 0.99):.2f} s, "
                  f"max {max(figures.success_latency):.2f} s")
        if figures.added_latency:
            added = [x * 1000 for x in figures.added_latency]
            print(f"added latency (router TTFB - sim TTFT, {len(added)} streams to a ready model): "
                  f"p50 {percentile(added, 0.5):.1f} ms, p99 {percentile(added, 0.99):.1f} ms")
        else:
            print("added latency: no eligible request")
        print(f"slowest /running read: {figures.running_read_max * 1000:.0f} ms")
        for kind, message in figures.clean_examples.items():
            print(f"  clean error {kind!r}, e.g.: {message[:160]}")
        for line in self._shutdown_report:
            print(f"shutdown: {line}")
        by_kind = Counter(v.kind for v in self.violations)
        print(f"invariant violations: {len(self.violations)}"
              + (" (" + ", ".join(f"{k} {n}" for k, n in by_kind.most_common()) + ")" if by_kind else ""))
        for kind in by_kind:
            example = next(v for v in self.violations if v.kind == kind)
            print(f"  e.g. {kind}: t={example.time:.2f}s model={example.model} request={example.request}: "
                  f"{example.detail}")
        if self.args.json:
            document = {
                "seconds": self.args.seconds, "seed": self.args.seed, "clients": self.args.clients,
                "deadline": self.args.deadline,
                "requests": dict(figures.requests), "clean_errors": dict(figures.clean),
                "clean_error_examples": figures.clean_examples,
                "requests_by_model": dict(figures.requests_by_model),
                "ok_by_model": dict(figures.ok_by_model),
                "faults": {kind: figures.faults[kind] for kind in FAULT_KINDS},
                "injected": dict(figures.injected), "starts": dict(figures.starts),
                "swap_group": {"requests": self.swap_requests, "swaps": self.swap_switches,
                               "swaps_total": self.swaps_total},
                "added_latency_ms": {
                    "count": len(figures.added_latency),
                    "p50": percentile(figures.added_latency, 0.5) * 1000 if figures.added_latency else None,
                    "p99": percentile(figures.added_latency, 0.99) * 1000 if figures.added_latency else None,
                },
                "success_latency_s": {
                    "p50": percentile(figures.success_latency, 0.5) if figures.success_latency else None,
                    "max": max(figures.success_latency) if figures.success_latency else None,
                },
                "shutdown": self._shutdown_report,
                "violations": [vars(v) for v in self.violations[:2000]],
                "violation_count": len(self.violations),
                "violations_by_kind": dict(by_kind),
            }
            Path(self.args.json).write_text(json.dumps(document, indent=2) + "\n")
        return 0 if not self.violations else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600, help="how long the traffic runs (default 600)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--json", help="write every figure and violation to this file")
    parser.add_argument("--deadline", type=float, default=60.0,
                        help="seconds a request may take, queueing and loads included, before it is a hang")
    parser.add_argument("--think", type=float, default=0.3, help="most seconds a client pauses between requests")
    parser.add_argument("--disconnect-rate", type=float, default=0.05,
                        help="share of requests whose client leaves before the first byte (as many more after it)")
    parser.add_argument("--fault-interval", type=float, default=1.5, help="mean seconds between injected faults")
    parser.add_argument("--monitor-interval", type=float, default=0.1)
    parser.add_argument("--persist", type=float, default=0.5,
                        help="seconds a /running-versus-processes disagreement must last to count")
    parser.add_argument("--min-requests-per-swap", type=float, default=3.0,
                        help="the swap group must serve at least this many requests per backend start")
    parser.add_argument("--print-violations", type=int, default=5, help="violations printed in full per kind")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (kept anyway after a violation)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="swaplab-soak-"))
    soak = Soak(args, workdir)
    # A soak stopped with SIGTERM (`kill`, a CI timeout) must still take its router and
    # backends down: SystemExit unwinds through the finally below, the default action would not.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        code = asyncio.run(soak.run())
    finally:
        if soak.router is not None:
            soak.router.close()
        kill_leftovers(soak.marker)
    if code == 0 and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"work dir kept: {workdir} (config.yaml, router-*.log)")
    return code


if __name__ == "__main__":
    sys.exit(main())
