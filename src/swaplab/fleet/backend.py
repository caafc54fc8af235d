"""One backend process and its small state machine: stopped, starting, ready, stopping,
and for a model with `sleep:`, falling asleep, sleeping and waking.

A `Backend` is driven only by the `Fleet`, which decides *when* to start or stop it;
the backend knows *how*: spawn in its own session with a parent-death signal, drain
its output, wait for real readiness, stop by `cmdStop` or signals, sweep what escaped.

Every start begins one lifecycle task (`_live`) that owns the process from spawn to
exit: it alone moves the state on. `stop()` only records the request (and shows the
state as stopping at once, so nobody admits work to a backend on its way out); the
lifecycle task looks at that request after every await, so a stop that arrives while
the process is being spawned or health-checked ends with no process, never with one
that nobody owns. `sleep()` and `wake()` are requests of the same kind: the same task
makes the engine's calls, proves readiness after a wake as after a start, and when a
call fails or times out, stops the process (the fallback: the fleet then starts it cold).
One concept, at some length: one task owns a process from spawn to exit, and the rule that it
looks at a stop after every await holds only while its steps stay in its sight.

With `kvCache:` (llama.cpp), the same task saves the server's slots before a stop ends it
and restores them after a start proves it ready, before any request is admitted
(`fleet.context`): each within the model's `saveTimeout`, and a failure
only costs the cache (a cold prefill), never the stop or the start.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable

import aiohttp

from swaplab.config.model import ModelConfig
from swaplab.errors import BackendStartError
from swaplab.fleet.context import ContextKeeper
from swaplab.fleet.devices import device_env
from swaplab.fleet.engineapi import call_all, first_of, poll_ready, tree_gib
from swaplab.fleet.kvstore import KvStore, saves_context
from swaplab.fleet.logs import LogHub
from swaplab.fleet.loadclock import LoadClock, LoadWatch, command_identity
from swaplab.fleet.output import ProcessOutput, settle
from swaplab.fleet.reaper import (
    PidFiles,
    descendants,
    die_with_parent,
    kill_all,
    signal_group,
)
from swaplab.fleet.run import Run
from swaplab.fleet.sleepcheck import Freed, ReportWatch, freed_nothing, nvml_freed, report_patterns
from swaplab.metrics import Metrics

log = logging.getLogger("swaplab.fleet")



# How long after a sleep call's answer the engine's own report of what it freed may still arrive.
REPORT_GRACE_SECONDS = 5.0
# A model whose sleep or wake failed this many times in a row is stopped, not put to
# sleep, until its config entry changes.
SLEEP_FAULT_LIMIT = 2



class State(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FALLING_ASLEEP = "falling_asleep"
    """The engine's sleep calls are under way: it still holds the GPU, and takes no request."""
    SLEEPING = "sleeping"
    """The process lives and holds its port and host RAM, not the GPU; a wake makes it ready."""
    WAKING = "waking"
    """The wake calls and the readiness check are under way: it holds the GPU again."""

    @property
    def arriving(self) -> bool:
        """On its way to ready, holding the GPU: starting, or waking from sleep."""
        return self in (State.STARTING, State.WAKING)

    @property
    def leaving(self) -> bool:
        """On its way off the GPU, still holding it: stopping, or falling asleep."""
        return self in (State.STOPPING, State.FALLING_ASLEEP)

    @property
    def holds_gpu(self) -> bool:
        """Its process holds (or is taking, or still leaving) the GPU: any state but stopped and asleep."""
        return self not in (State.STOPPED, State.SLEEPING)

    @property
    def serving(self) -> bool:
        """Ready, or about to be: what a listing calls loaded and a selector calls warm."""
        return self is State.READY or self.arriving

    @property
    def as_placement(self) -> State:
        """The state the placement decision reads (it knows starting and stopping, not sleep):
        a model falling asleep is leaving, one waking is arriving."""
        return State.STOPPING if self.leaving else State.STARTING if self.arriving else self


