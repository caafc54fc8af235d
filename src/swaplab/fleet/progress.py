"""Where a starting server is, read from its own output: a stage, and a fraction where it says one.

Each engine's rules are data: a table of (pattern, stage, how to read a fraction). The
patterns were written against real startup logs (tests/fixtures/startup/, each with its
origin). `StartupReader` tries every engine's table on every line, so a server behind
docker, a wrapper script or `swaplab sim` replaying an engine is read all the same. Lines
may carry ANSI colours, worker prefixes (`(Worker_TP0 pid=46)`, `[2025-03-27 21:33:31 TP0]`)
and tqdm's carriage-return redraws; a fraction never goes back within its stage.

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

READY = "ready"


@dataclass(frozen=True)
class Stage:
    name: str
    """Plain words a person reads: "loading weights", "capturing CUDA graphs"..."""
    fraction: float | None
    """0..1 within the stage where the engine says how far (a shard x/N, a graph x/N)."""
    engine: str
    """The engine whose rule matched: "llama.cpp", "vLLM", "SGLang"."""


Fraction = Callable[[re.Match[str]], float | None]


def _of(match: re.Match[str]) -> float | None:
    """`x/N` in the pattern's groups `done` and `total`."""
    total = int(match.group("total"))
    return int(match.group("done")) / total if total else None


def _none(match: re.Match[str]) -> float | None:
    return None


def _done(match: re.Match[str]) -> float | None:
    return 1.0


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    stage: str
    fraction: Fraction = _none


def _rules(*rows: tuple[str, str, Fraction]) -> tuple[Rule, ...]:
    return tuple(Rule(re.compile(pattern), stage, fraction) for pattern, stage, fraction in rows)


X_OF_N = r"(?P<done>\d+)/(?P<total>\d+)"

# (engine, its rules, in no particular order: the first that matches a line wins)
ENGINES: tuple[tuple[str, tuple[Rule, ...]], ...] = (
    ("llama.cpp", _rules(
        (r"llama_model_loader: loaded meta data", "reading metadata", _none),
        (r"load_tensors: loading model tensors", "loading weights", _none),
        (r"load_tensors: .* model buffer size", "loading weights", _done),
        (r"llama_context: constructing llama_context", "creating context", _none),
        (r"llama_kv_cache: size =", "allocating KV cache", _none),
        (r"sched_reserve: reserving", "reserving compute buffers", _none),
        (r"warming up the model", "warming up", _none),
        (r"srv +load_model: initializing, n_slots", "starting server", _none),
        (r"server is listening|init: listening on|HTTP server listening", READY, _none),
    )),
    ("vLLM", _rules(
        (rf"Loading safetensors checkpoint shards:\s+\d+% Completed \| {X_OF_N}", "loading weights", _of),
        (r"Loading weights took|Model loading took", "loading weights", _done),
        (r"for vLLM's torch\.compile|Dynamo bytecode transform time|Compiling a graph for", "compiling", _none),
        (r"torch\.compile took .* in total", "compiling", _done),
        (r"Initial profiling/warmup run|Memory profiling takes", "profiling memory", _none),
        (r"Available KV cache memory|# GPU blocks|GPU KV cache size", "allocating KV cache", _none),
        (rf"Capturing CUDA graphs?[^:]*:\s+\d+%\|[^|]*\| {X_OF_N}", "capturing CUDA graphs", _of),
        (r"Graph capturing finished", "capturing CUDA graphs", _done),
    )),
    ("SGLang", _rules(
        (r"Load weight begin", "loading weights", _none),
        (r"Load weight end", "loading weights", _done),
        (r"KV Cache is allocated|Memory pool end", "allocating KV cache", _none),
        (r"Capture cuda graph begin", "capturing CUDA graphs", _none),
        (rf"Capturing batches \([^)]*\):\s+\d+%\|[^|]*\| {X_OF_N}", "capturing CUDA graphs", _of),
        (r"Capture cuda graph end", "capturing CUDA graphs", _done),
        (r"The server is fired up and ready to roll", READY, _none),
    )),
    # vLLM's and SGLang's HTTP front (uvicorn) says the same words for both.
    ("uvicorn", _rules((r"Application startup complete", READY, _none),)),
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def clean(line: str) -> str:
    """The text a rule reads: the last of tqdm's redraws, without colours."""
    return _ANSI.sub("", line.rstrip("\r").rsplit("\r", 1)[-1])


def match(line: str) -> Stage | None:
    """The stage one line of output says, if any rule knows it."""
    text = clean(line)
    for engine, rules in ENGINES:
        for rule in rules:
            found = rule.pattern.search(text)
            if found:
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
        stage = match(line)
        if stage is None:
            return None
        current = self._stage
        if current is not None and stage.name == current.name:
            # Within a stage a fraction only grows; a line without one keeps the last.
            if stage.fraction is None or (current.fraction is not None and stage.fraction <= current.fraction):
                return None
        self._stage = stage
        if stage.name not in self._seen:
            self._seen.append(stage.name)
        return stage

    @property
    def stage(self) -> Stage | None:
        return self._stage

    @property
    def stages_seen(self) -> tuple[str, ...]:
        return tuple(self._seen)
