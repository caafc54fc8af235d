"""How one model request moves through swaplab's modules: its stays, and how often it comes back.

A reader follows a request by its calls. Where each concern is a stage called from one
place, the request goes down into a stage and back; where the stages call each other
(the relay calling the heartbeat, which writes through the reply, then the observation,
then the heartbeat again), the reader is sent back and forth. This counts that, the same
way before and after a change.

The router (`swaplab serve`, in front of benchmarks/fastupstream.py) runs in a child
process whose `Forwarder.handle_model_request` is wrapped: a request that carries
`X-Swaplab-Trace` is traced with `sys.setprofile` from that call until it returns. Every
call into a `swaplab.` module and every return to one is an event; consecutive events in
one module are one stay. What a coroutine does at an `await` that suspends (and its
resumption) is not a call, so it is left out: the count is of the logical call tree,
which a reader follows, not of the event loop's turns. Printed per case:

  stays    the runs of consecutive events in one module
  modules  the distinct modules the request met
  returns  stays - modules: how many times the request came back to a module it had left
  edges    the distinct caller -> callee module pairs (with `--edges`, each listed)
  across   calls from one stage's module into another stage's: the stages calling each other
           rather than being called in turn from the one place that composes them (`STAGES`)

Cases: a streamed and a whole chat completion, on the lane and on aiohttp's server
(SWAPLAB_LANE=off), each after warm-up requests, so first-call work (imports, caches) is
not counted. The streamed answer is paced (an event every 50 ms), so each event is a chunk of
its own and the counts do not depend on how the machine's timing merges them.

    .venv/bin/python benchmarks/request_path.py [--edges] [--path]
"""

from __future__ import annotations

import argparse
import asyncio
import dis
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from ceiling import MODEL, swaplab_config  # benchmarks/ceiling.py: the same model and config
from overhead import chat_body, free_port, wait_http  # benchmarks/overhead.py

HERE = Path(__file__).resolve().parent
PY = sys.executable
TRACE_HEADER = "X-Swaplab-Trace"
RESUME = dis.opmap["RESUME"]
# The request path's concerns, by the modules that hold them (the composers, `path.forward`,
# `path.exchange` and `relay.answer`, and the layers below, `door`, `config`, are none of them).
STAGES = {
    "swaplab.fleet": "admission",
    "swaplab.router.relay.proxy": "relay",
    "swaplab.router.relay.wire": "relay",
    "swaplab.router.relay.keepalive": "heartbeats",
    "swaplab.router.watch": "observation",
}
YIELD_VALUE = dis.opmap["YIELD_VALUE"]


