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

The delays (`--sleep-seconds`, `--wake-seconds`) and faults (`--sleep-fault`, `--wake-fault`,
`/sim/faults`) apply to each engine's sleep and wake calls alike. What the engine prints about
what it freed uses the contract's own format strings, with `--memory-gib` as what the model holds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
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

# vLLM's tags (what /wake_up restores) and SGLang's (what a release frees).
WEIGHTS, KV_CACHE, SCHEDULING, CUDA_GRAPH = "weights", "kv_cache", "scheduling", "cuda_graph"
VLLM_TAGS = (WEIGHTS, KV_CACHE, SCHEDULING)
SGLANG_TAGS = (KV_CACHE, WEIGHTS, CUDA_GRAPH)
VLLM_MODES = ("abort", "wait", "keep")
SGLANG_PAUSE_MODES = ("abort", "retract", "in_place")
NOT_LOADED = {"detail": "No models are currently loaded."}  # TabbyAPI's, common/model.py:307
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


def vllm_sleep_query(level: str | None, mode: str | None) -> tuple[int, str]:
    """vLLM's `?level=` (0, 1 or 2; 1 by default) and `?mode=` (abort by default)."""
    level = "1" if level is None else level
    if level not in ("0", "1", "2"):
        raise BadRequest(f"level must be 0, 1 or 2, not {level!r}")
    mode = mode or "abort"
    if mode not in VLLM_MODES:
        raise BadRequest(f"mode must be one of {', '.join(VLLM_MODES)}, not {mode!r}")
    return int(level), mode


def vllm_wake_tags(values: list[str]) -> frozenset[str]:
    """vLLM's repeated `?tags=`: none means everything asleep."""
    unknown = [value for value in values if value not in VLLM_TAGS]
    if unknown:
        raise BadRequest(f"unknown tags {unknown}: vLLM's are {', '.join(VLLM_TAGS)}")
    return frozenset(values or VLLM_TAGS)


