"""Does the router disappear in the measurements? Side by side, in one run, same upstreams:

  direct       the upstream server itself
  passthrough  a minimal aiohttp proxy (benchmarks/passthrough.py): the floor for Python
  swaplab      `swaplab serve` with the upstreams as its models
  litellm      the LiteLLM proxy, when it is installed (optional)

Upstreams: `swaplab sim` unpaced (pure overhead), `swaplab sim` paced at 50 tok/s per
stream, and llama.cpp's server with SmolLM2 (the real default). Paths are interleaved
request by request, so drift on a shared machine hits them all alike. It prints ratios
against the bars of shared/specs/router.md section 4 and exits 1 if one is missed;
`--json FILE` keeps every raw number.

    .venv/bin/python benchmarks/overhead.py [--quick] [--json results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

HERE = Path(__file__).resolve().parent
PY = sys.executable


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
    async with session.post(f"{base}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{base}: HTTP {response.status}: {await response.text()}")
        async for chunk in response.content.iter_any():
            if first is None:
                first = time.perf_counter()
            events += chunk.count(b"data: ")
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


def router_config(fast: int, paced: int, llama: int | None, smollm2: str | None) -> str:
    sim = f"{shlex.quote(PY)} -m swaplab sim"
    text = f"""
healthCheckTimeout: 120
groups:
  bench:
    swap: false
    exclusive: false
    members: [fast, paced{', llama' if llama else ''}]
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
      {shlex.quote(PY)} -m swaplab.backends.llamacpp --model {shlex.quote(smollm2)}
      --port {llama} --parallel 2 --threads 1 --ctx-size 2048
    proxy: http://127.0.0.1:{llama}
    timeouts: {{idleConn: 4}}
"""
    return text


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
    args = parser.parse_args()
    n_c1 = 60 if args.quick else 400
    rounds = 1 if args.quick else 3
    steady_seconds = 4.0 if args.quick else 8.0
    n_llama = 10 if args.quick else 40
    n_disconnect = 5 if args.quick else 20

    smollm2 = None
    if not args.no_llamacpp:
        try:
            from swaplab.backends.models import smollm2_path

            smollm2 = str(smollm2_path())
        except Exception as error:  # the demo model is optional here
            print(f"(skipping llama.cpp: {error})")
    workdir = Path(tempfile.mkdtemp(prefix="swaplab-overhead-"))
    fast, paced = free_port(), free_port()
    llama = free_port() if smollm2 else None
    config = workdir / "config.yaml"
    config.write_text(router_config(fast, paced, llama, smollm2))
    processes = Fleet(workdir)
    report: dict = {"machine": {"cpus": os.cpu_count()}, "raw": {}}
    try:
        router_port = free_port()
        router = processes.spawn("router", [
            PY, "-m", "swaplab", "serve", "--config", str(config), "--db", str(workdir / "swaplab.db"),
            "--listen", f"127.0.0.1:{router_port}", "--state-dir", str(workdir / "state"),
        ])
        swaplab = f"http://127.0.0.1:{router_port}"
        await wait_http(f"{swaplab}/health")
        rss_at_start = psutil.Process(router.pid).memory_info().rss
        upstreams = {"fast": fast, "paced": paced, **({"llama": llama} if llama else {})}
        passthrough: dict[str, str] = {}
        for model, port in upstreams.items():
            async with aiohttp.ClientSession() as session:  # load it through the router
                async with session.post(f"{swaplab}/v1/chat/completions", json=chat_body(model, False, 1)) as r:
                    assert r.status == 200, await r.text()
            pt_port = free_port()
            processes.spawn(f"passthrough-{model}", [
                PY, str(HERE / "passthrough.py"), "--port", str(pt_port), "--upstream", f"http://127.0.0.1:{port}",
            ])
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

        for stream in (False, True):
            kind = "streaming" if stream else "non-streaming"
            print(f"c=1 time to first byte, {kind}, sim unpaced: {n_c1} requests per path ...", flush=True)
            samples = await ttfb_c1(paths_for("fast"), "fast", stream, n_c1, 16)
            report["raw"][f"c1_{kind}"] = samples
            sw, pt = added_p50(samples, "swaplab"), added_p50(samples, "passthrough")
            report[f"added_ms_c1_{kind}"] = {"swaplab": sw * 1e3, "passthrough": pt * 1e3}
            bar(f"added TTFB c=1 {kind}, swaplab / passthrough", ratio(sw, pt), 1.5)
            if "litellm" in samples:
                rows.append((f"added TTFB c=1 {kind}, litellm / passthrough", ratio(added_p50(samples, "litellm"), pt), "", None))

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
