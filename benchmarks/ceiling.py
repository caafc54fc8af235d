"""Bursts, the streaming ceiling and CPU per streamed chunk, side by side in one run:

  direct       the upstream itself (benchmarks/fastupstream.py)
  passthrough  a minimal aiohttp proxy (benchmarks/passthrough.py's app): the floor for Python
  swaplab      `swaplab serve`, the upstream as its model
  llama-swap   a llama-swap binary, only with `--llama-swap PATH` (this script never builds one)

Measures, every path in each round, the paths' order rotating from round to round:

  burst        64 streaming requests released at one instant (benchmarks/burst.py: prebuilt
               bytes on warm connections), several bursts per round; time to first byte p50
               and p99 added over direct's in the same round
  ceiling      64 and 256 concurrent unpaced streams of 2000 chunks, each client starting
               its next stream when one ends: chunks per second delivered over a fixed window
  paced        256 streams at 100 chunks/s each (25.6k/s offered) over the same window
  RSS          each proxy's resident memory after a short idle period following the round

CPU time (user + system, psutil) of the proxy, the upstream and the client is counted over
each window and given per 1000 chunks delivered (a chunk is one `data: ` event). The
streams are read by a client in a process of its own (this script, run as `_client`), so
its work is not in the proxy's measure, and it reports its own CPU so a reader can see that
neither it nor the upstream is what limits. Ratios are swaplab / passthrough (and
swaplab / llama-swap), of the medians over rounds; beside each, the range of the same ratio
taken round by round; `?` marks a ratio whose rounds fall on both sides of 1: too noisy to
conclude, or no difference. No bars: it exits 0, or 1 when a path answers wrongly (a stream short, a non-200).

Two things are set alike for both Python proxies, so neither is credited with the other's
setting. The event loop (`--loop`): by default uvloop's where it is importable, for the
passthrough and for swaplab (SWAPLAB_EVENT_LOOP); the upstream and the client use it too.
And the passthrough's pool to the upstream has no connection limit: aiohttp's default of
100 would keep 156 of 256 streams waiting, a limit of the example, not of Python.

    .venv/bin/python benchmarks/ceiling.py [--quick] [--rounds N] [--json FILE] [--llama-swap PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httptools
import psutil
from burst import Burst, chat_request  # benchmarks/burst.py, beside this script
from overhead import Fleet, chat_body, free_port, one_request, percentile  # benchmarks/overhead.py
from profile_burst import parse_collapsed, sample_tables  # benchmarks/profile_burst.py: its tables of py-spy's stacks

HERE = Path(__file__).resolve().parent
PY = sys.executable
MODEL = "fast"
BURST_STREAMS = 64
BURST_TOKENS = 16  # as overhead.py's unpaced burst
BURST_WARM_TOKENS = 300  # long enough that a warm-up burst's 64 streams overlap
CEILING_STREAMS = (64, 256)
PACED_STREAMS = 256
EXTRA_EVENTS = 2  # fastupstream's finish event and `data: [DONE]`, beside max_tokens token events


def loop_factory(name: str):
    """The event loop factory for `asyncio.Runner`: uvloop's, or None for asyncio's."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def default_loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


class PathFailed(Exception):
    """A path answered wrongly: a status other than 200, a stream short or cut."""


# --- the client, run in its own process ------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """What the client's connections saw, counted as it happens."""

    running: bool = True
    chunks: int = 0  # `data: ` events read, all connections
    completed: int = 0  # streams ended whole, with the events expected and one [DONE]
    wrong: list[str] = field(default_factory=list)  # what was wrong with each stream that was not


