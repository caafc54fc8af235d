"""Where a starting server is, read from its own output: a stage, and a fraction where it says one.

A cold start of vLLM or SGLang takes minutes (weights, torch.compile, CUDA graphs), a TabbyAPI
one tens of seconds, and a llama.cpp one seconds to minutes; swaplab shows how far along it is
from the engine's own startup lines. Each engine's rules are data: a table of (pattern, stage,
how to read a fraction). The patterns were written against real startup logs
(tests/fixtures/startup/, each with its origin) and hold every startup line of each engine's
contract (`swaplab.engines`, `startup.lines`, read from its release) to the stage it names.
`StartupReader` tries every engine's table on every line, so a server behind docker, a wrapper
script or `swaplab sim` replaying an engine is read all the same. Lines may carry ANSI colours,
worker prefixes (`(Worker_TP0 pid=46)`, `[2025-03-27 21:33:31 TP0]`) and tqdm's carriage-return
redraws; a fraction never goes back within its stage.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

READY = "ready"


@dataclass(frozen=True)
class Stage:
    """One step of a server's start, as its engine said it."""

    name: str
    """Plain words a person reads: "loading weights", "capturing CUDA graphs"..."""
    fraction: float | None
    """0..1 within the stage where the engine says how far (a shard x/N, a graph x/N, a %)."""
    engine: str
    """The engine whose rule matched: "llama.cpp", "vLLM", "SGLang", "TabbyAPI" (its contract's name)."""


Fraction = Callable[[re.Match[str]], float | None]


def _count(found: re.Match[str]) -> float | None:
    """A tqdm bar's `x/N`, or its percentage where the line lost the count."""
    total = found.group("total")
    if total is not None and int(total) > 0:
        return int(found.group("done")) / int(total)
    return int(found.group("pct")) / 100


def _none(found: re.Match[str]) -> float | None:
    return None


def _done(found: re.Match[str]) -> float | None:
    """A line that closes its stage ("Loading weights took 24.84 seconds")."""
    return 1.0


@dataclass(frozen=True)
class Rule:
    """A line pattern, the stage it means, and how to read a fraction from the match."""

    pattern: re.Pattern[str]
    stage: str
    fraction: Fraction = _none
    within: str | None = None
    """Only while already in this stage: for lines that say nothing alone (a bare tqdm bar)."""
    shared: bool = False
    """Words another engine's table reads by default: this one claims them only once its engine
    was recognised (`prefer`)."""


def _rules(*rows: tuple | Rule) -> tuple[Rule, ...]:
    return tuple(row if isinstance(row, Rule) else Rule(re.compile(row[0]), *row[1:]) for row in rows)


# tqdm as these engines print it: "45%|████▍     | 30/67 [00:01<..]" or the shard loaders'
# "50% Completed | 2/4 [..]". Bar cells hold no letters, so a pasted log whose redraws lost
# their \r ("69%|███Capturing ... 71%|███") still splits into one match per redraw.
BAR = r"(?P<pct>\d{1,3})%(?:\|[^|A-Za-z]*\|?\s*|\s*(?:Completed\s*)?\|\s*)(?:(?P<done>\d+)/(?P<total>\d+))?"
# The shard loaders' bars by their desc. vLLM and SGLang have both: vLLM draws the checkpoint one
# by default, SGLang (0.5.23) the multi-thread one.
CHECKPOINT_SHARDS = rf"Loading (?:safetensors|pt|np_cache) checkpoint shards(?: \(eager\))?:\s*{BAR}"
THREADED_SHARDS = rf"Multi-thread loading shards:\s*{BAR}"
# TabbyAPI's console prefix, "2026-08-13 20:55:45.123 INFO:     ". No other engine begins a line
# with a millisecond timestamp and a level, so its rules read only lines that carry it, uvicorn's
# words included (which mean something else in vLLM and SGLang), and its table can go first.
TABBY = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [A-Z]+: +"
# rich's bar, printed once on a non-terminal stdout: "Loading model modules ━━━━━━ 100% 66/66 0:00:00".
TABBY_MODULES = (r"Loading (?:vision|draft|model) modules\s[^%\d]*"
                 r"(?P<pct>\d{1,3})%\s*(?:(?P<done>\d+)/(?P<total>\d+))?")

