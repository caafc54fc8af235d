"""Does the router disappear in the measurements? Side by side, in one run, same upstreams:

  direct       the upstream server itself
  passthrough  a minimal aiohttp proxy (benchmarks/passthrough.py): the floor for Python
  swaplab      `swaplab serve` with the upstreams as its models
  litellm      the LiteLLM proxy, when it is installed (optional)

The `ollama` measure puts Ollama's `/api/chat` on swaplab beside its OpenAI route on the same
upstream (direct is OpenAI's route on the sim itself): what the translation adds per request,
in time and in the router's CPU.

Upstreams: `swaplab sim` unpaced (pure overhead), `swaplab sim` paced at 50 tok/s per
stream, and llama.cpp's server with SmolLM2 (the real default). Paths are interleaved
request by request, or round by round, so drift on a shared machine hits them all alike.
It prints ratios against the bars of shared/specs/router.md section 4 and exits 1 if
one is missed; `--json FILE` keeps every raw number. The burst measure (64 streams
arriving at one instant) sends from benchmarks/burst.py, prebuilt bytes on warm
connections, so the 64 requests really leave together.

    .venv/bin/python benchmarks/overhead.py [--quick] [--json results.json]
    .venv/bin/python benchmarks/overhead.py --only burst     # one measure alone
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
from burst import Burst, chat_request  # benchmarks/burst.py, beside this script

HERE = Path(__file__).resolve().parent
PY = sys.executable
MEASURES = ("c1", "steady", "disconnect", "burst", "llamacpp", "ollama", "rss")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not come up")
            await asyncio.sleep(0.05)


class Fleet:
    """Every process of the benchmark; all stopped on exit."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.processes: list[subprocess.Popen] = []

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.processes.append(process)
        return process

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def chat_body(model: str, stream: bool, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0,
    }


async def one_request(session: aiohttp.ClientSession, base: str, body: dict) -> tuple[float, float, int]:
    """(time to first body byte, time to the end, data events) of one chat request."""
    sent = time.perf_counter()
    first = None
    events = 0
    tail = b""  # the last bytes of what came, so a `data: ` split between two reads counts once
    async with session.post(f"{base}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{base}: HTTP {response.status}: {await response.text()}")
        async for chunk in response.content.iter_any():
            if first is None:
                first = time.perf_counter()
            joined = tail + chunk
            events += joined.count(b"data: ")
            tail = joined[-5:]  # shorter than the marker: never counted twice
    return first - sent, time.perf_counter() - sent, events


async def ttfb_c1(paths: dict[str, str], model: str, stream: bool, n: int, max_tokens: int) -> dict[str, list[float]]:
    """Sequential requests, the paths interleaved request by request."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    sessions = {name: aiohttp.ClientSession() for name in paths}
    try:
        names = list(paths)
        for name in names:  # warm every path's connection
            await one_request(sessions[name], paths[name], chat_body(model, stream, max_tokens))
        for i in range(n):
            order = names[i % len(names):] + names[: i % len(names)]
            for name in order:
                ttfb, _, _ = await one_request(sessions[name], paths[name], chat_body(model, stream, max_tokens))
                samples[name].append(ttfb)
    finally:
        for session in sessions.values():
            await session.close()
    return samples


async def ollama_request(session: aiohttp.ClientSession, base: str, body: dict) -> tuple[float, float, int]:
    """(time to first body byte, time to the end, lines) of one Ollama `/api/chat` request."""
    sent = time.perf_counter()
    first = None
    lines = 0
    async with session.post(f"{base}/api/chat", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{base}: HTTP {response.status}: {await response.text()}")
        async for chunk in response.content.iter_any():
            if first is None:
                first = time.perf_counter()
            lines += chunk.count(b"\n")
    return first - sent, time.perf_counter() - sent, lines


async def ollama_beside_openai(
    direct: str, swaplab: str, model: str, stream: bool, rounds: int, block: int, max_tokens: int,
    router: psutil.Process,
) -> dict[str, dict[str, list[float]]]:
    """Blocks of sequential requests per route, the routes' order shuffled each round: time to first
    byte and to the end of each request, and the router's CPU time per request of each block."""
    openai_body = chat_body(model, stream, max_tokens)
    ollama_body = {"model": model, "messages": openai_body["messages"], "stream": stream,
                   "options": {"num_predict": max_tokens, "temperature": 0}}
    routes = {
        "direct": lambda session: one_request(session, direct, openai_body),
        "openai": lambda session: one_request(session, swaplab, openai_body),
        "ollama": lambda session: ollama_request(session, swaplab, ollama_body),
    }
    results = {name: {"ttfb": [], "total": [], "cpu_per_request": []} for name in routes}
    sessions = {name: aiohttp.ClientSession() for name in routes}

    def cpu() -> float:
        times = router.cpu_times()
        return times.user + times.system

    try:
        for name, send in routes.items():  # warm every route's connection
            await send(sessions[name])
        for _ in range(rounds):
            order = list(routes)
            random.shuffle(order)
            for name in order:
                before = cpu()
                for _ in range(block):
                    ttfb, total, _ = await routes[name](sessions[name])
                    results[name]["ttfb"].append(ttfb)
                    results[name]["total"].append(total)
                results[name]["cpu_per_request"].append((cpu() - before) / block)
    finally:
        for session in sessions.values():
            await session.close()
    return results