def _module(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("swaplab.") else None


def trace_router(argv: list[str], out: Path) -> None:
    """Run `swaplab serve argv`, tracing each request that carries `TRACE_HEADER` into `out`/<n>.json."""
    from swaplab.cli import main as swaplab_main
    from swaplab.router.path.forward import Forwarder

    original = Forwarder.handle_model_request
    traced = 0

    async def handle(self, request):
        nonlocal traced
        if TRACE_HEADER not in request.headers:
            return await original(self, request)
        events: list[tuple[str, str, str | None]] = []  # (event, module, caller's module)

        def hook(frame, event, arg):
            if event == "call":
                code = frame.f_code.co_code
                lasti = frame.f_lasti
                # A fresh call starts at RESUME 0; a coroutine resumed after an await is RESUME > 0.
                if lasti >= 0 and code[lasti] == RESUME and code[lasti + 1] != 0:
                    return
                module = _module(frame)
                if module is not None:
                    back = frame.f_back
                    events.append(("call", module, _module(back) if back is not None else None))
            elif event == "return":
                lasti = frame.f_lasti
                if lasti >= 0 and frame.f_code.co_code[lasti] == YIELD_VALUE:
                    return  # suspended at an await, not returned
                back = frame.f_back
                module = _module(back) if back is not None else None
                if module is not None:
                    events.append(("return", module, _module(frame)))

        sys.setprofile(hook)
        try:
            return await original(self, request)
        finally:
            sys.setprofile(None)
            traced += 1
            target = out / f"{traced}.json"
            partial = target.with_suffix(".part")
            partial.write_text(json.dumps(events))
            partial.rename(target)

    Forwarder.handle_model_request = handle
    sys.exit(swaplab_main(["serve", *argv]))


def stage(module: str) -> str | None:
    return next((name for prefix, name in STAGES.items() if module == prefix or module.startswith(prefix + ".")), None)


def summary(events: list[list]) -> dict:
    stays: list[str] = []
    edges: dict[tuple[str, str], int] = {}
    for event, module, other in events:
        if not stays or stays[-1] != module:
            stays.append(module)
        if event == "call" and other is not None and other != module:
            edges[(other, module)] = edges.get((other, module), 0) + 1
    modules = sorted(set(stays))
    across = sum(calls for (caller, callee), calls in edges.items()
                 if stage(caller) is not None and stage(callee) is not None and stage(caller) != stage(callee))
    return {"stays": stays, "modules": modules, "returns": len(stays) - len(modules), "edges": edges,
            "across": across}


async def run_case(url: str, stream: bool, out: Path, seen: int) -> dict:
    body = chat_body(MODEL, stream, 4)
    if stream:  # each event its own write, 50 ms apart: each its own chunk, so the count does not hang on timing
        body["x_chunks_per_second"] = 20
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm-up: first-call work is not the path
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                await response.read()
        # The warm-up's rows booked now, not while the traced request is on its way; on a connection
        # of its own, as a route the lane does not serve hands its connection to aiohttp's server.
        async with aiohttp.ClientSession() as other, other.get(f"{url}/api/activity?limit=1") as response:
            await response.read()
        async with session.post(f"{url}/v1/chat/completions", json=body, headers={TRACE_HEADER: "1"}) as response:
            await response.read()
            assert response.status == 200, f"the traced request answered {response.status}"
    target = out / f"{seen + 1}.json"
    deadline = time.monotonic() + 30
    while not target.exists():  # written as the handler returns, which may follow the reply's last byte
        if time.monotonic() > deadline:
            raise SystemExit("the router wrote no trace")
        await asyncio.sleep(0.01)
    return summary(json.loads(target.read_text()))


def short(module: str) -> str:
    return module.removeprefix("swaplab.").removeprefix("router.")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", action="store_true", help="list each caller -> callee module pair")
    parser.add_argument("--path", action="store_true", help="print each case's stays in order")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="swaplab-request-path-"))
    upstream = free_port()
    fast = subprocess.Popen([PY, str(HERE / "fastupstream.py"), "--port", str(upstream), "--model", MODEL],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        await wait_http(f"http://127.0.0.1:{upstream}/health")
        for lane in (True, False):
            port = free_port()
            out = workdir / ("lane" if lane else "aiohttp")
            out.mkdir()
            config = workdir / "swaplab.yaml"
            config.write_text(swaplab_config(upstream, capture_buffer=5))
            env = dict(os.environ)
            if not lane:
                env["SWAPLAB_LANE"] = "off"
            router = subprocess.Popen(
                [PY, str(Path(__file__).resolve()), "_router", str(out), "--config", str(config),
                 "--listen", f"127.0.0.1:{port}", "--state-dir", str(out / "state"), "--db", str(out / "db")],
                env=env, stdout=subprocess.DEVNULL, stderr=open(out / "log", "wb"),
            )
            try:
                url = f"http://127.0.0.1:{port}"
                await wait_http(f"{url}/health")
                for seen, stream in enumerate((True, False)):
                    case = f"{'lane' if lane else 'aiohttp'}, {'streamed' if stream else 'whole'}"
                    rows.append((case, await run_case(url, stream, out, seen)))
            finally:
                router.terminate()
                router.wait(30)
    finally:
        fast.terminate()
    print(f"{'case':<20} {'stays':>6} {'modules':>8} {'returns':>8} {'edges':>6} {'across':>7}")
    for case, result in rows:
        print(f"{case:<20} {len(result['stays']):>6} {len(result['modules']):>8} {result['returns']:>8} "
              f"{len(result['edges']):>6} {result['across']:>7}")
    for case, result in rows:
        if args.path:
            print(f"\n{case}: " + " > ".join(short(m) for m in result["stays"]))
        if args.edges:
            print(f"\n{case}, caller -> callee (calls):")
            for (caller, callee), calls in sorted(result["edges"].items()):
                crossing = stage(caller) is not None and stage(callee) not in (None, stage(caller))
                print(f"  {short(caller)} -> {short(callee)} ({calls})" + ("   across stages" if crossing else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_router":
        trace_router(sys.argv[3:], Path(sys.argv[2]))
    sys.exit(asyncio.run(main()))
