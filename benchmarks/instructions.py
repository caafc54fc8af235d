"""Instructions a proxy executes per request, counted by valgrind (callgrind): a measure no busy machine moves.

Times on a shared 2-core machine wander by 10-20% from run to run (benchmarks/ceiling.py
shows it). Instructions do not: the same code on the same inputs counts the same whatever
else runs. Here each proxy runs under `valgrind --tool=callgrind` with counting off, in
front of benchmarks/fastupstream.py (not under valgrind), and gets warm-up bursts; then its
counters are zeroed, it serves `--bursts` bursts of 64 streaming requests (benchmarks/burst.py,
16 tokens each, as ceiling.py's burst), and its counts are dumped after the batch of
bookkeeping has run. Every thread of the proxy is counted (swaplab's activity writer too).
What a count leaves out: time in the kernel (system calls, the network stack) and waiting;
so it ranks the proxies' own code, not their whole cost, which ceiling.py's CPU rows give.

  passthrough    benchmarks/passthrough.py's app (on uvloop, as ceiling.py runs it)
  swaplab        `swaplab serve` (the lane, router/door/lane.py)
  swaplab-aiohttp  the same with SWAPLAB_LANE=off: every request through aiohttp's server

valgrind is a Debian package (`apt-get install valgrind`), not a dependency of swaplab.
Each proxy takes about a minute under valgrind here.

    .venv/bin/python benchmarks/instructions.py [--bursts 10] [--paths swaplab,passthrough]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from burst import Burst, chat_request  # benchmarks/burst.py, beside this script
from ceiling import MODEL, swaplab_config  # benchmarks/ceiling.py: the same model and config
from overhead import chat_body, free_port, wait_http  # benchmarks/overhead.py

HERE = Path(__file__).resolve().parent
PY = sys.executable
PATHS = ("passthrough", "swaplab", "swaplab-aiohttp")


def command(path: str, port: int, upstream: int, workdir: Path) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if path == "passthrough":
        return [PY, str(HERE / "ceiling.py"), "_passthrough", "--port", str(port), "--upstream",
                f"http://127.0.0.1:{upstream}", "--loop", "uvloop"], env
    config = workdir / f"{path}.yaml"
    config.write_text(swaplab_config(upstream, capture_buffer=5))
    if path == "swaplab-aiohttp":
        env["SWAPLAB_LANE"] = "off"
    return [PY, "-m", "swaplab", "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}",
            "--state-dir", str(workdir / path), "--db", str(workdir / f"{path}.db")], env


async def count(path: str, upstream: int, workdir: Path, bursts: int, tokens: int) -> float:
    """Instructions per request of `path` over `bursts` bursts of 64."""
    port = free_port()
    argv, env = command(path, port, upstream, workdir)
    out = workdir / f"{path}.callgrind"
    process = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p", *argv],
        env=env, stdout=subprocess.DEVNULL, stderr=open(workdir / f"{path}.log", "wb"),
    )

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(process.pid)], capture_output=True, check=True)

    try:
        url = f"http://127.0.0.1:{port}"
        await wait_http(f"{url}/health", timeout=600)
        burst = Burst(url, 64)
        await burst.open()
        measured = chat_request(url, chat_body(MODEL, True, tokens))
        warm = chat_request(url, chat_body(MODEL, True, 300))
        control("-i", "on")  # instrumented from here; counted from the zero below
        for request in (warm, warm, measured, measured, measured):
            await burst.fire(request)
        await asyncio.sleep(2.0)  # the warm-up's bookkeeping, under valgrind's slowness
        control("-z")
        for _ in range(bursts):
            replies = await burst.fire(measured)
            assert all(reply.status == 200 for reply in replies), f"{path}: a request failed"
            await asyncio.sleep(0.3)
        await asyncio.sleep(2.5)  # the bookkeeping of the last burst (50 ms of quiet, stretched by valgrind)
        control("-d")
        await burst.close()
    finally:
        process.terminate()
        process.wait(60)
    dumps = sorted(glob.glob(f"{out}.*.*"))  # the dump asked for (the one at exit has no part number)
    if not dumps:
        raise SystemExit(f"{path}: callgrind wrote no dump; its log: {workdir / f'{path}.log'}")
    for line in Path(dumps[0]).read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1]) / (bursts * 64)
    raise SystemExit(f"{path}: no summary in {dumps[0]}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bursts", type=int, default=10, help="measured bursts of 64 per proxy (10)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per streamed answer (16)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"which of {', '.join(PATHS)} (all)")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in PATHS for p in paths):
        print(f"instructions.py: --paths takes some of {', '.join(PATHS)}", file=sys.stderr)
        return 2
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("instructions.py: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="swaplab-instructions-"))
    upstream = free_port()
    fast = subprocess.Popen([PY, str(HERE / "fastupstream.py"), "--port", str(upstream), "--model", MODEL],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counts: dict[str, float] = {}
    try:
        await wait_http(f"http://127.0.0.1:{upstream}/health")
        for path in paths:
            began = time.monotonic()
            counts[path] = await count(path, upstream, workdir, args.bursts, args.tokens)
            print(f"  {path}: {counts[path] / 1e3:.1f}k instructions per request ({time.monotonic() - began:.0f} s)",
                  flush=True)
    finally:
        fast.terminate()
    print(f"\ninstructions per request, bursts of 64 streams of {args.tokens} tokens ({args.bursts} bursts counted)")
    for path, value in counts.items():
        line = f"{path:<16} {value / 1e3:8.1f}k"
        if path != "passthrough" and "passthrough" in counts:
            line += f"   {value / counts['passthrough']:.2f}x the passthrough's"
        if path == "swaplab" and "swaplab-aiohttp" in counts:
            line += f"   {value / counts['swaplab-aiohttp']:.2f}x swaplab's without the lane"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