class _StreamConnection(asyncio.Protocol):
    """One kept-alive connection asking for one stream after another while the tally runs.

    Its answers are parsed by llhttp (httptools), so a proxy that splits an event between
    two HTTP chunks is read right; the body is only counted: `data: ` events and `[DONE]`
    (the last few bytes kept so a marker split between two reads still counts once).
    """

    def __init__(self, tally: Tally, request: bytes, expected: int):
        self.tally = tally
        self.request = request
        self.expected = expected
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.in_response = False
        self.parser = httptools.HttpResponseParser(self)
        self.events = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, error: Exception | None) -> None:
        if self.in_response and self.tally.running:
            self.tally.wrong.append(f"the connection closed mid-stream after {self.events} events ({error})")
        self.in_response = False
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self) -> None:
        self.status = 0
        self.error = b""
        self.events = 0
        self.dones = 0
        self.tail = b""
        self.tail_events = 0
        self.tail_dones = 0
        self.in_response = True
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if not self.in_response:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.tally.wrong.append(f"not HTTP: {error}")
            self.in_response = False
            self.transport.close()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            self.error += body
            return
        joined = self.tail + body
        events = joined.count(b"data: ") - self.tail_events
        self.events += events
        self.dones += joined.count(b"[DONE]") - self.tail_dones
        self.tally.chunks += events
        tail = joined[-16:]
        self.tail, self.tail_events, self.tail_dones = tail, tail.count(b"data: "), tail.count(b"[DONE]")

    def on_message_complete(self) -> None:
        self.in_response = False
        if self.status != 200:
            self.tally.wrong.append(f"HTTP {self.status}: {self.error[:300].decode(errors='replace')}")
            self.transport.close()
            return
        if self.events == self.expected and self.dones == 1:
            self.tally.completed += 1
        else:
            self.tally.wrong.append(f"a stream ended with {self.events} events ({self.dones} [DONE]), "
                                    f"not {self.expected}")
        if self.tally.running:
            self.send()


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O), all cores."""
    times = psutil.cpu_times()
    # Guest time is counted in user time already.
    return (sum(times) - times.idle - getattr(times, "iowait", 0.0) - getattr(times, "guest", 0.0)
            - getattr(times, "guest_nice", 0.0))


async def window(
    url: str, streams: int, max_tokens: int, chunks_per_second: float, warmup: float, seconds: float,
    watch: dict[str, list[int]],
) -> dict:
    """`streams` connections streaming; after `warmup`, the chunks read and the CPU used over `seconds`."""
    loop = asyncio.get_running_loop()
    body = chat_body(MODEL, True, max_tokens)
    if chunks_per_second:
        body["x_chunks_per_second"] = chunks_per_second
    request = chat_request(url, body)
    tally = Tally()
    split = urlsplit(url)
    connections: list[_StreamConnection] = []
    for _ in range(streams):
        _, connection = await loop.create_connection(
            lambda: _StreamConnection(tally, request, max_tokens + EXTRA_EVENTS), split.hostname, split.port
        )
        connections.append(connection)
    watched = {name: [psutil.Process(pid) for pid in pids] for name, pids in watch.items()}

    def snapshot() -> dict:
        return {"at": time.perf_counter(), "chunks": tally.chunks, "client": time.process_time(),
                "machine": machine_busy(), **{name: cpu_seconds(processes) for name, processes in watched.items()}}

    for connection in connections:
        connection.send()
    await asyncio.sleep(warmup)
    first = snapshot()
    await asyncio.sleep(seconds)
    last = snapshot()
    tally.running = False
    for connection in connections:
        connection.transport.abort()
    await asyncio.gather(*(connection.closed for connection in connections))
    return {
        "seconds": last["at"] - first["at"],
        "chunks": last["chunks"] - first["chunks"],
        "cpu_seconds": {name: last[name] - first[name] for name in ("client", "machine", *watched)},
        "completed_streams": tally.completed,
        "wrong": tally.wrong[:10],
        "wrong_count": len(tally.wrong),
    }


async def client_main() -> None:
    """Windows asked for on stdin, one JSON object a line; each one's result a JSON line on stdout."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := await reader.readline():
        print(json.dumps(await window(**json.loads(line))), flush=True)


class Client:
    """The client process, asked for one window at a time."""

    def __init__(self, workdir: Path):
        self.log = open(workdir / "client.log", "wb")
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            PY, str(Path(__file__).resolve()), "_client",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self.log,
        )
        await self._reply()

    async def window(self, **spec) -> dict:
        self.process.stdin.write(json.dumps(spec).encode() + b"\n")
        await self.process.stdin.drain()
        return await self._reply()

    async def _reply(self) -> dict:
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process ended (its log: {self.log.name})")
        return json.loads(line)

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()


# --- the paths --------------------------------------------------------------------------------


def passthrough_main(argv: list[str]) -> None:
    """benchmarks/passthrough.py's app, its pool to the upstream without aiohttp's limit of 100, on `--loop`."""
    import passthrough  # benchmarks/passthrough.py
    from aiohttp import web

    parser = argparse.ArgumentParser(prog="ceiling.py _passthrough")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), required=True)
    args = parser.parse_args(argv)
    app = passthrough.make_app(args.upstream.rstrip("/"))

    async def unlimited_pool(app: web.Application) -> None:  # after the app's own startup, which made the session
        await app["session"].close()
        app["session"] = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=0))

    app.on_startup.append(unlimited_pool)
    factory = loop_factory(args.loop)
    loop = factory() if factory else asyncio.new_event_loop()
    # As passthrough.py runs it: handler_cancellation, so a client that leaves closes the upstream.
    web.run_app(app, host="127.0.0.1", port=args.port, handler_cancellation=True, access_log=None, print=None,
                loop=loop)


def swaplab_config(upstream: int, capture_buffer: int) -> str:
    """swaplab's config: the running upstream as its one model, whose `cmd` only sleeps."""
    return f"""
healthCheckTimeout: 60
captureBuffer: {capture_buffer}
models:
  {MODEL}:
    cmd: {shutil.which("sleep")} 1000000
    proxy: http://127.0.0.1:{upstream}
    checkEndpoint: /health
    concurrencyLimit: 1000
"""