def added_p50(samples: dict[str, list[float]], path: str) -> float:
    """Median of paired differences against direct: each pair was measured back to back."""
    return statistics.median(a - b for a, b in zip(samples[path], samples["direct"], strict=True))


async def steady_streams(
    paths: dict[str, str], model: str, streams: int, max_tokens: int, seconds: float, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """`streams` clients in a closed loop, each starting its next stream as the last ends.

    Their first requests are staggered over one stream's length, so what is measured is
    a new stream's wait while the others flow, not the queue of a synchronized burst.
    """
    results = {name: {"ttfb": [], "throughput": []} for name in paths}
    stagger = max_tokens / 50.0

    async def client(session: aiohttp.ClientSession, base: str, index: int, stop_at: float, out: dict) -> int:
        await asyncio.sleep(stagger * index / streams)
        events = 0
        while time.perf_counter() < stop_at:
            ttfb, _, count = await one_request(session, base, chat_body(model, True, max_tokens))
            out["ttfb"].append(ttfb)
            events += count
        return events

    for round_index in range(rounds):
        names = list(paths)
        names = names[round_index % len(names):] + names[: round_index % len(names)]
        for name in names:
            connector = aiohttp.TCPConnector(limit=streams * 2)
            async with aiohttp.ClientSession(connector=connector) as session:
                begun = time.perf_counter()
                counts = await asyncio.gather(
                    *(client(session, paths[name], i, begun + seconds, results[name]) for i in range(streams))
                )
                wall = time.perf_counter() - begun
            results[name]["throughput"].append(sum(counts) / wall)
    return results


async def disconnect_latency(base: str, sim: str, model: str, times: int) -> list[float]:
    """Seconds from a client closing mid-stream to the sim counting the stream cancelled."""
    latencies = []
    async with aiohttp.ClientSession() as session, aiohttp.ClientSession() as probe:
        for _ in range(times):
            async with probe.get(f"{sim}/sim/stats") as response:
                before = (await response.json())["cancelled"]
            response = await session.post(f"{base}/v1/chat/completions", json=chat_body(model, True, 10_000))
            await response.content.readline()
            response.close()
            gone = time.perf_counter()
            while True:
                async with probe.get(f"{sim}/sim/stats") as stats_response:
                    if (await stats_response.json())["cancelled"] > before:
                        break
                if time.perf_counter() - gone > 5:
                    raise RuntimeError(f"{base}: the upstream never saw the disconnect")
                await asyncio.sleep(0.001)
            latencies.append(time.perf_counter() - gone)
    return latencies


async def burst_ttfb(
    paths: dict[str, str],
    model: str,
    streams: int,
    max_tokens: int,
    rounds: int,
    warm_tokens: int,
    proxies: dict[str, psutil.Process],
) -> dict[str, dict[str, list]]:
    """Per path: the TTFB of each of `streams` streaming requests released at one instant, per round,
    and the proxy's CPU seconds over all the rounds (`cpu_seconds`, one entry).

    Each path gets its `streams` connections opened first and warmed by two unmeasured
    bursts of `warm_tokens`-token streams, long enough to overlap, so a proxy's own pool
    to the upstream holds as many connections as the burst needs before anything is
    measured. Then round by round, the paths in a rotating order, each path gets one
    burst. The CPU seconds each proxy process in `proxies` spent over the measured rounds
    are noted too: over all of them, not only inside its own bursts, so work a proxy
    defers past its burst (swaplab's batched bookkeeping) still counts.
    """
    names = list(paths)
    bursts = {name: Burst(url, streams) for name, url in paths.items()}
    measured = {name: chat_request(url, chat_body(model, True, max_tokens)) for name, url in paths.items()}
    warm = {name: chat_request(url, chat_body(model, True, warm_tokens)) for name, url in paths.items()}
    results: dict[str, dict[str, list]] = {name: {"ttfb": [], "cpu_seconds": []} for name in names}
    cpu_at_start: dict[str, float] = {}

    def cpu(name: str) -> float:
        if name not in proxies:
            return 0.0
        times = proxies[name].cpu_times()
        return times.user + times.system

    try:
        for name in names:
            await bursts[name].open()
        for _ in range(2):
            for name in names:
                await bursts[name].fire(warm[name])
        await asyncio.sleep(0.2)  # the warm-up's own bookkeeping is not the measure's
        cpu_at_start = {name: cpu(name) for name in names}
        for round_index in range(rounds):
            order = names[round_index % len(names):] + names[: round_index % len(names)]
            for name in order:
                await asyncio.sleep(0.03)  # what the last burst left behind (closing, recording) settles
                replies = await bursts[name].fire(measured[name])
                if any(reply.events < 2 for reply in replies):
                    raise RuntimeError(f"{paths[name]}: a burst's response was not a stream of events")
                results[name]["ttfb"].append([reply.first_byte for reply in replies])
        await asyncio.sleep(0.2)  # what the last bursts deferred is done
        for name in names:
            results[name]["cpu_seconds"] = [cpu(name) - cpu_at_start[name]]
    finally:
        for burst in bursts.values():
            await burst.close()
    return results


def burst_added(results: dict[str, dict[str, list]], path: str) -> list[float]:
    """Per round, the path's p50 TTFB minus direct's p50 in the same round (measured a moment apart)."""
    return [
        statistics.median(theirs) - statistics.median(direct)
        for theirs, direct in zip(results[path]["ttfb"], results["direct"]["ttfb"], strict=True)
    ]


def bootstrap_ratio(numerator: list[float], denominator: list[float], draws: int = 2000) -> tuple[float, float]:
    """90% interval of median(numerator) / median(denominator), resampling rounds (paired) with replacement."""
    rng = random.Random(0)  # the same interval for the same numbers
    indices = range(len(numerator))
    ratios = []
    for _ in range(draws):
        sample = rng.choices(indices, k=len(numerator))
        low = max(statistics.median(denominator[i] for i in sample), 1e-9)
        ratios.append(max(statistics.median(numerator[i] for i in sample), 0.0) / low)
    ratios.sort()
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws)]