class Backend:
    """Owns one model's server process. Only the fleet calls `start` and `stop`."""

    def __init__(
        self,
        model: ModelConfig,
        *,
        health_check_timeout: float,
        logs: LogHub,
        pid_files: PidFiles,
        http: aiohttp.ClientSession,
        on_change: Callable[[Backend, Run], None],
        extra_env: dict[str, str] | None = None,
        kv_store: KvStore | None = None,
        metrics: Metrics | None = None,
        load_clock: LoadClock | None = None,
        on_progress: Callable[[Backend], None] | None = None,
        gpu_held: Callable[[int], dict[int, float] | None] | None = None,
    ):
        self.model = model
        self._gpu_held = gpu_held
        """GiB a process tree holds on each GPU (NVML), or None where it cannot be read."""
        self._sleep_report: ReportWatch | None = None
        """Armed while a sleep is under way: the engine's own line saying what it freed."""
        self._load_clock = load_clock or LoadClock()
        self._on_progress = on_progress
        self.watch: LoadWatch | None = None
        """The start or wake under way: its stage from the server's output, and its ETA."""
        self.health_check_timeout = health_check_timeout
        self._logs = logs
        self._pid_files = pid_files
        self._http = http
        self._on_change = on_change
        self._extra_env = extra_env or {}
        self.context = ContextKeeper(model, kv_store, metrics, http, lambda run: self._on_change(self, run),
                                     self._fell_back_to) if kv_store is not None and saves_context(model) else None
        """Its KV-cache saves and restores (`kvCache`); None without."""
        self.state = State.STOPPED
        self.run: Run | None = None
        self._runs = 0
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.start_seconds: float | None = None
        self.last_exit_code: int | None = None
        self.last_error: str = ""
        self.consecutive_failures = 0
        self.backoff_until = 0.0
        self.ready_by = "start"
        """How the current readiness came: `start` or `wake`."""
        self.became_ready = 0.0
        """When (monotonic) it last became ready."""
        self.sleeps = 0
        self.wakes = 0
        self.sleep_faults = 0
        """Sleeps and wakes that failed in a row; at SLEEP_FAULT_LIMIT the model is no longer put to sleep."""
        self.last_fallback = ""
        self.fell_back_at = 0.0
        """When (monotonic) a sleep or wake last failed and the process was stopped instead."""
        self.asleep_since: float | None = None
        self.last_sleep_seconds: float | None = None
        self.last_wake_seconds: float | None = None
        self.host_gib: float | None = None
        """RAM the process tree held the last time it slept (measured)."""
        self.last_freed: Freed | None = None
        """What its last sleep freed on the GPU, and who said so (the engine's report, NVML); None: unknown."""

    @property
    def id(self) -> str:
        return self.model.id

    @property
    def pid(self) -> int | None:
        return self.run.pid if self.run is not None else None

    @property
    def phase(self) -> str:
        """What the run is doing within its state (`restoring context`, `saving context`), or ""."""
        return self.context.phase if self.context is not None else ""

    def _fell_back_to(self, why: str) -> None:
        self.last_fallback = why
        self.fell_back_at = time.monotonic()

    @property
    def may_sleep(self) -> bool:
        """Whether a swap may put this backend to sleep (rather than stop it) now."""
        return (
            self.model.sleep is not None
            and self.state is State.READY
            and self.sleep_faults < SLEEP_FAULT_LIMIT
        )

    def output_tail(self, lines: int = 15) -> str:
        """The current run's last lines: the buffer spans runs, and a failed start that quoted
        the one before it would show the same error twice."""
        return self._logs.tail(self.id, lines, since=self.started_at)

    @property
    def identity(self) -> str:
        """Its command's digest: the loads of one command are one history."""
        return command_identity(self.model.cmd)

    def _output_line(self, line: str) -> None:
        """A line of the server's output: it may move the start's stage (never the ready state)."""
        if self.watch is not None and self.watch.line(line, time.monotonic()) and self._on_progress is not None:
            self._on_progress(self)
        if self._sleep_report is not None:
            self._sleep_report.line(line)

    def _enter(self, stage: str) -> None:
        if self.watch is not None and self.watch.enter(stage, time.monotonic()) and self._on_progress is not None:
            self._on_progress(self)

    def _finish_watch(self) -> None:
        if self.watch is not None:
            self._load_clock.finish(self.id, self.identity, self.watch, time.monotonic(), time.time())
            self.watch = None

    def _set(self, state: State) -> None:
        self.state = state
        assert self.run is not None
        self._on_change(self, self.run)

    # -- the two requests the fleet makes -----------------------------------------

    def start(self) -> Run:
        """Begin a run (the state is `starting` from now); its `ready` future says how the start ended.

        A failed start sets `ready`'s exception once its process is gone, just before the
        state becomes `stopped`.
        """
        if self.state is not State.STOPPED or self.run is not None:
            raise RuntimeError(f"{self.id}: start while {self.state}")
        loop = asyncio.get_running_loop()
        self._runs += 1
        run = self.run = Run(self._runs, loop)
        # Nobody may be waiting on `ready` (a stop can come first): never "exception never retrieved".
        run.ready.add_done_callback(lambda future: future.cancelled() or future.exception())
        loop.create_task(self._live(run), name=f"run {self.id} #{run.number}")
        self._set(State.STARTING)
        return run

    def stop(self, reason: str = "stopped", *, save_context: bool = True) -> asyncio.Future[None]:
        """Ask the current run to end; the future is done when no process of it is left.

        The state shows `stopping` at once; the run's own task does the stopping (and, with
        `kvCache`, saves the slots first unless `save_context` is False: a reload's stop).
        """
        run = self.run
        if run is None:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        if not run.stop_wanted.is_set():
            run.stop_reason = reason
            run.save_context = save_context
            run.stop_wanted.set()
            if self.state not in (State.STOPPING, State.STOPPED):
                self._set(State.STOPPING)
        return asyncio.shield(run.ended)

    def sleep(self) -> None:
        """Ask a ready backend to free its GPU and keep its process; the state is `falling_asleep` at once."""
        run = self.run
        if run is None or self.state is not State.READY or self.model.sleep is None:
            raise RuntimeError(f"{self.id}: sleep while {self.state}")
        run.sleep_wanted.set()
        self._set(State.FALLING_ASLEEP)

    def wake(self) -> None:
        """Ask a sleeping backend to take its GPU back; the state is `waking` at once."""
        run = self.run
        if run is None or self.state is not State.SLEEPING:
            raise RuntimeError(f"{self.id}: wake while {self.state}")
        run.wake_wanted.set()
        self._set(State.WAKING)

    # -- the run, start to end -------------------------------------------------------

    async def _live(self, run: Run) -> None:
        begun = run.begun
        self.started_at = time.time()
        self.watch = self._load_clock.begin(self.id, "start", self.identity, begun)
        outcome: BaseException | None = None
        served = False
        try:
            failure = await self._bring_up(run, begun + self.health_check_timeout)
            if failure is None and not run.stop_wanted.is_set() and run.context_dir is not None and self.context is not None:
                self._enter("restoring context")
                await self.context.restore(run)
            if failure is None and not run.stop_wanted.is_set():
                self._finish_watch()
                self.start_seconds = time.monotonic() - begun
                self.ready_at = time.time()
                run.ready.set_result(None)
                self.ready_by = "start"
                self.became_ready = time.monotonic()
                self._set(State.READY)
                log.info("%s ready in %.2f s (pid %s)", self.id, self.start_seconds, run.pid)
                served = True
                await self._serve(run)
            elif failure is not None and not run.stop_wanted.is_set():
                self.last_error = str(failure)
                self._record_failure()
                outcome = failure
            else:
                outcome = BackendStartError(f"model {self.id!r} was stopped while starting ({run.stop_reason})")
            if self.state is not State.STOPPING:
                self._set(State.STOPPING)
            if served and self.context is not None and run.context_dir is not None and run.save_context and not run.exited.is_set():
                await self.context.save(run)
            # A failed start is reported once its process is gone, not before.
            await self._terminate(run)
        except asyncio.CancelledError:
            # Nothing cancels a run but the loop's own teardown: leave no process behind.
            if run.transport is not None:
                signal_group(run.transport.get_pid(), signal.SIGKILL)
            raise
        finally:
            if run.exited.is_set():
                self.last_exit_code = run.exit_code
                self._pid_files.remove(self.id)
            if run.transport is not None:
                run.transport.close()
            if not run.ready.done():
                run.ready.set_exception(outcome or BackendStartError(f"model {self.id!r} did not start"))
            self.run = None
            self.state = State.STOPPED
            if self.context is not None:
                self.context.phase = ""
            self.watch = None
            run.ended.set_result(None)
            self._on_change(self, run)
            log.info("%s stopped", self.id)

    async def _bring_up(self, run: Run, deadline: float) -> BackendStartError | None:
        """Spawn and wait until ready; returns why it failed, or None (also when a stop came)."""
        if run.stop_wanted.is_set():
            return None
        try:
            await self._spawn(run)
        except BackendStartError as error:
            return error
        if run.stop_wanted.is_set():
            return None
        return await self._wait_ready(run, deadline)

    async def _serve(self, run: Run) -> None:
        """From ready until a stop is wanted or the process exits: sleeps and wakes as asked."""
        while (
            await self._until(run, run.sleep_wanted) and await self._fall_asleep(run)
            and await self._until(run, run.wake_wanted) and await self._wake_up(run)
        ):
            pass

    async def _until(self, run: Run, wanted: asyncio.Event) -> bool:
        """Until `wanted` is set (then cleared: True), a stop is wanted or the process exits (False)."""
        await first_of(run.stop_wanted.wait(), run.exited.wait(), wanted.wait())
        if not run.stop_wanted.is_set() and run.exited.is_set():
            await self._crashed(run)
        if run.stop_wanted.is_set() or run.exited.is_set():
            return False
        wanted.clear()
        return True

    async def _fall_asleep(self, run: Run) -> bool:
        """The engine's sleep calls; False when the run is ending (a stop, an exit, or the fallback)."""
        sleep = self.model.sleep
        assert sleep is not None
        began = time.monotonic()
        held_before = self._gpu_held(run.pid) if self._gpu_held is not None and run.pid is not None else None
        self._sleep_report = ReportWatch(report_patterns(self.model), self.id)
        try:
            failure = await call_all(self._http, self.model, sleep.sleep_calls, sleep.timeout, run.exited, run.stop_wanted)
            if failure is None and not run.stop_wanted.is_set():
                failure = await self._freed_nothing(run, self._sleep_report, held_before)
        finally:
            self._sleep_report = None
        if failure is not None:
            return await self._fall_back(run, f"its sleep failed ({failure})")
        if run.stop_wanted.is_set():
            return False
        self.last_sleep_seconds = time.monotonic() - began
        self.sleeps += 1
        self.asleep_since = time.time()
        self.host_gib = tree_gib(run.pid)
        self._set(State.SLEEPING)
        freed = f"; {self.last_freed.source}" if self.last_freed is not None else ""
        log.info("%s asleep in %.2f s (pid %s and its children hold %.2f GiB of RAM%s)", self.id, self.last_sleep_seconds,
                 run.pid, self.host_gib or 0.0, freed)
        return True

    async def _freed_nothing(self, run: Run, report: ReportWatch, held_before: dict[int, float] | None) -> str | None:
        """Why the sleep that just answered is not believed (it freed nothing), or None. The engine's own
        report is awaited a moment: its worker prints it beside the answer, on another pipe."""
        if report.patterns and not report.seen.is_set():
            await first_of(report.seen.wait(), asyncio.sleep(REPORT_GRACE_SECONDS), run.exited.wait(),
                           run.stop_wanted.wait())
        freed = report.freed
        if freed is None and held_before is not None and self._gpu_held is not None and run.pid is not None:
            freed = nvml_freed(held_before, self._gpu_held(run.pid))
        self.last_freed = freed
        return freed_nothing(freed)

    async def _wake_up(self, run: Run) -> bool:
        """The wake calls, then readiness proved as after a start; False when the run is ending."""
        sleep = self.model.sleep
        assert sleep is not None
        began = time.monotonic()
        self.watch = self._load_clock.begin(self.id, "wake", self.identity, began)
        self._enter("waking")
        failure = await call_all(self._http, self.model, sleep.wake_calls, sleep.timeout, run.exited, run.stop_wanted)
        if failure is None:
            not_ready = await self._wait_ready(run, time.monotonic() + sleep.timeout, after="waking")
            failure = str(not_ready).split(";")[0] if not_ready is not None else None
        if failure is not None:
            self.watch = None
            return await self._fall_back(run, f"its wake failed ({failure})")
        if run.stop_wanted.is_set():
            self.watch = None
            return False
        self._finish_watch()
        self.last_wake_seconds = time.monotonic() - began
        self.wakes += 1
        self.sleep_faults = 0
        self.asleep_since = None
        self.ready_by = "wake"
        self.became_ready = time.monotonic()
        self._set(State.READY)
        log.info("%s awake in %.2f s (pid %s)", self.id, self.last_wake_seconds, run.pid)
        return True

    async def _fall_back(self, run: Run, why: str) -> bool:
        """A sleep or wake failed: stop the process (the fleet starts it cold when it is wanted)."""
        if run.stop_wanted.is_set():
            return False
        self.sleep_faults += 1
        self.last_fallback = run.fallback = why
        self.fell_back_at = time.monotonic()
        if run.exited.is_set():
            await self._crashed(run)
            return False
        disabled = self.sleep_faults >= SLEEP_FAULT_LIMIT
        log.warning("%s: %s; stopping it instead%s", self.id, why,
                    f" (failed {self.sleep_faults} times in a row: no more sleeps until its config changes)"
                    if disabled else "")
        run.stop_reason = why
        run.stop_wanted.set()
        self._set(State.STOPPING)
        return False

    async def _crashed(self, run: Run) -> None:
        # Shown as stopping at once, before any await: no request may be admitted to a dead port.
        self.last_error = f"exited with code {run.exit_code}"
        self._record_failure()
        self._set(State.STOPPING)
        await settle(run)
        log.warning("%s exited on its own with code %s; its last output:\n%s", self.id, run.exit_code, self.output_tail(8))

    async def _spawn(self, run: Run) -> None:
        argv = list(self.model.cmd)
        if not argv:  # the config loads such a model, as llama-swap's does; only starting it fails
            raise BackendStartError(
                f"model {self.id!r} has no cmd: it cannot be started (give it a cmd in the config)"
            )
        if self.context is not None:
            argv = await self.context.command(run, argv)
        env = self._environment()
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: ProcessOutput(self.id, self._logs, run, on_line=self._output_line),
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except FileNotFoundError:
            raise BackendStartError(
                f"model {self.id!r} cannot start: {argv[0]!r} does not exist on this machine (check its cmd)"
            ) from None
        except PermissionError:
            raise BackendStartError(f"model {self.id!r} cannot start: {argv[0]!r} is not executable") from None
        except OSError as error:
            raise BackendStartError(f"model {self.id!r} cannot start {argv[0]!r}: {error}") from None
        run.transport = transport
        if not run.exited.is_set():
            self._pid_files.record(self.id, transport.get_pid())
        log.info("%s starting: pid %d", self.id, transport.get_pid())

    def _record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.consecutive_failures >= 2:
            delay = min(2.0 ** (self.consecutive_failures - 2), 60.0)
            self.backoff_until = time.monotonic() + delay
            log.warning("%s failed %d times in a row: next start in %.0f s", self.id, self.consecutive_failures, delay)

    def note_success(self) -> None:
        """A request completed: the crash-loop counter starts over."""
        self.consecutive_failures = 0
        self.backoff_until = 0.0

    async def _wait_ready(self, run: Run, deadline: float, after: str = "starting") -> BackendStartError | None:
        check = self.model.check_endpoint
        if check == "none":
            return None
        probe = asyncio.ensure_future(poll_ready(self._http, self.model, check))
        exited = asyncio.ensure_future(run.exited.wait())
        stopped = asyncio.ensure_future(run.stop_wanted.wait())
        try:
            done, _ = await asyncio.wait(
                {probe, exited, stopped},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for waiter in (probe, exited, stopped):
                waiter.cancel()
        if run.stop_wanted.is_set() or probe in done:
            return None
        if exited in done:
            await settle(run)
            return BackendStartError(
                f"model {self.id!r} exited with code {run.exit_code} while {after}; its last output:\n"
                f"{self.output_tail()}"
            )
        if after == "waking":
            return BackendStartError(f"not ready within {self.model.sleep.timeout:g} s of waking "  # type: ignore[union-attr]
                                     f"(checkEndpoint {check!r}); its last output:\n{self.output_tail()}")
        return BackendStartError(
            f"model {self.id!r} not ready after {self.health_check_timeout:.0f} s "
            f"(checkEndpoint {check!r}; raise healthCheckTimeout if it loads slowly); its last output:\n"
            f"{self.output_tail()}"
        )

    # -- stopping ----------------------------------------------------------------------

    async def _terminate(self, run: Run) -> None:
        """End the run's process and everything it left in its group; returns once none is left."""
        if run.transport is None:
            return
        pid = run.transport.get_pid()
        if not run.exited.is_set():
            escaped = descendants(pid)
            if self.model.cmd_stop:
                await self._run_cmd_stop(pid)
            else:
                signal_group(pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(run.exited.wait(), timeout=self.model.unload_timeout)
            except TimeoutError:
                log.warning("%s did not exit within %.0f s: SIGKILL", self.id, self.model.unload_timeout)
                signal_group(pid, signal.SIGKILL)
                await run.exited.wait()
            kill_all(escaped)  # strays that left the group
        # Whatever the server spawned and left in its group (after a crash, all of it).
        signal_group(pid, signal.SIGKILL)

    def _environment(self) -> dict[str, str]:
        """The server's environment: the router's, its devices, then the model's `env`; last, the
        reaper's token (`PidFiles.environment`), which no `env` may replace."""
        return {**os.environ, **device_env(self.model, os.environ), **self._extra_env, **dict(self.model.env),
                **self._pid_files.environment}

    async def _run_cmd_stop(self, pid: int) -> None:
        argv = [part.replace("${PID}", str(pid)) for part in self.model.cmd_stop or ()]
        try:
            # In the server's own environment, as llama-swap runs it: a stop script may read its `env`.
            stopper = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=self._environment(),
            )
        except OSError as error:
            log.warning("%s cmdStop failed (%s): sending SIGTERM instead", self.id, error)
            signal_group(pid, signal.SIGTERM)
            return
        try:
            output, _ = await asyncio.wait_for(stopper.communicate(), timeout=self.model.unload_timeout)
        except TimeoutError:
            signal_group(stopper.pid, signal.SIGKILL)
            output = b""
        for line in output.decode(errors="replace").splitlines():
            self._logs.write(self.id, f"[cmdStop] {line}")