def llama_swap_config(upstream: int, capture_buffer: int) -> str:
    """llama-swap's config (keys of its config.example.yaml): the same model, the same limits."""
    # concurrencyLimit: llama-swap's default of 10 would answer 429 to most of 64 streams.
    return f"""
healthCheckTimeout: 60
logLevel: info
captureBuffer: {capture_buffer}
models:
  {MODEL}:
    cmd: {shutil.which("sleep")} 1000000
    proxy: http://127.0.0.1:{upstream}
    checkEndpoint: /health
    concurrencyLimit: 1000
"""


class UsageError(Exception):
    """Something the command line asked for that cannot be: printed without a traceback, exit status 2."""


def llama_swap_binary(path: str) -> tuple[str, str]:
    """The binary given as --llama-swap, checked before anything starts, and its `-version` line."""
    resolved = shutil.which(path) or path
    if not (os.path.isfile(resolved) and os.access(resolved, os.X_OK)):
        raise UsageError(f"--llama-swap {path}: no executable file there. Pass the path of a llama-swap binary "
                         "(one of https://github.com/mostlygeek/llama-swap/releases); this script does not build one.")
    try:
        done = subprocess.run([resolved, "-version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"--llama-swap {path}: `{resolved} -version` did not run: {error}") from None
    said = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or not said:
        raise UsageError(f"--llama-swap {path}: `{resolved} -version` exited {done.returncode} saying "
                         f"{said[:200]!r}: is it a llama-swap binary?")
    return resolved, said.splitlines()[0]


async def wait_up(url: str, process: subprocess.Popen, name: str, log: Path, timeout: float = 60) -> None:
    """Until `url` answers 200; a process that exits first, or a timeout, ends the run saying so."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            if process.poll() is not None:
                raise PathFailed(f"{name} exited ({process.returncode}) before answering {url}; "
                                 f"its log {log}:\n{log.read_text(errors='replace')[-2000:]}")
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise PathFailed(f"{name} did not answer {url} within {timeout:g} s; its log: {log}")
            await asyncio.sleep(0.05)


async def check_path(name: str, url: str, stream_chunks: int) -> None:
    """One model listing, one answer and one whole long stream through the path, before any measure."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/models") as response:
            if response.status != 200:
                raise PathFailed(f"{name}: GET /v1/models answered HTTP {response.status}")
        async with session.post(f"{url}/v1/chat/completions", json=chat_body(MODEL, False, 4)) as response:
            answer = await response.json(content_type=None)
            if response.status != 200 or answer["choices"][0]["message"]["content"] != "tok " * 4:
                raise PathFailed(f"{name}: a non-streaming answer was wrong (HTTP {response.status}): {answer}")
        _, _, events = await one_request(session, url, chat_body(MODEL, True, stream_chunks))
        if events != stream_chunks + EXTRA_EVENTS:
            raise PathFailed(f"{name}: a {stream_chunks}-chunk stream arrived with {events} events, "
                             f"not {stream_chunks + EXTRA_EVENTS}")


async def upstream_idle(upstream: str, last: str, timeout: float = 10) -> None:
    """Until the upstream streams nothing: a proxy must close its upstream streams once its clients leave."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"{upstream}/stats") as response:
                stats = await response.json()
            if stats["active"] == 0:
                return
            if time.monotonic() > deadline:
                raise PathFailed(f"{last}: the upstream still had {stats['active']} streams open {timeout:g} s "
                                 "after the clients left, so the path did not close its upstream streams")
            await asyncio.sleep(0.05)


# --- the measures -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One path under measure: its URL, its proxy process (none for direct) and what to watch."""

    name: str
    url: str
    proxy: psutil.Process | None
    upstream: psutil.Process

    def watched(self) -> dict[str, list[int]]:
        """pids whose CPU is counted: the proxy with its children (a model's `cmd`), and the upstream."""
        watch = {"upstream": [self.upstream.pid]}
        if self.proxy is not None:
            watch["proxy"] = [self.proxy.pid, *(child.pid for child in self.proxy.children(recursive=True))]
        return watch

    def resident_mb(self) -> float:
        return (self.proxy or self.upstream).memory_info().rss / 2**20


async def burst_block(route: Route, bursts: int) -> dict:
    """`bursts` bursts of 64 streams on fresh warm connections; every TTFB and the CPU over the block."""
    burst = Burst(route.url, BURST_STREAMS)
    measured = chat_request(route.url, chat_body(MODEL, True, BURST_TOKENS))
    warm = chat_request(route.url, chat_body(MODEL, True, BURST_WARM_TOKENS))
    watched = {name: [psutil.Process(pid) for pid in pids] for name, pids in route.watched().items()}

    def cpu() -> dict[str, float]:
        return {"client": time.process_time(), "machine": machine_busy(),
                **{name: cpu_seconds(p) for name, p in watched.items()}}

    ttfb = []
    try:
        await burst.open()
        for _ in range(2):  # so a proxy's own pool to the upstream holds as many connections as a burst needs
            await burst.fire(warm)
        await asyncio.sleep(0.2)
        before, before_at = cpu(), time.perf_counter()
        for _ in range(bursts):
            await asyncio.sleep(0.03)  # what the last burst left behind (closing, recording) settles
            replies = await burst.fire(measured)
            wrong = [reply.events for reply in replies if reply.events != BURST_TOKENS + EXTRA_EVENTS]
            if wrong:
                raise PathFailed(f"{route.name}: {len(wrong)} of a burst's streams had {wrong[0]} events, "
                                 f"not {BURST_TOKENS + EXTRA_EVENTS}")
            ttfb += [reply.first_byte for reply in replies]
        await asyncio.sleep(0.2)  # work a proxy defers past its burst still counts
        after, after_at = cpu(), time.perf_counter()
    except (RuntimeError, ConnectionError) as error:
        raise PathFailed(f"{route.name}: {error}") from None
    finally:
        await burst.close()
    return {
        "ttfb": ttfb,
        "chunks": bursts * BURST_STREAMS * (BURST_TOKENS + EXTRA_EVENTS),
        "cpu_seconds": {name: after[name] - before[name] for name in after},
        "seconds": after_at - before_at,
    }


async def stream_window(client: Client, route: Route, streams: int, stream_chunks: int, rate: float,
                        warmup: float, seconds: float) -> dict:
    result = await client.window(url=route.url, streams=streams, max_tokens=stream_chunks, chunks_per_second=rate,
                                 warmup=warmup, seconds=seconds, watch=route.watched())
    if result["wrong_count"]:
        raise PathFailed(f"{route.name}, {streams} streams: {result['wrong_count']} streams went wrong, "
                         f"first: {result['wrong'][0]}")
    return result


# --- the table --------------------------------------------------------------------------------


@dataclass
class Row:
    """One measure: per path, its value in each round, and the upstream's and client's CPU per 1000 chunks."""

    label: str
    values: dict[str, list[float]]
    cpu: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    proxy_core: dict[str, list[float]] = field(default_factory=dict)  # share of one core the proxy used
    ratio_floor: float = 0.0  # a denominator at or below this makes a ratio meaningless (added times near zero)


def ms_per_1000(measure: dict, who: str) -> float | None:
    seconds = measure["cpu_seconds"].get(who)
    return None if seconds is None or not measure["chunks"] else seconds * 1e6 / measure["chunks"]


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}–{max(values):.3g}" if len(values) > 1 else ""


