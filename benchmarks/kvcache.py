"""What keeping a llama.cpp server's context across a swap (`kvCache:`) buys and what it costs,
on the built-in models: the follow-up of a long conversation after an A B A swap, with the
feature and without, side by side in one run.

One router config per case holds two SmolLM2 entries with the same layout, `smollm2-kept`
(`kvCache: {minTokens: 256}`) and `smollm2-cold` (no kvCache), and Gemma-3-270M as the model
swapped to; no `groups:`, so llama-swap's default holds one model at a time. A round, for
one of the two SmolLM2 entries:

  A   the first turn: a long user message, non-streamed (its `usage.prompt_tokens` is printed)
  B   a short completion on gemma3-270m: it swaps A out, so it is timed too (the kept entry's
      slots are saved during it)
  A   the follow-up: the first message, its answer and a short question, streamed; its time
      to first token (the first content chunk) is the measure, and llama.cpp's `timings` in
      the last chunk say how much of its prompt came from the cache (`cache_n`)

Rounds alternate kept, cold, kept, cold, so drift on a shared machine hits both alike. Each
round has a router of its own (same config, an empty cache folder under one temp
SWAPLAB_KVCACHE_DIR): with two slots, a kept round that inherited the last round's saved
slot would hold the new conversation beside the restored old one, and its swap would save and
restore both, so rounds after the first would measure two conversations instead of one. Each
round's message also starts with its own number, so no prompt prefix is shared across rounds.

Cases (SmolLM2 prefills about 270 tokens/s on 2 CPU cores: the 6k case's cold prefill takes
25 to 50 s, a full run about 8 minutes):

  1k    a ~1,000-token first message, the built-in default layout (ctx 4096, parallel 2)
  slot  ~1,900 tokens, about the longest one slot of that layout (2,048 tokens) holds with
        the follow-up's question and answer
  6k    ~6,000 tokens, ctx 8192, parallel 1

Per case it prints the follow-up's TTFT (median, min-max), its cache_n and prompt_n, the B
request's time (the swap: A's stop, B's start, B's answer), the save and restore seconds from
/metrics (`swaplab:kvcache_save_seconds`, `swaplab:kvcache_restore_seconds`), and the TTFT
ratio cold / kept. A request that fails or a router that does not start ends the run with
exit status 1 and the tail of that router's log.

    .venv/bin/python benchmarks/kvcache.py [--reps 3] [--only 1k] [--only 6k] [--json out.json]
    .venv/bin/python benchmarks/kvcache.py --quick      # one round each, the 1k case only
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
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import psutil

from swaplab.builtin.models import GEMMA3, SMOLLM2, model_path

PYTHON = sys.executable
KEPT, COLD, OTHER = "smollm2-kept", "smollm2-cold", "gemma3-270m"
VARIANTS = (KEPT, COLD)
MIN_TOKENS = 256
FIRST_TURN_TOKENS = 8  # the first answer, carried into the follow-up
FOLLOW_UP_TOKENS = 8  # enough for a first content chunk and the final chunk's timings
QUESTION = "What is item 3?"
TIMEOUT = aiohttp.ClientTimeout(total=900)
SAMPLE = re.compile(r"^(?P<name>[^{\s]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Case:
    name: str
    items: int
    """Sentences in the first message, about 12 to 14 tokens each (calibrated with SmolLM2's tokenizer)."""
    ctx: int
    parallel: int
    what: str


CASES = {
    "1k": Case("1k", 82, 4096, 2, "a ~1,000-token first message, the default layout"),
    "slot": Case("slot", 153, 4096, 2, "about the longest first message one slot holds, the default layout"),
    "6k": Case("6k", 445, 8192, 1, "a ~6,000-token first message, a larger context"),
}


class BenchmarkFailed(Exception):
    """Something the measure needs did not happen (a request failed, a router did not start)."""


@dataclass
class Round:
    """One A B A sequence on one router, and what the router and llama.cpp said about it."""

    case: str
    number: int
    model: str
    first_turn_seconds: float = 0.0
    prompt_tokens: int = 0
    first_cache_n: int | None = None
    swap_seconds: float = 0.0
    """The B request, from sending to its whole answer: A's stop (and save), B's start, B's completion."""
    save_seconds: float = 0.0
    """Sum over the slots saved during B (the metrics histogram's sum grew by this)."""
    slots_saved: int = 0
    saved: list[dict] = field(default_factory=list)
    """`/running`'s `kv_cache.models[KEPT].saved` after B: slot, tokens, bytes."""
    ttft: float = 0.0
    follow_up_seconds: float = 0.0
    follow_up_prompt_tokens: int | None = None
    cache_n: int | None = None
    prompt_n: int | None = None
    restore_seconds: float = 0.0
    slots_restored: int = 0
    restored_tokens: int | None = None
    """`/running`'s `kv_cache.restored_tokens` of the running follow-up model."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_message(number: int, items: int) -> str:
    """Something long to remember; the round's number comes first (and shifts each value), so no
    two rounds share a prompt prefix beyond the chat template's."""
    return f"Conversation {number}. Remember this list. " + " ".join(
        f"Item {i} is the number {i * 7 + number}." for i in range(items))


def wrapper(model: Path, alias: str, ctx: int, parallel: int, threads: int) -> str:
    return (f"{shlex.quote(PYTHON)} -m swaplab.builtin.llamacpp --model {shlex.quote(str(model))}"
            f" --host 127.0.0.1 --port ${{PORT}} --alias {alias} --ctx-size {ctx} --parallel {parallel}"
            f" --threads {threads}")


def render_config(case: Case, threads: int) -> str:
    """Both SmolLM2 entries with the same layout, one keeping its context; Gemma to swap to."""
    smollm2 = model_path(SMOLLM2)
    return f"""healthCheckTimeout: 300
models:
  {KEPT}:
    cmd: {wrapper(smollm2, KEPT, case.ctx, case.parallel, threads)}
    kvCache: {{minTokens: {MIN_TOKENS}}}
  {COLD}:
    cmd: {wrapper(smollm2, COLD, case.ctx, case.parallel, threads)}
  {OTHER}:
    cmd: {wrapper(model_path(GEMMA3), OTHER, 2048, 1, threads)}
"""


class Router:
    """`swaplab serve` as a child, on its own port, state, database and cache folder."""

    def __init__(self, config: Path, home: Path, cache_dir: Path):
        home.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "router.log"
        with open(self.log_path, "wb") as log:  # the child writes to its own copy of the descriptor
            self.popen = subprocess.Popen(
                [PYTHON, "-m", "swaplab", "serve", "--config", str(config), "--listen", f"127.0.0.1:{self.port}",
                 "--state-dir", str(home / "state"), "--db", str(home / "swaplab.db")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "SWAPLAB_KVCACHE_DIR": str(cache_dir)},
            )

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                if self.popen.poll() is not None:
                    raise BenchmarkFailed(f"the router exited with {self.popen.returncode} before answering /health")
                try:
                    async with session.get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=2)) as response:
                        if response.status == 200:
                            return
                except (TimeoutError, aiohttp.ClientError):
                    pass
                if time.monotonic() > deadline:
                    raise BenchmarkFailed(f"the router did not answer /health within {timeout:g} s")
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, as a user stops it (it stops its servers, saving the kept one's slots); SIGKILL
        past a minute. Its servers still alive then (it was killed) are killed too."""
        try:
            children = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        for child in children:
            try:
                child.wait(10)
            except psutil.TimeoutExpired:
                child.kill()
            except psutil.NoSuchProcess:
                pass

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


async def checked_json(response: aiohttp.ClientResponse, what: str) -> dict:
    if response.status != 200:
        raise BenchmarkFailed(f"{what}: HTTP {response.status}: {(await response.text())[:500]}")
    return await response.json(content_type=None)


async def chat(session: aiohttp.ClientSession, url: str, model: str, messages: list[dict]) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": FIRST_TURN_TOKENS, "temperature": 0}
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        return await checked_json(response, f"the first turn on {model}")


async def complete(session: aiohttp.ClientSession, url: str, model: str) -> None:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        await checked_json(response, f"the swap to {model}")


async def streamed_chat(session: aiohttp.ClientSession, url: str, model: str,
                        messages: list[dict]) -> tuple[float, float, dict]:
    """(time to the first content chunk, time to the end, the last chunk that carried `timings` or
    `usage`): llama.cpp puts both in the stream's final chunk when asked for usage."""
    body = {"model": model, "messages": messages, "max_tokens": FOLLOW_UP_TOKENS, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = None
    final: dict = {}
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise BenchmarkFailed(f"the follow-up on {model}: HTTP {response.status}: {(await response.text())[:500]}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or []):
                first = time.perf_counter()
            if "timings" in chunk or "usage" in chunk:
                final = chunk
    if first is None:
        raise BenchmarkFailed(f"the follow-up on {model}: the stream ended without a content chunk")
    return first - sent, time.perf_counter() - sent, final


async def running(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(f"{url}/running") as response:
        return await checked_json(response, "/running")


async def histograms(session: aiohttp.ClientSession, url: str, model: str) -> dict[str, float]:
    """The save and restore histograms' `_sum` and `_count` for `model`, from /metrics (0 when absent)."""
    names = [f"swaplab:kvcache_{kind}_seconds_{part}" for kind in ("save", "restore") for part in ("sum", "count")]
    async with session.get(f"{url}/metrics") as response:
        if response.status != 200:
            raise BenchmarkFailed(f"/metrics: HTTP {response.status}")
        text = await response.text()
    found = dict.fromkeys(names, 0.0)
    for match in SAMPLE.finditer(text):
        if match["name"] in found and dict(LABEL.findall(match["labels"])).get("model") == model:
            found[match["name"]] = float(match["value"])
    return found


def growth(after: dict[str, float], before: dict[str, float], kind: str) -> tuple[float, int]:
    """(seconds, slots) a histogram grew by between two scrapes."""
    return (after[f"swaplab:kvcache_{kind}_seconds_sum"] - before[f"swaplab:kvcache_{kind}_seconds_sum"],
            round(after[f"swaplab:kvcache_{kind}_seconds_count"] - before[f"swaplab:kvcache_{kind}_seconds_count"]))


def answer_text(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


async def play(router: Router, result: Round, case: Case, say) -> None:
    """One round's A B A on its router, filling `result`."""
    url, model = router.url, result.model
    first = [{"role": "user", "content": first_message(result.number, case.items)}]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        began = time.perf_counter()
        answer = await chat(session, url, model, first)
        result.first_turn_seconds = time.perf_counter() - began
        result.prompt_tokens = answer["usage"]["prompt_tokens"]
        result.first_cache_n = (answer.get("timings") or {}).get("cache_n")
        say(f"A  first turn: {result.prompt_tokens} prompt tokens, {result.first_turn_seconds:.1f} s "
            f"(start and prefill)")

        before = await histograms(session, url, KEPT)
        began = time.perf_counter()
        await complete(session, url, OTHER)
        result.swap_seconds = time.perf_counter() - began
        after = await histograms(session, url, KEPT)
        result.save_seconds, result.slots_saved = growth(after, before, "save")
        kept = (await running(session, url)).get("kv_cache", {}).get("models", {}).get(KEPT, {})
        result.saved = [{k: slot.get(k) for k in ("slot", "tokens", "bytes")} for slot in kept.get("saved", [])]
        saving = (f", saved {result.slots_saved} slot(s) ({sum(s['tokens'] or 0 for s in result.saved)} tokens) "
                  f"in {result.save_seconds:.3f} s" if model == KEPT else "")
        say(f"B  {OTHER}, swapping {model} out: {result.swap_seconds:.2f} s{saving}")

        follow_up = [*first, {"role": "assistant", "content": answer_text(answer)},
                     {"role": "user", "content": QUESTION}]
        before = after
        result.ttft, result.follow_up_seconds, final = await streamed_chat(session, url, model, follow_up)
        after = await histograms(session, url, KEPT)
        result.restore_seconds, result.slots_restored = growth(after, before, "restore")
        timings, usage = final.get("timings") or {}, final.get("usage") or {}
        result.cache_n, result.prompt_n = timings.get("cache_n"), timings.get("prompt_n")
        result.follow_up_prompt_tokens = usage.get("prompt_tokens")
        entry = next((e for e in (await running(session, url))["running"] if e["model"] == model), {})
        result.restored_tokens = (entry.get("kv_cache") or {}).get("restored_tokens")
        restoring = (f", restored {result.slots_restored} slot(s) ({result.restored_tokens} tokens) "
                     f"in {result.restore_seconds:.3f} s" if model == KEPT else "")
        say(f"A  follow-up: TTFT {result.ttft:.2f} s, cache_n {result.cache_n}, prompt_n {result.prompt_n}{restoring}")


def median_range(values: list[float], digits: int = 2) -> str:
    """`1.23 s (1.10-1.40)`: the median, and the range when there is more than one value."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f} s"
    return f"{statistics.median(values):.{digits}f} s ({min(values):.{digits}f}-{max(values):.{digits}f})"


def counts(values: list[int | None]) -> str:
    """`1004-1006`: the range of a token count over the rounds (`-` when llama.cpp did not say)."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    return f"{min(known)}" if min(known) == max(known) else f"{min(known)}-{max(known)}"


def report(case: Case, rounds: list[Round]) -> dict:
    """Print the case's table; return its summary for the JSON document."""
    by_model = {model: [r for r in rounds if r.model == model] for model in VARIANTS}
    tokens = [r.prompt_tokens for r in rounds]
    print()
    print(f"case {case.name}: {case.what}; first message {min(tokens)}-{max(tokens)} prompt tokens "
          f"(ctx {case.ctx}, parallel {case.parallel}: a slot holds {case.ctx // case.parallel}), "
          f"{len(by_model[KEPT])} round(s) each")
    header = (f"{'':<13} {'follow-up TTFT, median (min-max)':<34} {'cache_n':>9} {'prompt_n':>9}  "
              f"{'swap to B (B request)':<26} {'save':<22} {'restore':<22}")
    print(header)
    for model, items in by_model.items():
        # Saves and restores of a few dozen MB take milliseconds: three digits show them.
        save = median_range([r.save_seconds for r in items], 3) if model == KEPT else "-"
        restore = median_range([r.restore_seconds for r in items], 3) if model == KEPT else "-"
        print(f"{model:<13} {median_range([r.ttft for r in items]):<34} {counts([r.cache_n for r in items]):>9} "
              f"{counts([r.prompt_n for r in items]):>9}  {median_range([r.swap_seconds for r in items]):<26} "
              f"{save:<22} {restore:<22}")
    kept_ttft = statistics.median(r.ttft for r in by_model[KEPT])
    cold_ttft = statistics.median(r.ttft for r in by_model[COLD])
    ratio = cold_ttft / kept_ttft
    added = statistics.median(r.swap_seconds for r in by_model[KEPT]) - \
        statistics.median(r.swap_seconds for r in by_model[COLD])
    saved = by_model[KEPT][-1].saved
    saved_text = ", ".join(f"slot {s['slot']} {s['tokens']} tokens {(s['bytes'] or 0) / 1e6:.1f} MB" for s in saved)
    print(f"TTFT cold / kept: {ratio:.1f}x {'faster' if ratio >= 1 else 'slower'} with kvCache; "
          f"the swap to B took {added:+.2f} s with it (kept - cold, medians); "
          f"saved at the last kept swap: {saved_text or 'nothing'}")
    return {"ttft_ratio_cold_over_kept": ratio, "swap_added_seconds": added,
            "ttft_median": {KEPT: kept_ttft, COLD: cold_ttft}}


async def run_case(case: Case, reps: int, threads: int, workdir: Path, cache_root: Path, began: float,
                   failed_router: list[Router]) -> list[Round]:
    home = workdir / case.name
    home.mkdir()
    config = home / "config.yaml"
    config.write_text(render_config(case, threads))
    rounds = []
    for rep in range(1, reps + 1):
        for model in VARIANTS:  # kept, cold, kept, cold: drift hits both alike
            number = len(rounds) + 1
            result = Round(case.name, number, model)

            def say(text: str, rep=rep, model=model) -> None:
                print(f"[{time.monotonic() - began:6.1f} s] {case.name} round {rep}/{reps} {model}: {text}", flush=True)

            name = f"{rep}-{model}"
            router = Router(config, home / name, cache_root / f"{case.name}-{name}")
            try:
                await router.wait_ready()
                await play(router, result, case, say)
            except (BenchmarkFailed, aiohttp.ClientError, TimeoutError) as error:
                failed_router.append(router)
                raise BenchmarkFailed(f"case {case.name}, round {rep} on {model}: {error or type(error).__name__}") \
                    from None
            finally:
                router.stop()
            rounds.append(result)
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, help="rounds per variant and case (default 3, --quick 1)")
    parser.add_argument("--only", action="append", choices=sorted(CASES), metavar="CASE",
                        help=f"run this case (repeatable), of: {', '.join(CASES)} (default: all, --quick: 1k)")
    parser.add_argument("--quick", action="store_true", help="one round per variant, the 1k case only")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's --threads (default 2)")
    parser.add_argument("--json", help="write every raw number here")
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    if reps < 1:
        parser.error("--reps must be at least 1")
    names = args.only or (["1k"] if args.quick else list(CASES))
    cases = [CASES[name] for name in dict.fromkeys(names)]
    for demo in (SMOLLM2, GEMMA3):
        if not model_path(demo).is_file():
            print(f"{model_path(demo)} is missing: `make models` fetches the built-in models", file=sys.stderr)
            return 1

    workdir = Path(tempfile.mkdtemp(prefix="swaplab-kvcache-bench-"))
    cache_root = workdir / "kvcache"  # the run's SWAPLAB_KVCACHE_DIR, one folder per round under it
    # Stopped with SIGTERM (`kill`, a CI timeout), it must still stop its router: SystemExit
    # unwinds through the finally blocks, the default action would not.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    failed_router: list[Router] = []
    results: dict[str, list[Round]] = {}
    summaries: dict[str, dict] = {}
    began = time.monotonic()
    print(f"{', '.join(c.name for c in cases)}: {reps} round(s) each of {KEPT} and {COLD}, interleaved; "
          f"every round on a fresh router (work dir {workdir})", flush=True)
    try:
        for case in cases:
            results[case.name] = asyncio.run(
                run_case(case, reps, args.threads, workdir, cache_root, began, failed_router))
        print(f"\n{os.cpu_count()} CPUs, llama.cpp --threads {args.threads}; TTFT = the follow-up's first content "
              f"chunk; cache_n / prompt_n = the follow-up's llama.cpp timings; save / restore = "
              f"swaplab:kvcache_save_seconds / _restore_seconds, all slots, median (min-max)")
        for case in cases:
            summaries[case.name] = report(case, results[case.name])
        print(f"\nwall time {time.monotonic() - began:.0f} s")
    except BenchmarkFailed as error:
        print(f"\nFAILED: {error}", file=sys.stderr)
        for router in failed_router:
            print(f"\nlast lines of the router's log:\n{router.log_tail()}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        document = {
            "machine": {"cpus": os.cpu_count()}, "threads": args.threads, "reps": reps, "min_tokens": MIN_TOKENS,
            "cases": {c.name: {**asdict(c), "summary": summaries[c.name],
                               "rounds": [asdict(r) for r in results[c.name]]} for c in cases},
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
