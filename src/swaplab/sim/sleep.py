"""The sim's sleep APIs: vLLM's (`/sleep`, `/wake_up`) and SGLang's (`/release_memory_occupation`,
`/resume_memory_occupation`), over one state machine, with the delays and faults a test asks for.

A router that puts idle engines to sleep instead of stopping them is tested against these:
the state machine (`SleepState`) is pure, so its rules are a table; `Sleeper` is the HTTP
side, which serialises sleep and wake calls the way an engine's core does and applies the
delays (`--sleep-seconds`, `--wake-seconds`) and faults (`--sleep-fault`, `--wake-fault`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from aiohttp import web

from swaplab.errors import SwaplabError
from swaplab.sim import chunks
from swaplab.sim.request import BadRequest, json_body

Engine = Literal["generic", "vllm", "sglang"]
Fault = Literal["none", "error", "hang", "crash"]
Operation = Literal["sleep", "wake"]
ENGINES: tuple[Engine, ...] = get_args(Engine)
FAULTS: tuple[Fault, ...] = get_args(Fault)

# What a sleep releases and a wake restores; both engines call them by these names.
WEIGHTS = "weights"
KV_CACHE = "kv_cache"
PARTS = frozenset({WEIGHTS, KV_CACHE})

SLEEPING = "model is sleeping"
GOING_TO_SLEEP = "model is going to sleep"
DISCARDED = "weights were discarded by a level-2 sleep and not reloaded"


class SleepSettings(Protocol):
    """The part of the sim's settings this module reads (`SimSettings` has them)."""

    engine: Engine
    sleep_seconds: float
    wake_seconds: float
    sleep_fault: Fault
    wake_fault: Fault


class Workload(Protocol):
    """The generation requests in flight, which a sleep waits out (the sim owns their count)."""

    def busy(self) -> bool: ...

    async def until_idle(self) -> None: ...


def check_settings(settings: SleepSettings) -> None:
    """Refuse an engine or fault the sim does not know, and sleep options without a sleep API."""
    if settings.engine not in ENGINES:
        raise SwaplabError(f"sim: --engine must be one of {', '.join(ENGINES)}, not {settings.engine!r}")
    for operation in ("sleep", "wake"):
        fault = getattr(settings, f"{operation}_fault")
        if fault not in FAULTS:
            raise SwaplabError(f"sim: --{operation}-fault must be one of {', '.join(FAULTS)}, not {fault!r}")
    if settings.engine == "generic":
        given = [
            f"--{name.replace('_', '-')}"
            for name, unset in (("sleep_seconds", 0), ("wake_seconds", 0), ("sleep_fault", "none"), ("wake_fault", "none"))
            if getattr(settings, name) != unset
        ]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise SwaplabError(
                f"sim: {', '.join(given)} {verb} --engine vllm or --engine sglang: the generic engine has no sleep API"
            )


@dataclass
class SleepState:
    """What of the model is asleep, and whether its weights can be trusted; the rules, without I/O."""

    asleep: frozenset[str] = frozenset()
    level: int | None = None  # the last sleep's level while anything is asleep
    weights_discarded: bool = False  # a level-2 sleep threw them away; only reload_weights restores them
    draining: bool = False  # a sleep waits for the requests in flight; no new ones start

    def fall_asleep(self, level: int, parts: frozenset[str]) -> None:
        """Release `parts`: level 1 keeps the weights in host RAM, level 2 discards them."""
        self.asleep |= parts
        self.level = level
        self.draining = False
        if level == 2 and WEIGHTS in parts:
            self.weights_discarded = True

    def wake(self, parts: frozenset[str]) -> None:
        """Restore `parts`; weights a level-2 sleep discarded come back as garbage, still discarded."""
        self.asleep -= parts
        if not self.asleep:
            self.level = None

    def reload_weights(self) -> None:
        """vLLM's `reload_weights` RPC: valid weights again, which needs them on the GPU."""
        if WEIGHTS in self.asleep:
            raise BadRequest("the weights are asleep: wake them (/wake_up?tags=weights) before reload_weights")
        self.weights_discarded = False

    def refusal(self) -> str | None:
        """Why generation is refused now, or None when the model can serve."""
        if self.asleep:
            return SLEEPING
        if self.draining:
            return GOING_TO_SLEEP
        if self.weights_discarded:
            return DISCARDED
        return None


def sleep_level(value: str | None) -> int:
    """vLLM's `?level=`: 1 (the default) or 2."""
    if value is None:
        return 1
    if value not in ("1", "2"):
        raise BadRequest(f"level must be 1 or 2, not {value!r}")
    return int(value)


def wake_tags(values: list[str]) -> frozenset[str]:
    """vLLM's repeated `?tags=`: none means everything."""
    return _parts(values) if values else PARTS