def ratio_cell(row: Row, numerator: str, denominator: str) -> tuple[str, dict | None]:
    """`median ratio [per-round range]`, `?` when the rounds fall on both sides of 1."""
    if numerator not in row.values or denominator not in row.values:
        return "", None
    top, bottom = statistics.median(row.values[numerator]), statistics.median(row.values[denominator])
    if bottom <= row.ratio_floor:
        return "n/a", None
    per_round = [a / b for a, b in zip(row.values[numerator], row.values[denominator], strict=True)
                 if b > row.ratio_floor]
    noisy = bool(per_round) and min(per_round) < 1 < max(per_round)
    cell = f"{top / bottom:.2f}"
    if len(per_round) > 1:
        cell += f" [{min(per_round):.2f}–{max(per_round):.2f}]{'?' if noisy else ''}"
    return cell, {"ratio": top / bottom, "per_round": per_round, "noisy": noisy}


def table(rows: list[Row], names: list[str]) -> tuple[list[str], list[dict]]:
    """The printed table's lines, and the same as data."""
    has_ls = "llama-swap" in names
    head = (f"{'measure':<36} {'path':<11} {'median':>9} {'min–max':>17}  {'swaplab/passthrough':<21}"
            + (f"{'swaplab/llama-swap':<21}" if has_ls else "") + f"{'upstream':>9} {'client':>7} {'proxy':>6}")
    lines = [head, "-" * len(head)]
    data = []
    for row in rows:
        label = row.label  # on the row's first line only
        for name in names:
            if name not in row.values:
                continue
            values = row.values[name]
            median = statistics.median(values)
            cells = {"pt": "", "ls": ""}
            entry = {"measure": row.label, "path": name, "median": median, "per_round": values}
            if name == "swaplab":
                cells["pt"], entry["vs_passthrough"] = ratio_cell(row, "swaplab", "passthrough")
                if has_ls:
                    cells["ls"], entry["vs_llama_swap"] = ratio_cell(row, "swaplab", "llama-swap")
            cpu = row.cpu.get(name, {})
            upstream = f"{statistics.median(cpu['upstream']):.1f}" if cpu.get("upstream") else ""
            client = f"{statistics.median(cpu['client']):.1f}" if cpu.get("client") else ""
            entry["upstream_cpu_ms_per_1000"], entry["client_cpu_ms_per_1000"] = cpu.get("upstream"), cpu.get("client")
            core = row.proxy_core.get(name)
            entry["proxy_core_share"] = core
            core_cell = f"{statistics.median(core):.0%}" if core else ""
            lines.append(f"{label:<36} {name:<11} {median:>9.4g} {spread(values):>17}  {cells['pt']:<21}"
                         + (f"{cells['ls']:<21}" if has_ls else "") + f"{upstream:>9} {client:>7} {core_cell:>6}")
            label = ""
            data.append(entry)
    return [line.rstrip() for line in lines], data


