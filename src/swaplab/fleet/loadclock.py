"""How long loads take here, and how far along one is: the ETA of a start or a wake.

Each start and wake of a model is timed stage by stage: the engine's own stages, read from
its output by `progress.StartupReader`, and swaplab's (`restoring context`, a wake). A
finished load becomes a `LoadRecord`: the router keeps them in the results store and hands
them back at start, so this machine's history survives restarts. A `LoadWatch` follows one
load as it happens. It knows the recent median of each stage for the same model and
command (another command is another history: a new context or a new engine version loads
differently), with their spread, and gives the stage, its fraction, the time left and
whether the load looks stuck. A load is called stuck when it is far past its usual
duration and has said nothing for far longer than the stage it is in usually takes; a first
load, with no usual duration, when it has said nothing for FIRST_LOAD_STUCK_SILENCE_SECONDS.
Nothing kills it: `healthCheckTimeout` decides that. The view is a function of the clock: the
fleet asks for it again each second while a load is under way, not only at the engine's lines.

Pure: clocks are passed in, nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from swaplab.fleet.progress import Stage, StartupReader
from swaplab.results.loads import KEEP_PER_HISTORY, LoadRecord

KEEP_LOADS = KEEP_PER_HISTORY
"""Loads kept per model, kind and command; the ETA is the median of these."""
STUCK_FACTOR = 2.0
STUCK_MIN_SILENCE_SECONDS = 10.0
"""A load is probably stuck past STUCK_FACTOR x its usual duration with no output for STUCK_FACTOR x
its current stage's usual duration (the longest stage's, in a stage its history never saw), and at
least this long: a stage's lines may come seconds apart however short it usually is."""
FIRST_LOAD_STUCK_SILENCE_SECONDS = 120.0
"""A first load has no usual duration: it is probably stuck with no output for this long, the whole
start llama-swap's default `healthCheckTimeout` allows (a first load needing longer sets it higher)."""
STARTING = "starting"
"""The stage before the engine has said anything this reader knows."""


def command_identity(argv: Sequence[str]) -> str:
    """A short digest of a command: its loads are one history."""
    return hashlib.sha256(json.dumps(list(argv)).encode()).hexdigest()[:16]


class LoadHistory:
    """The recent loads of each model, kind and command, oldest first."""

    def __init__(self, records: Iterable[LoadRecord] = ()):
        self._loads: dict[tuple[str, str, str], list[LoadRecord]] = defaultdict(list)
        for record in sorted(records, key=lambda r: r.finished_at):
            self.add(record)

    def add(self, record: LoadRecord) -> None:
        loads = self._loads[(record.model, record.kind, record.identity)]
        loads.append(record)
        del loads[:-KEEP_LOADS]

    def recent(self, model: str, kind: str, identity: str) -> list[LoadRecord]:
        return list(self._loads.get((model, kind, identity), ()))


@dataclass(frozen=True)
class Expectation:
    """What the recent loads say a load of this model takes."""

    loads: int
    usual_seconds: float
    fastest_seconds: float
    slowest_seconds: float
    stage_seconds: dict[str, float]
    """Median duration of each stage, over the loads that had it."""
    stage_order: tuple[str, ...]
    """The stages in the order the latest load went through them."""


def expect(loads: Sequence[LoadRecord]) -> Expectation | None:
    if not loads:
        return None
    totals = [load.seconds for load in loads]
    per_stage: dict[str, list[float]] = defaultdict(list)
    for load in loads:
        for name, seconds in load.stages:
            per_stage[name].append(seconds)
    return Expectation(
        loads=len(loads),
        usual_seconds=statistics.median(totals),
        fastest_seconds=min(totals),
        slowest_seconds=max(totals),
        stage_seconds={name: statistics.median(values) for name, values in per_stage.items()},
        stage_order=tuple(name for name, _ in loads[-1].stages),
    )