# (engine as its contract names it, its rules; within one table the first rule that matches a line wins)
ENGINES: tuple[tuple[str, tuple[Rule, ...]], ...] = (
    ("TabbyAPI", _rules(
        (rf"{TABBY}(?:[\w.-]+ version: |Using default max_seq_len|Using template .* for chat completions)",
         "reading metadata"),
        (rf"{TABBY}Loading (?:model: |with )", "loading weights"),
        (TABBY_MODULES, "loading weights", _count),
        (rf"{TABBY}Model successfully loaded", "loading weights", _done),
        # The keys, the routes ("Chat completions: http://..."), then uvicorn: its app is up before
        # the port is bound, and TabbyAPI serves only from "Uvicorn running on".
        ((rf"{TABBY}(?:Your (?:API|admin) key is|Disabling authentication|Starting \w+ API|[A-Z][\w ]*: https?://"
          r"|Started server process|Waiting for application startup|Application startup complete)"),
         "starting server"),
        (rf"{TABBY}Uvicorn running on", READY),
    )),
    ("vLLM", _rules(
        ((r"vLLM server version \S+, serving model|non-default args:|Resolved architecture:|Using max model len"
          r"|Initializing a(?:n| V1) LLM engine"), "reading metadata"),
        (CHECKPOINT_SHARDS, "loading weights", _count),
        # SGLang's default bar, drawn by vLLM's multi-thread loader too (weight_utils.py:1287).
        Rule(re.compile(THREADED_SHARDS), "loading weights", _count, shared=True),
        (r"Loading model from scratch|Starting to load model", "loading weights"),
        (r"Loading (?:model )?weights took|Model loading took", "loading weights", _done),
        ((r"Starting torch\.compile|for vLLM's torch\.compile|Dynamo bytecode transform time|Compiling a graph for"
          r"|Directly load (?:the compiled graph|AOT compilation)"), "compiling"),
        (r"torch\.compile (?:takes|took) .* in total", "compiling", _done),
        # "Available KV cache memory" is the profile's result: 0.34's extensible KV cache is allocated
        # after the CUDA graphs ("Memory after warmup", "Extended KV cache"), so it is no allocation yet.
        (r"Memory profiling (?:takes|results)|Initial profiling/warmup run|Available KV cache memory",
         "profiling memory"),
        (r"Compile and warming up model for size", "warming up"),
        (r"# (?:GPU|cuda) blocks:|KV cache size: [\d,]+ tokens|Memory after warmup:|Extended KV cache to",
         "allocating KV cache"),
        (rf"Capturing (?:\w+ )?CUDA graph(?: shapes|s)?[^:%]*:\s*{BAR}", "capturing CUDA graphs", _count),
        (r"Capturing the model for CUDA graphs|Capturing cudagraphs for decoding", "capturing CUDA graphs"),
        (r"Graph capturing finished", "capturing CUDA graphs", _done),
        # The engine is whole ("init engine ... took"): what follows is the API server's start.
        ((r"init engine \(profile, create kv cache, warmup model\) took|Supported tasks:|Starting vLLM (?:API )?server"
          r"|Available routes are|Started server process|Waiting for application startup"), "starting server"),
        # uvicorn's words: vLLM serves once its app is up. vLLM hands uvicorn a bound socket, so no
        # "Uvicorn running on" comes (older ones printed it after this line).
        (r"Application startup complete", READY),
    )),
    ("SGLang", _rules(
        (r"Memory baseline taken", "profiling memory"),
        (r"Load weight begin|Beginning to load weights", "loading weights"),
        (CHECKPOINT_SHARDS, "loading weights", _count),
        (THREADED_SHARDS, "loading weights", _count),
        (r"Load weight end|Loading weights took", "loading weights", _done),
        (r"KV Cache (?:is allocated|VA upper bound)|Memory pool end", "allocating KV cache"),
        # "Capture cuda graph begin" until 2025; 0.5.23 names each graph: "Capture target prefill CUDA graph begin".
        (r"\bCapture [\w -]*graph begin", "capturing CUDA graphs"),
        (rf"Capturing (?:batches|prefill shape)[^:%]*:\s*{BAR}", "capturing CUDA graphs", _count),
        # Older SGLang drew its capture bar with no label at all: "  0%|     | 0/13 [..]".
        (rf"^\s*{BAR}", "capturing CUDA graphs", _count, "capturing CUDA graphs"),
        (r"\bCapture [\w -]*graph end", "capturing CUDA graphs", _done),
        # The scheduler's summary comes once its model runner is whole: the HTTP server starts next.
        (r"max_total_num_tokens=\d+, chunked_prefill_size=|Started server process|Waiting for application startup",
         "starting server"),
        # SGLang's app is up before it is ready: it then sends itself a warm-up request, and logs it.
        ((r"Application startup complete|Uvicorn running on"
          r'|"(?:GET /(?:get_)?model_info|POST /(?:generate|encode|freeze_gc)) HTTP|Prefill batch.*#new-seq'),
         "warming up"),
        (r"The server is fired up and ready to roll", READY),
    )),
    ("llama.cpp", _rules(
        # A server that said "loading model" reads the metadata within that load (shown from -lv 4).
        (r"llama_model_loader: loaded meta data", "loading weights", _none, "loading weights"),
        (r"llama_model_loader: loaded meta data", "reading metadata"),
        # At the default verbosity (3) "loading model" is all a load says until its context is whole.
        (r"(?:srv +\w+|main): loading model\b|\b(?:llm_)?load_tensors:", "loading weights"),
        # The default progress callback prints a dot now and then and ends the line at 100%.
        (r"^\s*\.{8,}\s*$", "loading weights", _done),
        (r"llama_context: constructing llama_context|llama_init_from_model:|llama_new_context_with_model:",
         "creating context"),
        (r"\bllama_kv_cache(?:_init|_unified)?:", "allocating KV cache"),
        (r"\bsched_reserve: reserving", "reserving compute buffers"),
        # "threadpool init" once the context is whole, right before the warm-up decode (unless --no-warmup).
        (r"llama threadpool init|warming up the model", "warming up"),
        # Some versions bind the port before loading anything: listening is not ready there.
        (r"srv +load_model: initializing(?: slots|, n_slots)|HTTP server (?:is )?listening", "starting server"),
        # After the load: "srv  llama_server: model loaded" in llama-server, "srv          init: ..." in xllamacpp.
        (r"srv +\w+: (?:model loaded|listening on)|server is listening on|main: model loaded|all slots are idle",
         READY),
    )),
)
ENGINE_NAMES = tuple(engine for engine, _ in ENGINES)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def clean(line: str) -> str:
    """The text a rule reads: the last of tqdm's redraws, without colours or line ends."""
    redraws = [_ANSI.sub("", part) for part in line.rstrip("\r\n").split("\r")]
    return next((part for part in reversed(redraws) if part.strip()), "")