def build_rows(raw: dict, names: list[str], settings: Settings) -> list[Row]:
    """The table's rows from the raw measures of every round."""
    rounds = len(raw["rss_mb"]["direct"])
    rows = []

    def cpu_of(measure: str, who: tuple[str, ...] = ("upstream", "client")) -> dict:
        return {name: {w: [ms_per_1000(m, w) for m in raw[measure][name][:rounds]] for w in who}
                for name in names}

    ran = settings.measures
    for q, label in ((0.5, "p50"), (0.99, "p99")) if "burst" in ran else ():
        values = {}
        for name in names:
            per_round = [percentile(m["ttfb"], q) * 1e3 for m in raw["burst"][name][:rounds]]
            values[name] = per_round
        direct = values["direct"]
        added = {name: [v - d for v, d in zip(values[name], direct, strict=True)] if name != "direct" else direct
                 for name in names}
        rows.append(Row(f"burst of {BURST_STREAMS}, TTFB {label} added (ms)", added,
                        cpu_of("burst"), ratio_floor=1e-3))
    def rate(key: str) -> dict[str, list[float]]:
        return {name: [m["chunks"] / m["seconds"] / 1e3 for m in raw[key][name][:rounds]] for name in names}

    def proxy_cpu(key: str) -> dict[str, list[float]]:
        return {name: [ms_per_1000(m, "proxy") for m in raw[key][name][:rounds]] for name in names if name != "direct"}

    def core(key: str) -> dict[str, list[float]]:
        return {name: [m["cpu_seconds"]["proxy"] / m["seconds"] for m in raw[key][name][:rounds]]
                for name in names if name != "direct"}

    for streams in CEILING_STREAMS:
        key = f"ceiling{streams}"
        if key in ran:
            rows.append(Row(f"ceiling, {streams} streams (k chunks/s)", rate(key), cpu_of(key), core(key)))
            rows.append(Row(f"proxy CPU ms/1k chunks, {streams} unpaced", proxy_cpu(key), cpu_of(key), core(key)))
    if "paced" in ran:
        rows.append(Row(f"paced {PACED_STREAMS} x {settings.paced_rate:g}/s (k chunks/s)", rate("paced"),
                        cpu_of("paced"), core("paced")))
        rows.append(Row(f"proxy CPU ms/1k chunks, paced {PACED_STREAMS}", proxy_cpu("paced"), cpu_of("paced"),
                        core("paced")))
    rows.append(Row("idle RSS after each round (MB)", {name: raw["rss_mb"][name] for name in names}))
    return rows


def core_shares(raw: dict, names: list[str]) -> dict[str, dict]:
    """Per party, the share of one core it used in each measured block: the upstream, the client, and what
    the machine did beside this benchmark's processes (other processes, interrupts), with the largest."""
    shares: dict[str, dict] = {}
    for who in ("upstream", "client", "elsewhere"):
        values = []
        for measure in MEASURES:
            for name in names:
                for m in raw[measure][name]:
                    cpu = m["cpu_seconds"]
                    if who == "elsewhere":
                        used = cpu["machine"] - cpu["client"] - cpu["upstream"] - cpu.get("proxy", 0.0)
                    else:
                        used = cpu[who]
                    values.append((used / m["seconds"], f"{measure}, {name}"))
        if values:
            largest = max(values)
            shares[who] = {"median": statistics.median(v for v, _ in values), "max": largest[0], "max_at": largest[1]}
    return shares


def limits(raw: dict, names: list[str]) -> dict[str, str]:
    """Per window measure and proxy, what held its chunks/s: the proxy (a core of its own used up), the
    upstream (its core), or the machine (every core busy); from the medians over rounds."""
    cores = os.cpu_count() or 1
    notes = {}
    for measure in (*(f"ceiling{streams}" for streams in CEILING_STREAMS), "paced"):
        said = []
        for name in names:
            windows = raw[measure][name]
            if name == "direct" or not windows:
                continue
            share = {who: statistics.median(m["cpu_seconds"][who] / m["seconds"] for m in windows)
                     for who in ("machine", "upstream", "client", "proxy")}
            if share["proxy"] > 0.9:
                what = "the proxy itself"
            elif share["upstream"] > 0.85:
                what = "the upstream, not the proxy"
            elif share["machine"] > 0.9 * cores:
                what = "the machine: every core busy, the proxy's share short of one"
            else:
                continue
            said.append(f"{name} {what} (proxy {share['proxy']:.0%} of a core, upstream {share['upstream']:.0%}, "
                        f"client {share['client']:.0%}, machine {share['machine']:.2f} of {cores} cores)")
        if said:
            notes[measure] = "held by " + "; ".join(said)
    return notes