def memory_tags(body: Any) -> frozenset[str]:
    """SGLang's `{"tags": [...]}` body: `{}` or `"tags": null` means everything."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object, {} or {\"tags\": [...]}")
    tags = body.get("tags")
    if tags is None:
        return PARTS
    if not isinstance(tags, list) or not tags:
        raise BadRequest(f"'tags' must be a non-empty list of {WEIGHTS!r} and {KV_CACHE!r}")
    return _parts(tags)


def _parts(tags: list[Any]) -> frozenset[str]:
    unknown = [tag for tag in tags if tag not in PARTS]
    if unknown:
        raise BadRequest(f"unknown tags {unknown}: the tags are {WEIGHTS!r} and {KV_CACHE!r}")
    return frozenset(tags)


def rpc_method(body: Any) -> str:
    """The method of a `/collective_rpc` body; the sim knows only `reload_weights`."""
    method = body.get("method") if isinstance(body, dict) else None
    if method != "reload_weights":
        raise BadRequest(f"the sim's collective_rpc knows only method 'reload_weights', not {method!r}")
    return method


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
    sleeps_while_busy: int = 0  # sleeps that found generation in flight and waited for it


@dataclass
class Sleeper:
    """One engine's sleep API: owns the sleep state, its counts and the faults in force."""

    settings: SleepSettings
    workload: Workload
    state: SleepState = field(default_factory=SleepState)
    counts: SleepCounts = field(default_factory=SleepCounts)
    faults: dict[Operation, Fault] = field(init=False)
    # Sleep, wake and reload are one at a time, in arrival order, as an engine's core runs them.
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Accepted operations run to their end even when their client leaves; kept here so none is collected.
    _running: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.faults = {"sleep": self.settings.sleep_fault, "wake": self.settings.wake_fault}

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
                web.post("/release_memory_occupation", self._sglang_release),
                web.post("/resume_memory_occupation", self._sglang_resume),
            ],
        }
        return [
            *engine_routes[self.settings.engine],
            web.get("/sim/faults", self._get_faults),
            web.post("/sim/faults", self._set_faults),
        ]

    def refusal(self) -> str | None:
        """Why a generation request is refused now (503), or None."""
        return self.state.refusal()

    def stats(self) -> dict[str, Any]:
        """The sleep fields of `/sim/stats`."""
        return {
            "sleeps": self.counts.sleeps,
            "wakes": self.counts.wakes,
            "asleep": bool(self.state.asleep),
            "sleep_level": self.state.level,
            "sleeps_while_busy": self.counts.sleeps_while_busy,
        }

    # -- vLLM --------------------------------------------------------------

    async def _vllm_sleep(self, request: web.Request) -> web.Response:
        try:
            level = sleep_level(request.query.get("level"))
        except BadRequest as bad:
            return _error(400, str(bad))
        return await self._call("sleep", lambda: self._sleep(level, PARTS), {})

    async def _vllm_wake_up(self, request: web.Request) -> web.Response:
        try:
            parts = wake_tags(request.query.getall("tags", []))
        except BadRequest as bad:
            return _error(400, str(bad))
        # Only restoring weights takes time: the KV cache is allocated afresh.
        delay = self.settings.wake_seconds if WEIGHTS in parts else 0.0
        return await self._call("wake", lambda: self._wake(parts, delay), {})

    async def _vllm_is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(self.state.asleep)})

    async def _vllm_collective_rpc(self, request: web.Request) -> web.Response:
        try:
            rpc_method(await json_body(request))
            async with self._turn:
                self.state.reload_weights()
        except BadRequest as bad:
            return _error(400, str(bad))
        return web.json_response({"results": [None]})  # one result per worker; the sim has one

    async def _vllm_reset_prefix_cache(self, request: web.Request) -> web.Response:
        return web.Response()

    # -- SGLang ------------------------------------------------------------

    async def _sglang_release(self, request: web.Request) -> web.Response:
        try:
            parts = memory_tags(await json_body(request))
        except BadRequest as bad:
            return _error(400, str(bad))
        # With --enable-weights-cpu-backup the weights wait in host RAM: vLLM's level 1.
        answer = {"success": True, "message": f"released {', '.join(sorted(parts))}"}
        return await self._call("sleep", lambda: self._sleep(1, parts), answer)

    async def _sglang_resume(self, request: web.Request) -> web.Response:
        try:
            parts = memory_tags(await json_body(request))
        except BadRequest as bad:
            return _error(400, str(bad))
        answer = {"success": True, "message": f"resumed {', '.join(sorted(parts))}"}
        return await self._call("wake", lambda: self._wake(parts, self.settings.wake_seconds), answer)

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

    async def _call(
        self, operation: Operation, perform: Callable[[], Awaitable[None]], answer: dict[str, Any]
    ) -> web.Response:
        """Answer a sleep or wake call: its fault if one is in force, else `perform` to its end."""
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
        task = asyncio.ensure_future(perform())
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            await asyncio.shield(task)  # an engine finishes what it started, whether or not the caller waits
        except asyncio.CancelledError:
            _log(f"{operation} call: the client left; the {operation} goes on")
            raise
        return web.json_response(answer)

    async def _sleep(self, level: int, parts: frozenset[str]) -> None:
        async with self._turn:
            if self.workload.busy():
                # Real engines want to be idle first; a router should have drained them. Record that it did not.
                self.counts.sleeps_while_busy += 1
                self.state.draining = True
                _log("sleep call: waiting for the requests in flight")
                while self.workload.busy():
                    await self.workload.until_idle()
            # Refusing from the start of the sleep, not its end: nothing is served while memory goes.
            self.state.fall_asleep(level, parts)
            _log(f"going to sleep: level {level}, releasing {', '.join(sorted(parts))}")
            await asyncio.sleep(self.settings.sleep_seconds)
            self.counts.sleeps += 1

    async def _wake(self, parts: frozenset[str], delay: float) -> None:
        async with self._turn:
            _log(f"waking: restoring {', '.join(sorted(parts))}")
            # Still asleep until the memory is back: is_sleeping says so, generation is refused.
            await asyncio.sleep(delay)
            self.state.wake(parts)
            self.counts.wakes += 1


def _error(status: int, message: str) -> web.Response:
    return web.json_response(chunks.error_body(status, message), status=status)


def _log(line: str) -> None:
    # Rare events, on stderr, where a router's /logs shows them beside its own decisions.
    print(f"sim: {line}", file=sys.stderr, flush=True)
