"""The sim's ways for an engine to give its GPU back without exiting, each as its release does it
(the contracts in `swaplab.engines`, read from vLLM 0.34, SGLang 0.5.23 and TabbyAPI):

- vLLM (`VLLM_SERVER_DEV_MODE=1`): `/sleep?level=&mode=`, `/wake_up?tags=`, `/is_sleeping`,
  `/collective_rpc` (reload_weights) and `/reset_prefix_cache`. A sleep pauses the scheduler:
  `mode=abort` (the default) ends the requests in flight, `wait` lets them finish first, `keep`
  freezes them; requests arriving while asleep wait for the wake, they are not refused. Without
  `--enable-sleep-mode` it answers the same and frees nothing, and says so in its log.
- SGLang: `/release_memory_occupation` and `/resume_memory_occupation` with tags (`kv_cache`,
  `weights`, `cuda_graph`), and `/pause_generation` / `/continue_generation`. A release while
  anything runs (not paused by abort or retract) kills the server, and so does resuming a tag
  that was not released; without `--enable-memory-saver` nothing is freed, and without
  `--enable-weights-cpu-backup` the weights come back as garbage that still generates.
- TabbyAPI: `/v1/model/unload` (ends the requests in flight) and `/v1/model/load`, an event
  stream of the load's progress; with no model loaded a generation gets 503 (500 when it names
  a model).

Each engine's calls are its own module (`sim/vllm.py`, `sim/sglang.py`, `sim/tabby.py`), over the
`Sleeper` here. The delays (`--sleep-seconds`, `--wake-seconds`) and faults (`--sleep-fault`, `--wake-fault`,
`/sim/faults`) apply to each engine's sleep and wake calls alike. What the engine prints about
what it freed uses the contract's own format strings, with `--memory-gib` as what the model holds.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from aiohttp import web

from swaplab.engines import Contract
from swaplab.errors import SwaplabError
from swaplab.sim import chunks
from swaplab.sim.request import BadRequest, json_body

Engine = Literal["generic", "vllm", "sglang", "llamacpp", "tabby"]
Fault = Literal["none", "error", "hang", "crash"]
Operation = Literal["sleep", "wake"]
ENGINES: tuple[Engine, ...] = get_args(Engine)
SLEEPING_ENGINES = ("vllm", "sglang", "tabby")
FAULTS: tuple[Fault, ...] = get_args(Fault)

# What a sleep puts away, in vLLM's words (SGLang's release tags share the first two).
WEIGHTS, KV_CACHE, SCHEDULING = "weights", "kv_cache", "scheduling"
GARBAGE = "\u2047"  # what weights that were never restored generate


class SleepSettings(Protocol):
    """The part of the sim's settings this module reads (`SimSettings` has them)."""

    engine: Engine
    model: str
    sleep_seconds: float
    wake_seconds: float
    sleep_fault: Fault
    wake_fault: Fault
    memory_gib: float
    switches: frozenset[str]


class Workload(Protocol):
    """The generation requests in flight (the sim owns their count)."""

    def busy(self) -> bool: ...

    async def until_idle(self) -> None: ...

    def abort_all(self) -> None:
        """End every generation in flight at its next token (finish_reason "abort")."""


def check_settings(settings: SleepSettings) -> None:
    """Refuse an engine or fault the sim does not know, and sleep options without a sleep API."""
    if settings.engine not in ENGINES:
        raise SwaplabError(f"sim: --engine must be one of {', '.join(ENGINES)}, not {settings.engine!r}")
    for operation in ("sleep", "wake"):
        fault = getattr(settings, f"{operation}_fault")
        if fault not in FAULTS:
            raise SwaplabError(f"sim: --{operation}-fault must be one of {', '.join(FAULTS)}, not {fault!r}")
    if settings.engine not in SLEEPING_ENGINES:
        given = [
            f"--{name.replace('_', '-')}"
            for name, unset in (("sleep_seconds", 0), ("wake_seconds", 0), ("sleep_fault", "none"), ("wake_fault", "none"))
            if getattr(settings, name) != unset
        ]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise SwaplabError(
                f"sim: {', '.join(given)} {verb} --engine vllm, sglang or tabby: the {settings.engine} engine has no sleep API"
            )


def fault_changes(body: Any) -> dict[Operation, Fault]:
    """A `/sim/faults` body: `{"sleep": FAULT, "wake": FAULT}`, either key optional."""
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object like {"sleep": "error", "wake": "hang"}')
    unknown = sorted(set(body) - {"sleep", "wake"})
    if unknown:
        raise BadRequest(f"unknown keys {unknown}: the faults are 'sleep' and 'wake'")
    for operation, fault in body.items():
        if fault not in FAULTS:
            raise BadRequest(f"{operation} fault must be one of {', '.join(FAULTS)}, not {fault!r}")
    return body


@dataclass
class SleepCounts:
    """What `/sim/stats` adds for an engine with a sleep API."""

    sleeps: int = 0  # sleep calls completed
    wakes: int = 0  # wake calls completed
    sleeps_while_busy: int = 0  # sleeps that found generation in flight