def match(line: str, prefer: str | None = None, current: str | None = None) -> Stage | None:
    """The stage one line of output says, if any rule knows it.

    `prefer`: the engine already recognised, whose table is tried first (vLLM and SGLang share
    the shard loader's and uvicorn's words). `current`: the stage the server is in, for rules
    that only mean something within it.
    """
    text = clean(line)
    tables = sorted(ENGINES, key=lambda entry: entry[0] != prefer)
    for engine, rules in tables:
        for rule in rules:
            if (rule.within is not None and rule.within != current) or (rule.shared and engine != prefer):
                continue
            # The last match: a pasted log can hold several redraws on one line.
            found = None
            for found in rule.pattern.finditer(text):
                pass
            if found is not None:
                fraction = rule.fraction(found)
                if fraction is not None:
                    fraction = min(1.0, max(0.0, fraction))
                return Stage(rule.stage, fraction, engine)
    return None


class StartupReader:
    """Feed a starting server's output lines; it tells the current stage."""

    def __init__(self) -> None:
        self._stage: Stage | None = None
        self._seen: list[str] = []

    def feed(self, line: str) -> Stage | None:
        """The new stage when this line moves the stage or its fraction, else None."""
        current = self._stage
        if current is not None and current.name == READY:
            return None  # ready is the end: later lines are the server at work
        stage = match(line, current.engine if current else None, current.name if current else None)
        if stage is None:
            return None
        if current is not None and stage.name == current.name:
            # Within a stage a fraction only grows; a line without one keeps the last.
            if stage.fraction is None or (current.fraction is not None and stage.fraction <= current.fraction):
                return None
        elif stage.name in self._seen and (stage.fraction is None or stage.fraction >= 1.0):
            # Back to an earlier stage only when it counts anew (another worker's shard bar from
            # 0/N); one rank's late "Load weight end" after another's KV cache is no move.
            return None
        self._stage = stage
        if stage.name not in self._seen:
            self._seen.append(stage.name)
        return stage

    @property
    def stage(self) -> Stage | None:
        """The latest stage, or None before the engine said anything these rules know."""
        return self._stage

    @property
    def stages_seen(self) -> tuple[str, ...]:
        """Stage names in the order first seen."""
        return tuple(self._seen)