@dataclass
class LoadWatch:
    """One load as it happens: its stages from the engine's output, and the ETA."""

    kind: str
    began: float
    """Monotonic seconds."""
    expectation: Expectation | None
    reader: StartupReader = field(default_factory=StartupReader)
    stage: str = STARTING
    fraction: float | None = None
    engine: str = ""
    stage_began: float = 0.0
    last_output: float = 0.0
    stages: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stage_began = self.last_output = self.began

    def line(self, text: str, now: float) -> bool:
        """A line of the server's output; True when it moved the stage or its fraction."""
        self.last_output = now
        stage = self.reader.feed(text)
        if stage is None or stage.name == "ready":
            return False
        return self._show(stage, now)

    def enter(self, name: str, now: float) -> bool:
        """A stage of swaplab's own (`restoring context`, `waking`)."""
        return self._show(Stage(name, None, "swaplab"), now)

    def _show(self, stage: Stage, now: float) -> bool:
        if stage.name != self.stage:
            if self.stage != STARTING or now - self.stage_began > 0.001:  # a wake enters its stage at once
                self.stages.append((self.stage, now - self.stage_began))
            self.stage, self.stage_began = stage.name, now
            self.fraction, self.engine = stage.fraction, stage.engine
            return True
        if stage.fraction != self.fraction:
            self.fraction = stage.fraction
            return True
        return False

    def record(self, model: str, identity: str, now: float, unix_now: float) -> LoadRecord:
        """The finished load (ready at `now`)."""
        stages = [*self.stages, (self.stage, now - self.stage_began)]
        # The time before the engine's first recognised line belongs to no stage anyone chose.
        return LoadRecord(model, self.kind, identity, now - self.began,
                          tuple((name, round(seconds, 3)) for name, seconds in stages), unix_now)

    def view(self, now: float) -> dict:
        """The JSON `progress` object /running, modelStatus and sendLoadingState show."""
        elapsed, silent = now - self.began, now - self.last_output
        view: dict = {
            "kind": self.kind, "stage": self.stage, "fraction": _rounded(self.fraction), "engine": self.engine,
            "elapsed_seconds": round(elapsed, 1), "silent_seconds": round(silent, 1),
            "eta_seconds": None, "percent": None, "usual_seconds": None, "spread_seconds": None, "history": 0,
            "stuck": silent > FIRST_LOAD_STUCK_SILENCE_SECONDS,
        }
        expected = self.expectation
        if expected is None:
            return view
        done, remaining = self._expected_split(now, expected)
        total = done + remaining
        stage_usual = expected.stage_seconds.get(self.stage, max(expected.stage_seconds.values(), default=0.0))
        silence = max(STUCK_MIN_SILENCE_SECONDS, STUCK_FACTOR * stage_usual)
        view.update(
            eta_seconds=round(remaining, 1),
            percent=round(100 * done / total) if total else None,
            usual_seconds=round(expected.usual_seconds, 1),
            spread_seconds=[round(expected.fastest_seconds, 1), round(expected.slowest_seconds, 1)],
            history=expected.loads,
            stuck=elapsed > STUCK_FACTOR * expected.usual_seconds and silent > silence,
        )
        return view

    def _expected_split(self, now: float, expected: Expectation) -> tuple[float, float]:
        """Seconds of the usual load behind and ahead, by stage where the stages are known."""
        order = expected.stage_order
        if self.stage not in expected.stage_seconds or self.stage not in order:
            elapsed = now - self.began
            return min(elapsed, expected.usual_seconds), max(0.0, expected.usual_seconds - elapsed)
        index = order.index(self.stage)
        before = sum(expected.stage_seconds.get(name, 0.0) for name in order[:index])
        after = sum(expected.stage_seconds.get(name, 0.0) for name in order[index + 1:])
        usual = expected.stage_seconds[self.stage]
        if self.fraction is not None:
            spent = usual * self.fraction
        else:
            spent = min(now - self.stage_began, usual)
        return before + spent, (usual - spent) + after


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class LoadClock:
    """The fleet's side: a watch per load with its model's expectation, and the record of each
    finished one (kept here, and given to `on_record` for the store)."""

    def __init__(self, history: LoadHistory | None = None, on_record: Callable[[LoadRecord], None] | None = None):
        self.history = history or LoadHistory()
        self.on_record = on_record

    def begin(self, model: str, kind: str, identity: str, now: float) -> LoadWatch:
        return LoadWatch(kind, now, expect(self.history.recent(model, kind, identity)))

    def finish(self, model: str, identity: str, watch: LoadWatch, now: float, unix_now: float) -> LoadRecord:
        record = watch.record(model, identity, now, unix_now)
        self.history.add(record)
        if self.on_record is not None:
            self.on_record(record)
        return record