def router_config(
    fast: int, paced: int, llama: int | None, smollm2: str | None, routing: str = "group", capture_buffer: int = 5
) -> str:
    """The router's config: the upstreams run side by side, under a group that never swaps
    (`routing group`) or under llama-swap's matrix router with one set holding them all
    (`routing matrix`), so the matrix's solver and placement are on the measured path."""
    sim = f"{shlex.quote(PY)} -m swaplab sim"
    members = f"fast, paced{', llama' if llama else ''}"
    if routing == "matrix":
        placement = f"""
routing:
  router:
    use: matrix
    settings:
      matrix:
        sets:
          bench: "{members.replace(', ', ' & ')}"
"""
    else:
        placement = f"""
groups:
  bench:
    swap: false
    exclusive: false
    members: [{members}]
"""
    text = f"""
healthCheckTimeout: 120
captureBuffer: {capture_buffer}
{placement.strip()}
models:
  fast:
    cmd: {sim} --port {fast} --model fast
    proxy: http://127.0.0.1:{fast}
    concurrencyLimit: 1000
  paced:
    cmd: {sim} --port {paced} --model paced --tokens-per-second 50
    proxy: http://127.0.0.1:{paced}
    concurrencyLimit: 1000
"""
    if llama:
        text += f"""
  llama:
    cmd: >-
      {shlex.quote(PY)} -m swaplab.builtin.llamacpp --model {shlex.quote(smollm2)}
      --port {llama} --parallel 2 --threads 1 --ctx-size 2048
    proxy: http://127.0.0.1:{llama}
    timeouts: {{idleConn: 4}}
"""
    return text