@dataclass
class Sleeper:
    """One engine's way to sleep: owns what is asleep, the GPU memory held, counts and faults."""

    settings: SleepSettings
    workload: Workload
    facts: Contract
    counts: SleepCounts = field(default_factory=SleepCounts)
    asleep: set[str] = field(default_factory=set)
    level: int | None = None
    gpu_gib: float = 0.0
    weights_garbage: bool = False
    faults: dict[Operation, Fault] = field(init=False)
    # Set while the scheduler runs: vLLM's sleep and SGLang's pause clear it, and new generation waits.
    running: asyncio.Event = field(default_factory=asyncio.Event)
    # Set while requests in flight make progress: vLLM's `mode=keep` and SGLang's retract/in_place pause freeze them.
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    pause_mode: str | None = None  # SGLang's /pause_generation mode while paused
    loaded: bool = True  # TabbyAPI: a model is loaded
    # Sleep, wake and reload are one at a time, in arrival order, as an engine's core runs them.
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    _running_calls: set[asyncio.Task[Any]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.faults = {"sleep": self.settings.sleep_fault, "wake": self.settings.wake_fault}
        self.gpu_gib = self.settings.memory_gib
        self.running.set()
        self.flowing.set()

    @property
    def engine(self) -> str:
        return self.facts.engine

    def routes(self) -> list[web.RouteDef]:
        """The engine's sleep endpoints and `/sim/faults`."""
        return [
            *self.engine_routes(),
            web.get("/sim/faults", self._get_faults),
            web.post("/sim/faults", self._set_faults),
        ]

    def engine_routes(self) -> list[web.RouteDef]:
        """The engine's own sleep and wake endpoints (each engine's module)."""
        raise NotImplementedError

    async def admit(self, body: Any) -> web.Response | None:
        """Before a generation starts: wait while the engine's scheduler is paused (vLLM asleep, SGLang
        paused), or the engine's refusal; None to go on."""
        while not self.running.is_set():  # set, then cleared again before this request resumed: wait on
            await self.running.wait()
        return None

    def garbage(self) -> bool:
        """Whether the weights on the GPU are not the model's (what it generates is garbage)."""
        return self.weights_garbage

    def stats(self) -> dict[str, Any]:
        """The sleep fields of `/sim/stats`."""
        return {
            "sleeps": self.counts.sleeps,
            "wakes": self.counts.wakes,
            "asleep": self.is_asleep(),
            "sleep_level": self.level,
            "sleeps_while_busy": self.counts.sleeps_while_busy,
            "gpu_gib": round(self.gpu_gib, 3),
        }

    def is_asleep(self) -> bool:
        return bool(self.asleep)

    def frees(self) -> bool:
        """Whether a sleep really gives memory back, as the engine was started."""
        if self.facts.sleep is None:
            return True
        return all(flag in self.settings.switches for flag in self.facts.sleep.requires.flags)

    # -- faults ------------------------------------------------------------

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults)

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            self.faults.update(fault_changes(await json_body(request)))
        except BadRequest as bad:
            return error(400, str(bad))
        return web.json_response(self.faults)

    # -- the operations ----------------------------------------------------

    async def fault(self, operation: Operation) -> web.Response | None:
        """The fault in force for `operation`: its answer (or no answer at all), else None."""
        fault = self.faults[operation]
        if fault != "none":
            log(f"{operation} call: injecting fault {fault!r}")
        if fault == "error":
            return error(500, f"simulated {operation} failure (fault 'error')")
        if fault == "hang":
            # Never answered: the wait ends only when the client leaves and aiohttp cancels the handler.
            await asyncio.get_running_loop().create_future()
        if fault == "crash":
            os._exit(1)  # a dead engine: no answer, no cleanup
        return None

    async def call(self, operation: Operation, perform: Callable[[], Awaitable[Any]]) -> web.Response:
        """Answer a sleep or wake call: its fault if one is in force, else `perform` to its end."""
        fault = await self.fault(operation)
        if fault is not None:
            return fault
        answer = await self.shielded(operation, perform())
        return answer if isinstance(answer, web.Response) else web.json_response(answer)

    async def shielded(self, operation: Operation, work: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(work)
        self._running_calls.add(task)
        task.add_done_callback(self._running_calls.discard)
        try:
            return await asyncio.shield(task)  # an engine finishes what it started, whether or not the caller waits
        except asyncio.CancelledError:
            log(f"{operation} call: the client left; the {operation} goes on")
            raise

    def report(self, words: str, *values: Any) -> None:
        """Print the engine's own report line (the one of its contract's sleep reports whose format
        holds `words`), filled with `values`, as the engine prints it."""
        assert self.facts.sleep is not None
        report = next(report for report in self.facts.sleep.reports if words in report.format)
        try:
            line = report.format % values if values else report.format
        except (TypeError, ValueError):
            line = report.format
        print(line, flush=True)


def error(status: int, message: str) -> web.Response:
    return web.json_response(chunks.error_body(status, message), status=status)


def log(line: str) -> None:
    # Rare events, on stderr, where a router's /logs shows them beside its own decisions.
    print(f"sim: {line}", file=sys.stderr, flush=True)


def die(line: str) -> None:
    """The engine's process tree killed by its own failure (SGLang's SIGQUIT to its parent)."""
    print(line, file=sys.stderr, flush=True)
    os._exit(1)