# --- profiles (--py-spy) -----------------------------------------------------------------------

def py_spy_binary() -> str | None:
    return shutil.which("py-spy") or next((str(p) for p in [Path(PY).parent / "py-spy"] if p.exists()), None)


def start_py_spy(processes: Fleet, directory: Path, name: str, pid: int) -> subprocess.Popen:
    directory.mkdir(parents=True, exist_ok=True)
    return processes.spawn(f"py-spy-{name}", [
        py_spy_binary() or "py-spy", "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--threads",
        "--nonblocking", "--output", str(directory / f"{name}.txt"),
    ])


def stop_py_spy(spies: list[subprocess.Popen]) -> None:
    for spy in spies:  # SIGINT: py-spy writes what it sampled, then exits
        if spy.poll() is None:
            spy.send_signal(signal.SIGINT)
    for spy in spies:
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()


def own_time(path: Path, top: int = 14) -> list[str]:
    """The functions on top of the stack in `path` (py-spy's collapsed stacks), waits left out, with their share:
    profile_burst.py's own-time table."""
    own = sample_tables(parse_collapsed(path.read_text()), own_code="")["own"]
    total = sum(own.values())
    return [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)] if total else ["  (no samples)"]


# --- the run ----------------------------------------------------------------------------------

MEASURES = ("burst", *(f"ceiling{streams}" for streams in CEILING_STREAMS), "paced")


@dataclass
class Settings:
    rounds: int
    window: float
    warmup: float
    bursts: int
    stream_chunks: int
    paced_rate: float
    capture_buffer: int
    loop: str | None  # the Python proxies' event loop; None: whichever swaplab picks
    llama_swap: tuple[str, str] | None  # (binary, its version line)
    events_per_write: int = 8  # the upstream's, unpaced (fastupstream.py --events-per-write)
    measures: tuple[str, ...] = ()  # which of MEASURES run (--only); all by default
    py_spy: Path | None = None  # where the proxies' profiles go (--py-spy)


def parse_settings() -> tuple[Settings, str | None]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds, shorter windows, fewer bursts")
    parser.add_argument("--rounds", type=int, help="rounds (default 5, --quick 2)")
    parser.add_argument("--json", help="write every raw number here")
    parser.add_argument("--llama-swap", metavar="PATH", help="a llama-swap binary to measure beside the others")
    parser.add_argument("--window", type=float, help="seconds each window is counted over (default 5, --quick 2)")
    parser.add_argument("--warmup", type=float, help="seconds streamed before a window opens (default 1, --quick 0.5)")
    parser.add_argument("--bursts", type=int, help="bursts of 64 per path per round (default 10, --quick 4)")
    parser.add_argument("--stream-chunks", type=int, default=2000, help="token events per stream in the windows (2000)")
    parser.add_argument("--paced-rate", type=float, default=100.0, help="chunks per second per paced stream (100)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"),
                        help="the event loop of swaplab (SWAPLAB_EVENT_LOOP) and the passthrough "
                        "(default: the one swaplab picks by itself)")
    parser.add_argument("--capture-buffer", type=int, default=5, metavar="MIB",
                        help="captureBuffer of swaplab and llama-swap alike (default 5)")
    parser.add_argument("--events-per-write", type=int, default=8, metavar="N",
                        help="the upstream's unpaced events per write (fastupstream.py; default 8, a turn's "
                        "events in one write; 1: a write per event, which makes the upstream the limit here)")
    parser.add_argument("--py-spy", metavar="DIR", type=Path,
                        help="sample swaplab and the passthrough with py-spy over the whole run (py-spy is not a "
                        "dependency: pip install py-spy; root, or ptrace allowed): DIR/NAME.txt, collapsed stacks, "
                        "and a table of where each spent its time")
    parser.add_argument("--only", metavar="MEASURE[,...]",
                        help=f"run only these measures, of {', '.join(MEASURES)} (default: all)")
    args = parser.parse_args()
    only = tuple(m.strip() for m in args.only.split(",") if m.strip()) if args.only else MEASURES
    unknown = [m for m in only if m not in MEASURES]
    if unknown or not only:
        raise UsageError(f"--only {args.only}: say one or more of {', '.join(MEASURES)}, separated by commas")
    if args.events_per_write < 1:
        raise UsageError("--events-per-write must be at least 1")
    if args.loop == "uvloop" and default_loop() != "uvloop":
        raise UsageError("--loop uvloop: uvloop is not importable here (pip install uvloop)")
    settings = Settings(
        rounds=args.rounds or (2 if args.quick else 5),
        window=args.window or (2.0 if args.quick else 5.0),
        warmup=args.warmup or (0.5 if args.quick else 1.0),
        bursts=args.bursts or (4 if args.quick else 10),
        stream_chunks=args.stream_chunks, paced_rate=args.paced_rate, capture_buffer=args.capture_buffer,
        loop=args.loop,
        llama_swap=llama_swap_binary(args.llama_swap) if args.llama_swap else None,  # before anything starts
        events_per_write=args.events_per_write, measures=tuple(m for m in MEASURES if m in only),
        py_spy=args.py_spy,
    )
    if settings.py_spy is not None and not py_spy_binary():
        raise UsageError("--py-spy: py-spy is not installed here (pip install py-spy)")
    return settings, args.json