def measures(text: str) -> tuple[str, ...]:
    """`--only c1,burst`: the measures named, each one of MEASURES."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in MEASURES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or text!r}: measures are {', '.join(MEASURES)}")
    return names


def litellm_available() -> bool:
    try:
        import litellm  # noqa: F401
    except ImportError:
        return False
    return True


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run, noisier)")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip the real llama.cpp upstream")
    parser.add_argument("--json", help="write every raw number here")
    parser.add_argument(
        "--only", type=measures, default=MEASURES, metavar="MEASURE[,...]",
        help=f"run only these measures, of: {', '.join(MEASURES)} (default: all)",
    )
    parser.add_argument(
        "--routing", choices=("group", "matrix"), default="group",
        help="how the router places the upstreams: a group that never swaps (default), or llama-swap's "
        "matrix router with one set holding them all",
    )
    parser.add_argument(
        "--capture-buffer", type=int, default=5, metavar="MIB",
        help="the router's captureBuffer (default 5, as llama-swap's; 0 = no captures)",
    )
    parser.add_argument(
        "--burst-rounds", type=int, help="rounds of the burst measure per upstream (default 60, --quick 10)"
    )
    parser.add_argument(
        "--router-python", default=PY, metavar="COMMAND",
        help="the command that stands for `python` when starting the router, e.g. to profile it: "
        "--router-python '.venv/bin/python -m cProfile -o router.prof' (its ratios are then the profiled router's)",
    )
    args = parser.parse_args()
    wanted = set(args.only)
    n_c1 = 60 if args.quick else 400
    rounds = 1 if args.quick else 3
    steady_seconds = 4.0 if args.quick else 8.0
    n_llama = 10 if args.quick else 40
    n_disconnect = 5 if args.quick else 20
    burst_rounds = args.burst_rounds or (10 if args.quick else 60)

    smollm2 = None
    if not args.no_llamacpp and "llamacpp" in wanted:
        try:
            from swaplab.builtin.models import smollm2_path

            smollm2 = str(smollm2_path())
        except Exception as error:  # the demo model is optional here
            print(f"(skipping llama.cpp: {error})")
    workdir = Path(tempfile.mkdtemp(prefix="swaplab-overhead-"))
    fast, paced = free_port(), free_port()
    llama = free_port() if smollm2 else None
    config = workdir / "config.yaml"
    config.write_text(router_config(fast, paced, llama, smollm2, args.routing, args.capture_buffer))
    processes = Fleet(workdir)
    report: dict = {
        "machine": {"cpus": os.cpu_count()}, "routing": args.routing, "capture_buffer": args.capture_buffer, "raw": {},
    }
    try:
        router_port = free_port()
        router = processes.spawn("router", [
            *shlex.split(args.router_python), "-m", "swaplab", "serve",
            "--config", str(config), "--db", str(workdir / "swaplab.db"),
            "--listen", f"127.0.0.1:{router_port}", "--state-dir", str(workdir / "state"),
        ])
        swaplab = f"http://127.0.0.1:{router_port}"
        await wait_http(f"{swaplab}/health")
        rss_at_start = psutil.Process(router.pid).memory_info().rss
        upstreams = {"fast": fast, "paced": paced, **({"llama": llama} if llama else {})}
        passthrough: dict[str, str] = {}
        passthrough_process: dict[str, psutil.Process] = {}
        for model, port in upstreams.items():
            async with aiohttp.ClientSession() as session:  # load it through the router
                async with session.post(f"{swaplab}/v1/chat/completions", json=chat_body(model, False, 1)) as r:
                    assert r.status == 200, await r.text()
            pt_port = free_port()
            passthrough_process[model] = psutil.Process(processes.spawn(f"passthrough-{model}", [
                PY, str(HERE / "passthrough.py"), "--port", str(pt_port), "--upstream", f"http://127.0.0.1:{port}",
            ]).pid)
            passthrough[model] = f"http://127.0.0.1:{pt_port}"
            await wait_http(f"{passthrough[model]}/health")

        litellm = None
        if litellm_available():
            lite_port = free_port()
            processes.spawn("litellm", [
                PY, "-m", "litellm", "--model", "openai/fast", "--api_base", f"http://127.0.0.1:{fast}/v1",
                "--port", str(lite_port), "--host", "127.0.0.1",
            ])
            litellm = f"http://127.0.0.1:{lite_port}"
            await wait_http(f"{litellm}/health/liveliness")

        def paths_for(model: str) -> dict[str, str]:
            paths = {
                "direct": f"http://127.0.0.1:{upstreams[model]}",
                "passthrough": passthrough[model],
                "swaplab": swaplab,
            }
            if litellm and model == "fast":
                paths["litellm"] = litellm
            return paths

        rows = []

        def bar(label: str, value: float, limit: float, higher_is_better: bool = False) -> None:
            met = value >= limit if higher_is_better else value <= limit
            rows.append((label, value, ("≥ " if higher_is_better else "≤ ") + f"{limit:g}", met))

        def ratio(swaplab_added: float, floor_added: float) -> float:
            # Below the clock's resolution both add "nothing": count that as parity.
            return swaplab_added / floor_added if floor_added > 1e-5 else (1.0 if swaplab_added <= 1e-5 else float("inf"))

        for stream in (False, True) if "c1" in wanted else ():
            kind = "streaming" if stream else "non-streaming"
            print(f"c=1 time to first byte, {kind}, sim unpaced: {n_c1} requests per path ...", flush=True)
            # Each proxy's CPU over the whole loop: each serves only its own requests (a warm-up
            # one and n_c1 measured), so its time per request is its CPU over n_c1 + 1.
            proxies = {"swaplab": psutil.Process(router.pid), "passthrough": passthrough_process["fast"]}
            before = {name: sum(process.cpu_times()[:2]) for name, process in proxies.items()}
            samples = await ttfb_c1(paths_for("fast"), "fast", stream, n_c1, 16)
            cpu_us = {name: (sum(process.cpu_times()[:2]) - before[name]) / (n_c1 + 1) * 1e6
                      for name, process in proxies.items()}
            report["raw"][f"c1_{kind}"] = samples
            sw, pt = added_p50(samples, "swaplab"), added_p50(samples, "passthrough")
            report[f"added_ms_c1_{kind}"] = {"swaplab": sw * 1e3, "passthrough": pt * 1e3}
            report[f"cpu_us_per_request_c1_{kind}"] = cpu_us
            bar(f"added TTFB c=1 {kind}, swaplab / passthrough", ratio(sw, pt), 1.5)
            rows.append((f"  same, CPU time of the proxy process per request ({cpu_us['swaplab']:.0f} µs), "
                         "swaplab / passthrough", cpu_us["swaplab"] / cpu_us["passthrough"], "", None))
            if "litellm" in samples:
                rows.append((f"added TTFB c=1 {kind}, litellm / passthrough", ratio(added_p50(samples, "litellm"), pt), "", None))

        if "steady" in wanted:
            print(f"64 concurrent streams at 50 tok/s, {rounds} round(s) of {steady_seconds:g} s per path ...", flush=True)
            paced_results = await steady_streams(paths_for("paced"), "paced", 64, 50, steady_seconds, rounds)
            report["raw"]["paced64"] = paced_results
            direct_p50 = statistics.median(paced_results["direct"]["ttfb"])
            sw = statistics.median(paced_results["swaplab"]["ttfb"]) - direct_p50
            pt = statistics.median(paced_results["passthrough"]["ttfb"]) - direct_p50
            report["added_ms_paced64"] = {"swaplab": sw * 1e3, "passthrough": pt * 1e3}
            bar("added TTFB p50 at 64 paced streams, swaplab / passthrough", ratio(max(sw, 0), max(pt, 0)), 1.5)
            direct_tps = statistics.mean(paced_results["direct"]["throughput"])
            bar("token throughput at 64 paced streams, swaplab / direct",
                statistics.mean(paced_results["swaplab"]["throughput"]) / direct_tps, 0.98, higher_is_better=True)
            rows.append(("token throughput at 64 paced streams, passthrough / direct",
                         statistics.mean(paced_results["passthrough"]["throughput"]) / direct_tps, "", None))

        # 64 streaming requests at the same instant (a bench or a batch job starting): the
        # p50 waits behind about half the burst in every process on the way, so what a
        # proxy adds here is its per-request cost, times 32 or so.
        for model, label in (("fast", "unpaced sim"), ("paced", "paced sim")) if "burst" in wanted else ():
            print(f"64 streaming requests released at one instant, {label}: {burst_rounds} rounds per path ...",
                  flush=True)
            # 16 tokens unpaced, as at c=1; paced, 8 tokens (140 ms) outlast the burst's first
            # bytes, so the early streams' relaying competes with the late ones' first bytes
            # and their endings do not. The warm-up streams are long enough that all 64
            # overlap, even unpaced.
            tokens, warm_tokens = (16, 300) if model == "fast" else (8, 8)
            proxies = {"swaplab": psutil.Process(router.pid), "passthrough": passthrough_process[model]}
            results = await burst_ttfb(paths_for(model), model, 64, tokens, burst_rounds, warm_tokens, proxies)
            key = "burst_unpaced" if model == "fast" else "burst_paced"
            report["raw"][key] = results
            added = {path: burst_added(results, path) for path in results if path != "direct"}
            sw, pt = statistics.median(added["swaplab"]), statistics.median(added["passthrough"])
            # Over the whole measure (a process's CPU time is counted in 10 ms ticks: one burst is too short).
            cpu_ms = {path: sum(results[path]["cpu_seconds"]) * 1e3 / (64 * burst_rounds) for path in proxies}
            interval = bootstrap_ratio(added["swaplab"], added["passthrough"])
            report[f"added_ms_{key}"] = {
                "method": "per round: p50 of the path's 64 TTFBs minus p50 of direct's 64 in the same round; "
                "the added value is the median over rounds",
                "direct_p50_ms_per_round": [statistics.median(r) * 1e3 for r in results["direct"]["ttfb"]],
                **{path: statistics.median(values) * 1e3 for path, values in added.items()},
                **{f"{path}_per_round": [v * 1e3 for v in values] for path, values in added.items()},
                "ratio_90pct_interval": list(interval),
                "cpu_ms_per_request": cpu_ms,
            }
            bar(f"added TTFB p50, burst of 64 streams, {label}, swaplab / passthrough",
                ratio(max(sw, 0), max(pt, 0)), 1.5)
            rows.append(("  same, upper end of its 90% interval (bootstrap over rounds)", interval[1], "", None))
            rows.append(("  same, CPU time of the proxy process per request, swaplab / passthrough",
                         cpu_ms["swaplab"] / cpu_ms["passthrough"], "", None))
            if "litellm" in added:
                rows.append((f"added TTFB p50, burst of 64 streams, {label}, litellm / passthrough",
                             ratio(max(statistics.median(added["litellm"]), 0), max(pt, 0)), "", None))

        if "disconnect" in wanted:
            print(f"client disconnects mid-stream: {n_disconnect} per path ...", flush=True)
            sim_url = f"http://127.0.0.1:{paced}"
            sw_cancel = await disconnect_latency(swaplab, sim_url, "paced", n_disconnect)
            pt_cancel = await disconnect_latency(passthrough["paced"], sim_url, "paced", n_disconnect)
            report["raw"]["disconnect"] = {"swaplab": sw_cancel, "passthrough": pt_cancel}
            bar("upstream closed after a client disconnect, worst of swaplab's, in units of 100 ms",
                max(sw_cancel) / 0.1, 1.0)
            rows.append(("  same, swaplab p50 / passthrough p50",
                         statistics.median(sw_cancel) / statistics.median(pt_cancel), "", None))

        if llama:
            for stream in (False, True):
                kind = "streaming" if stream else "non-streaming"
                print(f"c=1 time to first byte, {kind}, llama.cpp SmolLM2: {n_llama} requests per path ...", flush=True)
                samples = await ttfb_c1(paths_for("llama"), "llama", stream, n_llama, 4)
                report["raw"][f"llama_c1_{kind}"] = samples
                sw, pt = added_p50(samples, "swaplab"), added_p50(samples, "passthrough")
                report[f"added_ms_llama_c1_{kind}"] = {"swaplab": sw * 1e3, "passthrough": pt * 1e3}
                rows.append((f"llama.cpp: added TTFB c=1 {kind}, swaplab / passthrough", ratio(max(sw, 0), max(pt, 0)), "", None))
                rows.append((f"llama.cpp: TTFB c=1 {kind}, swaplab / direct",
                             statistics.median(samples["swaplab"]) / statistics.median(samples["direct"]), "", None))

        if "ollama" in wanted:
            ollama_rounds, block = (6, 20) if args.quick else (20, 40)
            for stream in (False, True):
                kind = "streaming" if stream else "non-streaming"
                print(f"Ollama's /api/chat beside /v1/chat/completions, c=1 {kind}, sim unpaced: "
                      f"{ollama_rounds} rounds of {block} requests per route ...", flush=True)
                results = await ollama_beside_openai(
                    f"http://127.0.0.1:{fast}", swaplab, "fast", stream, ollama_rounds, block, 16,
                    psutil.Process(router.pid),
                )
                report["raw"][f"ollama_c1_{kind}"] = results
                # Non-streaming: the whole answer is the first byte; streaming: the first line.
                measure = "ttfb" if stream else "total"
                direct_p50 = statistics.median(results["direct"][measure])
                added = {route: statistics.median(results[route][measure]) - direct_p50 for route in ("openai", "ollama")}
                # The mean over every block: a process's CPU time moves in 10 ms ticks, a block's alone is coarse.
                cpu_us = {route: statistics.mean(results[route]["cpu_per_request"]) * 1e6 for route in ("openai", "ollama")}
                report[f"ollama_c1_{kind}"] = {"added_ms": {r: v * 1e3 for r, v in added.items()},
                                               "router_cpu_us_per_request": cpu_us}
                what = "time to first byte" if stream else "time to the whole answer"
                rows.append((f"Ollama c=1 {kind}: added {what}, /api/chat / /v1/chat/completions",
                             ratio(max(added["ollama"], 0), max(added["openai"], 0)), "", None))
                rows.append((f"  same, added ms: /v1/chat/completions {added['openai'] * 1e3:.2f}, "
                             f"/api/chat {added['ollama'] * 1e3:.2f}", added["ollama"] * 1e3, "", None))
                rows.append((f"  same, router CPU µs per request: OpenAI {cpu_us['openai']:.0f}, Ollama {cpu_us['ollama']:.0f};"
                             " Ollama / OpenAI", cpu_us["ollama"] / cpu_us["openai"] if cpu_us["openai"] else float("inf"),
                             "", None))

        if "rss" in wanted:
            await asyncio.sleep(1.0)  # let the router settle into idle
            rss_idle = psutil.Process(router.pid).memory_info().rss
            report["router_rss_mb"] = {"at_start": rss_at_start / 2**20, "idle_after_load": rss_idle / 2**20}
            bar("router idle RSS after the load, in units of 100 MB", rss_idle / 2**20 / 100, 1.0)
    finally:
        processes.close()

    print()
    print(f"{'measure':<78} {'ratio':>7}  {'bar':>7}  verdict")
    for label, value, limit, met in rows:
        verdict = "" if met is None else ("met" if met else "MISSED")
        print(f"{label:<78} {value:>7.3f}  {limit:>7}  {verdict}")
    if not litellm_available():
        print("(LiteLLM not installed: `pip install 'litellm[proxy]'` adds it to the comparison)")
    report["bars"] = [{"measure": label, "ratio": value, "bar": limit, "met": met} for label, value, limit, met in rows]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if all(met is not False for *_, met in rows) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