def sglang_tags(body: Any) -> frozenset[str]:
    """SGLang's `{"tags": [...]}`: null, [] or no key means all three."""
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object, {} or {"tags": [...]}')
    tags = body.get("tags")
    if tags is None or tags == []:
        return frozenset(SGLANG_TAGS)
    if not isinstance(tags, list) or any(tag not in SGLANG_TAGS for tag in tags):
        raise BadRequest(f"'tags' must be a list of {', '.join(SGLANG_TAGS)}")
    return frozenset(tags)


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
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock)
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
        engine_routes = {
            "vllm": [
                web.post("/sleep", self._vllm_sleep),
                web.post("/wake_up", self._vllm_wake_up),
                web.get("/is_sleeping", self._vllm_is_sleeping),
                web.post("/collective_rpc", self._vllm_collective_rpc),
                web.post("/reset_prefix_cache", self._vllm_reset_prefix_cache),
            ],
            "sglang": [
                web.route("*", "/release_memory_occupation", self._sglang_release),
                web.route("*", "/resume_memory_occupation", self._sglang_resume),
                web.post("/pause_generation", self._sglang_pause),
                web.post("/continue_generation", self._sglang_continue),
            ],
            "tabby": [
                web.post("/v1/model/unload", self._tabby_unload),
                web.post("/v1/model/load", self._tabby_load),
            ],
        }
        return [
            *engine_routes[self.engine],
            web.get("/sim/faults", self._get_faults),
            web.post("/sim/faults", self._set_faults),
        ]

    async def admit(self, body: Any) -> web.Response | None:
        """Before a generation starts: wait while the engine's scheduler is paused (vLLM asleep, SGLang
        paused), or the engine's refusal (TabbyAPI with no model loaded); None to go on."""
        if self.engine == "tabby" and not self.loaded:
            if isinstance(body, dict) and body.get("model"):
                return web.Response(status=500, text="Internal Server Error")  # endpoints/OAI/router.py:76
            return web.json_response(NOT_LOADED, status=503)
        while not self.running.is_set():  # set, then cleared again before this request resumed: wait on
            await self.running.wait()
        return None

    def garbage(self) -> bool:
        """Whether the weights on the GPU are not the model's (what it generates is garbage)."""
        return self.weights_garbage or (self.engine == "sglang" and WEIGHTS in self.asleep and self._frees())

    def stats(self) -> dict[str, Any]:
        """The sleep fields of `/sim/stats`."""
        return {
            "sleeps": self.counts.sleeps,
            "wakes": self.counts.wakes,
            "asleep": bool(self.asleep) if self.engine != "tabby" else not self.loaded,
            "sleep_level": self.level,
            "sleeps_while_busy": self.counts.sleeps_while_busy,
            "gpu_gib": round(self.gpu_gib, 3),
        }

    def _frees(self) -> bool:
        """Whether a sleep really gives memory back, as the engine was started."""
        if self.facts.sleep is None:
            return True
        return all(flag in self.settings.switches for flag in self.facts.sleep.requires.flags)

    # -- vLLM --------------------------------------------------------------

    async def _vllm_sleep(self, request: web.Request) -> web.Response:
        try:
            level, mode = vllm_sleep_query(request.query.get("level"), request.query.get("mode"))
        except BadRequest as bad:
            return _error(400, str(bad))

        async def perform() -> dict[str, Any]:
            async with self._turn:
                if self.asleep:
                    _log("WARNING Executor is already sleeping.")
                    return {"status": "sleeping", "level": self.level}
                began = time.monotonic()
                self.running.clear()  # no new generation from here on
                if self.workload.busy():
                    self.counts.sleeps_while_busy += 1
                    if mode == "abort":
                        self.workload.abort_all()
                        await self.workload.until_idle()
                    elif mode == "wait":
                        _log("Waiting for in-flight requests to complete before sleeping...")
                        await self.workload.until_idle()
                    else:  # keep: frozen where they are until the wake
                        self.flowing.clear()
                self.asleep = {SCHEDULING} | ({WEIGHTS, KV_CACHE} if level >= 1 else set())
                self.level = level
                await asyncio.sleep(self.settings.sleep_seconds)
                if level >= 1:
                    freed = self.gpu_gib if self._frees() else 0.0
                    self.gpu_gib -= freed
                    self.weights_garbage = self.weights_garbage or (level == 2 and self._frees())
                    self._report("Sleep mode freed", round(freed, 2), round(self.gpu_gib, 2))
                self._report("to fall asleep", time.monotonic() - began)
                self.counts.sleeps += 1
                return {"status": "sleeping", "level": level}

        return await self._call("sleep", perform)

    async def _vllm_wake_up(self, request: web.Request) -> web.Response:
        try:
            tags = vllm_wake_tags(request.query.getall("tags", []))
        except BadRequest as bad:
            return _error(400, str(bad))
        named = request.query.getall("tags", [])
        self._report("wake up the engine", named or None)

        async def perform() -> dict[str, Any]:
            async with self._turn:
                if not self.asleep:
                    _log("WARNING Executor is not sleeping.")
                    return {"status": "awake", "tags": None}
                waking = tags & self.asleep
                for tag in sorted(tags - self.asleep):
                    _log(f"WARNING Tag {tag} is not in sleeping tags {sorted(self.asleep)}")
                began = time.monotonic()
                if WEIGHTS in waking:
                    await asyncio.sleep(self.settings.wake_seconds)  # only the weights take time to come back
                if waking & {WEIGHTS, KV_CACHE}:
                    self.gpu_gib = self.settings.memory_gib
                self.asleep -= waking
                self._report("to wake up tags", time.monotonic() - began, set(waking))
                if not self.asleep:
                    self.level = None
                    self.running.set()
                    self.flowing.set()
                self.counts.wakes += 1
                return {"status": "sleeping" if self.asleep else "awake", "tags": named or None}

        return await self._call("wake", perform)

    async def _vllm_is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(self.asleep)})

    async def _vllm_collective_rpc(self, request: web.Request) -> web.Response:
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return _error(400, str(bad))
        method = body.get("method") if isinstance(body, dict) else None
        if method != "reload_weights":
            return _error(400, f"the sim's collective_rpc knows only method 'reload_weights', not {method!r}")
        async with self._turn:
            if WEIGHTS in self.asleep:
                return _error(400, "the weights are asleep: wake them (/wake_up?tags=weights) before reload_weights")
            self.weights_garbage = False
        return web.json_response({"results": [None]})  # one result per worker; the sim has one

    async def _vllm_reset_prefix_cache(self, request: web.Request) -> web.Response:
        return web.Response()

    # -- SGLang ------------------------------------------------------------

    async def _sglang_pause(self, request: web.Request) -> web.Response:
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return _error(400, str(bad))
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in SGLANG_PAUSE_MODES:
            return _error(400, f"mode must be one of {', '.join(SGLANG_PAUSE_MODES)}, not {mode!r}")
        self.running.clear()
        self.pause_mode = mode
        if mode != "abort":
            self.flowing.clear()  # retract: back to the queue until continued; in_place: held where they are
        if mode == "abort" and self.workload.busy():
            self.workload.abort_all()
            await self.workload.until_idle()
        return web.json_response(None)

    async def _sglang_continue(self, request: web.Request) -> web.Response:
        self.pause_mode = None
        self.running.set()
        self.flowing.set()
        return web.json_response(None)

    async def _sglang_release(self, request: web.Request) -> web.Response:
        try:
            tags = sglang_tags(await json_body(request))
        except BadRequest as bad:
            return _error(400, str(bad))

        async def perform() -> None:
            async with self._turn:
                # An idle scheduler, or one paused with its requests aborted or retracted
                # (weight_updater.py:339-341): anything else is an assertion that kills the server.
                if self.workload.busy() and self.pause_mode not in ("abort", "retract"):
                    self.counts.sleeps_while_busy += 1
                    _die("Scheduler hit an exception: AssertionError: "
                         "release_memory_occupation should be called only when server is idle.")
                if KV_CACHE in tags:
                    self._report("Cache flushed")
                self.asleep |= tags
                self.level = 1
                await asyncio.sleep(self.settings.sleep_seconds)
                if self._frees():  # the weights and the KV cache hold half each
                    self.gpu_gib = self.settings.memory_gib * (1 - len({WEIGHTS, KV_CACHE} & self.asleep) / 2)
                self.counts.sleeps += 1

        return await self._call("sleep", perform)

    async def _sglang_resume(self, request: web.Request) -> web.Response:
        try:
            tags = sglang_tags(await json_body(request))
        except BadRequest as bad:
            return _error(400, str(bad))

        async def perform() -> None:
            async with self._turn:
                for tag in sorted(tags):
                    if tag not in self.asleep:  # offload_tags.remove(tag): a KeyError that kills the server
                        _die(f"Scheduler hit an exception: KeyError: {tag!r}")
                await asyncio.sleep(self.settings.wake_seconds)
                backup = self.facts.sleep is not None and self.facts.sleep.weights_back_requires is not None and all(
                    flag in self.settings.switches for flag in self.facts.sleep.weights_back_requires.flags)
                if WEIGHTS in tags and self._frees() and not backup:
                    self.weights_garbage = True  # nothing kept them: the memory comes back, not the weights
                self.asleep -= tags
                self.gpu_gib = self.settings.memory_gib if not self.asleep else self.gpu_gib
                if not self.asleep:
                    self.level = None
                self.counts.wakes += 1

        return await self._call("wake", perform)

    # -- TabbyAPI ----------------------------------------------------------

    async def _tabby_unload(self, request: web.Request) -> web.Response:
        async def perform() -> None | web.Response:
            async with self._turn:
                if not self.loaded:
                    return web.json_response(NOT_LOADED, status=503)
                if self.workload.busy():
                    self.counts.sleeps_while_busy += 1
                    _log("WARNING:  Immediately terminating all jobs. Clients will have their requests cancelled.")
                    self.workload.abort_all()
                    await self.workload.until_idle()
                self.loaded = False
                await asyncio.sleep(self.settings.sleep_seconds)
                self.gpu_gib = 0.0
                self._report("Model unloaded")
                self.counts.sleeps += 1
                return None

        return await self._call("sleep", perform)

    async def _tabby_load(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return _error(400, str(bad))
        name = body.get("model_name") if isinstance(body, dict) else None
        if not name:
            return web.json_response({"detail": "A model name was not provided for load."}, status=400)
        if name != self.settings.model:
            return web.json_response(
                {"detail": "Could not find the model path for load. Check model name or config.yml?"}, status=400)
        fault = await self._fault("wake")
        if fault is not None:
            return fault
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        modules = 1 if self.loaded else 4

        async def perform() -> None:
            async with self._turn:
                for module in range(1, modules + 1):
                    if not self.loaded:
                        await asyncio.sleep(self.settings.wake_seconds / modules)
                    status = "finished" if module == modules else "processing"
                    event = {"model_type": "model", "module": module, "modules": modules, "status": status}
                    await response.write(f"data: {json.dumps(event)}\n\n".encode())
                if not self.loaded:
                    self.loaded = True
                    self.gpu_gib = self.settings.memory_gib
                    self._report("successfully loaded")
                    self.counts.wakes += 1

        await self._shielded("wake", perform())
        await response.write_eof()
        return response

    # -- faults ------------------------------------------------------------

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults)

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            self.faults.update(fault_changes(await json_body(request)))
        except BadRequest as bad:
            return _error(400, str(bad))
        return web.json_response(self.faults)

    # -- the operations ----------------------------------------------------

    async def _fault(self, operation: Operation) -> web.Response | None:
        """The fault in force for `operation`: its answer (or no answer at all), else None."""
        fault = self.faults[operation]
        if fault != "none":
            _log(f"{operation} call: injecting fault {fault!r}")
        if fault == "error":
            return _error(500, f"simulated {operation} failure (fault 'error')")
        if fault == "hang":
            # Never answered: the wait ends only when the client leaves and aiohttp cancels the handler.
            await asyncio.get_running_loop().create_future()
        if fault == "crash":
            os._exit(1)  # a dead engine: no answer, no cleanup
        return None

    async def _call(self, operation: Operation, perform: Callable[[], Awaitable[Any]]) -> web.Response:
        """Answer a sleep or wake call: its fault if one is in force, else `perform` to its end."""
        fault = await self._fault(operation)
        if fault is not None:
            return fault
        answer = await self._shielded(operation, perform())
        return answer if isinstance(answer, web.Response) else web.json_response(answer)

    async def _shielded(self, operation: Operation, work: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(work)
        self._running_calls.add(task)
        task.add_done_callback(self._running_calls.discard)
        try:
            return await asyncio.shield(task)  # an engine finishes what it started, whether or not the caller waits
        except asyncio.CancelledError:
            _log(f"{operation} call: the client left; the {operation} goes on")
            raise

    def _report(self, words: str, *values: Any) -> None:
        """Print the engine's own report line (the one of its contract's sleep reports whose format
        holds `words`), filled with `values`, as the engine prints it."""
        assert self.facts.sleep is not None
        report = next(report for report in self.facts.sleep.reports if words in report.format)
        try:
            line = report.format % values if values else report.format
        except (TypeError, ValueError):
            line = report.format
        print(line, flush=True)


def _error(status: int, message: str) -> web.Response:
    return web.json_response(chunks.error_body(status, message), status=status)


def _log(line: str) -> None:
    # Rare events, on stderr, where a router's /logs shows them beside its own decisions.
    print(f"sim: {line}", file=sys.stderr, flush=True)


def _die(line: str) -> None:
    """The engine's process tree killed by its own failure (SGLang's SIGQUIT to its parent)."""
    print(line, file=sys.stderr, flush=True)
    os._exit(1)