async def start_routes(processes: Fleet, settings: Settings, loops: dict[str, str]) -> dict[str, Route]:
    """The upstream and a route through each proxy, each answering; `loops` gets the Python proxies' loops."""
    workdir = processes.workdir
    upstream_port = free_port()
    direct = f"http://127.0.0.1:{upstream_port}"
    process = processes.spawn("upstream", [PY, str(HERE / "fastupstream.py"), "--port", str(upstream_port),
                                           "--model", MODEL, "--events-per-write", str(settings.events_per_write)])
    await wait_up(f"{direct}/health", process, "fastupstream", workdir / "upstream.log")
    upstream = psutil.Process(process.pid)
    routes = {"direct": Route("direct", direct, None, upstream)}

    async def proxy(name: str, argv: list[str], port: int) -> psutil.Process:
        process = processes.spawn(name, argv)
        await wait_up(f"http://127.0.0.1:{port}/health", process, name, workdir / f"{name}.log")
        routes[name] = Route(name, f"http://127.0.0.1:{port}", psutil.Process(process.pid), upstream)
        return routes[name].proxy

    if settings.loop:
        os.environ["SWAPLAB_EVENT_LOOP"] = settings.loop  # inherited by swaplab serve
    port = free_port()
    (workdir / "swaplab.yaml").write_text(swaplab_config(upstream_port, settings.capture_buffer))
    await proxy("swaplab", [
        PY, "-m", "swaplab", "serve", "--config", str(workdir / "swaplab.yaml"), "--db", str(workdir / "swaplab.db"),
        "--listen", f"127.0.0.1:{port}", "--state-dir", str(workdir / "state"),
    ], port)
    # swaplab logs its loop as it starts; a swaplab that names none runs asyncio's.
    said = [line.split("event loop: ", 1)[1] for line in (workdir / "swaplab.log").read_text().splitlines()
            if "event loop: " in line]
    loops["swaplab"] = said[0] if said else "asyncio (its log names no loop)"
    loops["passthrough"] = settings.loop or ("uvloop" if loops["swaplab"].startswith("uvloop") else "asyncio")

    port = free_port()
    await proxy("passthrough", [PY, str(Path(__file__).resolve()), "_passthrough", "--port", str(port),
                                "--upstream", direct, "--loop", loops["passthrough"]], port)
    if settings.llama_swap:
        port = free_port()
        (workdir / "llama-swap.yaml").write_text(llama_swap_config(upstream_port, settings.capture_buffer))
        await proxy("llama-swap", [settings.llama_swap[0], "--config", str(workdir / "llama-swap.yaml"),
                                   "--listen", f"127.0.0.1:{port}"], port)
    order = ("direct", "passthrough", "swaplab", "llama-swap")
    return {name: routes[name] for name in order if name in routes}


async def run_rounds(routes: dict[str, Route], client: Client, settings: Settings, raw: dict) -> None:
    """Every measure of every route, round by round, the routes' order rotating; results appended to `raw`."""
    names = list(routes)
    direct = routes["direct"].url
    last = "the checks"
    for round_index in range(settings.rounds):
        order = names[round_index % len(names):] + names[: round_index % len(names)]
        began = time.monotonic()
        for measure in settings.measures:
            for name in order:
                await upstream_idle(direct, last)
                route = routes[name]
                if measure == "burst":
                    result = await burst_block(route, settings.bursts)
                elif measure == "paced":
                    result = await stream_window(client, route, PACED_STREAMS, settings.stream_chunks,
                                                 settings.paced_rate, settings.warmup, settings.window)
                else:
                    result = await stream_window(client, route, int(measure.removeprefix("ceiling")),
                                                 settings.stream_chunks, 0, settings.warmup, settings.window)
                raw[measure][name].append(result)
                last = f"{name}, {measure}"
        await upstream_idle(direct, last)
        await asyncio.sleep(1.0)  # idle, then each proxy's resident memory
        for name in names:
            raw["rss_mb"][name].append(routes[name].resident_mb())
        print(f"  round {round_index + 1}/{settings.rounds}: {time.monotonic() - began:.0f} s", flush=True)


def stop_all(processes: Fleet) -> None:
    """Every process started, and whatever a router left running of its model's `cmd` (a sleep)."""
    children = []
    for started in processes.processes:
        try:
            children += psutil.Process(started.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    processes.close()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def print_results(raw: dict, names: list[str], settings: Settings, report: dict) -> None:
    rows = build_rows(raw, names, settings)
    lines, report["rows"] = table(rows, names)
    print()
    print("\n".join(lines))
    print("\nmedian and min–max over rounds; ratios of the medians, [their range taken round by round], "
          "? = rounds on both sides of 1: no difference told from the noise.\nburst rows: direct's own TTFB, the others' "
          "added over it. upstream, client: their own CPU ms per 1000 chunks in that measure (a chunk is one "
          "`data: ` event); proxy: the share of one core the proxy used in the window.")
    noisy = [f"{entry['measure']} ({key.removeprefix('vs_').replace('_', '-')})" for entry in report["rows"]
             for key in ("vs_passthrough", "vs_llama_swap") if (entry.get(key) or {}).get("noisy")]
    if noisy:
        print("too noisy to conclude, or no difference (the spread over rounds exceeds the difference): "
              + "; ".join(noisy))
    report["core_shares"] = shares = core_shares(raw, names)
    for who, what in (("upstream", "the upstream"), ("client", "the client"),
                      ("elsewhere", "the machine beside this benchmark's processes (others, interrupts)")):
        print(f"{what}: {shares[who]['median']:.0%} of one core (median over measures), "
              f"at most {shares[who]['max']:.0%} ({shares[who]['max_at']})")
    for measure, note in limits(raw, names).items():
        report.setdefault("limits", {})[measure] = note
        print(f"{measure}: {note}")
    # Interrupts alone take a few percent (more at 25k packets a second); much more is other work.
    if shares["elsewhere"]["median"] > 0.15:
        print(f"the machine was busy with other work ({shares['elsewhere']['median']:.0%} of a core in a median "
              "measure): this run is noisier than a quiet machine's")


async def main() -> int:
    try:
        settings, json_path = parse_settings()
    except UsageError as error:
        print(f"ceiling.py: {error}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="swaplab-ceiling-"))
    processes = Fleet(workdir)
    client = Client(workdir)
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    loops = {"upstream": default_loop(), "client": default_loop()}
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "aiohttp": aiohttp.__version__},
        "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loops": loops,
        "settings": {**settings.__dict__, "llama_swap": dict(zip(("binary", "version"), settings.llama_swap))
                     if settings.llama_swap else None},
    }
    print(f"commit {commit}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
          + (f", llama-swap {settings.llama_swap[1]}" if settings.llama_swap else ""), flush=True)
    raw: dict = {}
    names: list[str] = []
    status = 0
    spies: list[subprocess.Popen] = []
    try:
        routes = await start_routes(processes, settings, loops)
        names = list(routes)
        for route in routes.values():  # a router's first request starts its model
            await check_path(route.name, route.url, settings.stream_chunks)
        if settings.py_spy is not None:
            spies = [start_py_spy(processes, settings.py_spy, name, routes[name].proxy.pid)
                     for name in ("passthrough", "swaplab")]
        await client.start()
        print("event loops: " + ", ".join(f"{who} {loop}" for who, loop in loops.items()), flush=True)
        raw.update({measure: {name: [] for name in names} for measure in (*MEASURES, "rss_mb")})
        print(f"{settings.rounds} rounds; each path per round: {settings.bursts} bursts of {BURST_STREAMS}, then "
              f"{settings.window:g} s windows (after {settings.warmup:g} s) of "
              f"{', '.join(map(str, CEILING_STREAMS))} unpaced streams and {PACED_STREAMS} at "
              f"{settings.paced_rate:g}/s; the upstream writes unpaced events {settings.events_per_write} a write, "
              "paced ones one a write"
              + (f"; only {', '.join(settings.measures)}" if settings.measures != MEASURES else ""), flush=True)
        await run_rounds(routes, client, settings, raw)
    except PathFailed as error:
        print(f"\nFAILED: {error}")
        report["failure"] = str(error)
        status = 1
    finally:
        await client.close()
        stop_py_spy(spies)
        stop_all(processes)
    report["raw"] = raw
    if status == 0:
        print_results(raw, names, settings, report)
    if settings.py_spy is not None and spies:
        for name in ("passthrough", "swaplab"):
            profile = settings.py_spy / f"{name}.txt"
            if profile.exists():
                print(f"\nwhere {name} spent its time over the run (py-spy, own time, waits left out; {profile}):")
                print("\n".join(own_time(profile)))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2, default=str))
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == ["_client"]:
        with asyncio.Runner(loop_factory=loop_factory(default_loop())) as runner:
            runner.run(client_main())
    elif sys.argv[1:2] == ["_passthrough"]:
        passthrough_main(sys.argv[2:])
    else:
        raise SystemExit(asyncio.run(main()))
