"""One backend process and its small state machine: stopped, starting, ready, stopping.

A `Backend` is driven only by the `Fleet`, which decides *when* to start or stop it;
the backend knows *how*: spawn in its own session with a parent-death signal, drain
its output, wait for real readiness, stop by `cmdStop` or signals, sweep what escaped.

Every start begins one lifecycle task (`_live`) that owns the process from spawn to
exit: it alone moves the state on. `stop()` only records the request (and shows the
state as stopping at once, so nobody admits work to a backend on its way out); the
lifecycle task looks at that request after every await, so a stop that arrives while
the process is being spawned or health-checked ends with no process, never with one
that nobody owns.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping

import aiohttp

from swaplab.config.model import ModelConfig
from swaplab.errors import BackendStartError
from swaplab.fleet.logs import LogHub
from swaplab.fleet.reaper import PidFiles, descendants, die_with_parent, kill_all, signal_group

log = logging.getLogger("swaplab.fleet")

READY_POLL_FIRST = 0.02
READY_POLL_MAX = 0.25
GENERATE_ATTEMPT_TIMEOUT = 30.0
# A line of output longer than this is logged in pieces.
OUTPUT_LINE_LIMIT = 64 * 1024
# The process's last lines may still be in the pipe when its exit is reported: wait this
# long for the pipe's end before quoting them (a child that inherited it may hold it open).
OUTPUT_SETTLE_SECONDS = 0.5


def device_env(model: ModelConfig, inherited: Mapping[str, str]) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` from the model's `devices`, unless its `env` sets it.

    Device ids are NVML's (`nvidia-smi`'s) indexes, in PCI bus order; CUDA numbers
    devices fastest first unless told otherwise, which on a mixed box names another
    GPU. So `CUDA_DEVICE_ORDER=PCI_BUS_ID` comes along, unless already set.
    """
    own = {name for name, _ in model.env}
    if not model.devices or "CUDA_VISIBLE_DEVICES" in own:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in model.devices)}
    if "CUDA_DEVICE_ORDER" not in own and "CUDA_DEVICE_ORDER" not in inherited:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


class State(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


class Run:
    """One start of a backend: its process, from spawn to exit. A backend has at most one at a time."""

    def __init__(self, number: int, loop: asyncio.AbstractEventLoop):
        self.number = number
        self.begun = time.monotonic()
        self.transport: asyncio.SubprocessTransport | None = None
        self.exited = asyncio.Event()
        """Set as soon as the server's own process has exited (whoever still holds its output)."""
        self.exit_code: int | None = None
        self.output_closed = asyncio.Event()
        self.stop_wanted = asyncio.Event()
        self.stop_reason = ""
        self.crashed = False
        """The process exited on its own (nobody had asked it to stop)."""
        self.ready: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        """Done once no process of this run is left and the backend is stopped."""

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self.transport.get_pid() if self.transport is not None and not self.exited.is_set() else None


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
    ):
        self.model = model
        self.health_check_timeout = health_check_timeout
        self._logs = logs
        self._pid_files = pid_files
        self._http = http
        self._on_change = on_change
        self._extra_env = extra_env or {}
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

    @property
    def id(self) -> str:
        return self.model.id

    @property
    def pid(self) -> int | None:
        return self.run.pid if self.run is not None else None

    def output_tail(self, lines: int = 15) -> str:
        return self._logs.tail(self.id, lines)

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
        self.state = State.STARTING
        loop.create_task(self._live(run), name=f"run {self.id} #{run.number}")
        return run

    def stop(self, reason: str = "stopped") -> asyncio.Future[None]:
        """Ask the current run to end; the future is done when no process of it is left.

        The state shows `stopping` at once; the run's own task does the stopping.
        """
        run = self.run
        if run is None:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        if not run.stop_wanted.is_set():
            run.stop_reason = reason
            run.stop_wanted.set()
            if self.state in (State.STARTING, State.READY):
                self._set(State.STOPPING)
        return asyncio.shield(run.ended)

    # -- the run, start to end -------------------------------------------------------

    async def _live(self, run: Run) -> None:
        begun = run.begun
        self.started_at = time.time()
        outcome: BaseException | None = None
        try:
            failure = await self._bring_up(run, begun + self.health_check_timeout)
            if failure is None and not run.stop_wanted.is_set():
                self.start_seconds = time.monotonic() - begun
                self.ready_at = time.time()
                run.ready.set_result(None)
                self._set(State.READY)
                log.info("%s ready in %.2f s (pid %s)", self.id, self.start_seconds, run.pid)
                await _first_of(run.stop_wanted.wait(), run.exited.wait())
                if not run.stop_wanted.is_set():
                    await self._crashed(run)
            elif failure is not None and not run.stop_wanted.is_set():
                self.last_error = str(failure)
                self._record_failure()
                outcome = failure
            else:
                outcome = BackendStartError(f"model {self.id!r} was stopped while starting ({run.stop_reason})")
            if self.state is not State.STOPPING:
                self._set(State.STOPPING)
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

    async def _crashed(self, run: Run) -> None:
        # Shown as stopping at once, before any await: no request may be admitted to a dead port.
        self.last_error = f"exited with code {run.exit_code}"
        self._record_failure()
        self._set(State.STOPPING)
        await _settle(run)
        log.warning("%s exited on its own with code %s; its last output:\n%s", self.id, run.exit_code, self.output_tail(8))

    async def _spawn(self, run: Run) -> None:
        argv = list(self.model.cmd)
        if not argv:  # the config loads such a model, as llama-swap's does; only starting it fails
            raise BackendStartError(
                f"model {self.id!r} has no cmd: it cannot be started (give it a cmd in the config)"
            )
        env = self._environment()
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: _Output(self.id, self._logs, run),
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

    async def _wait_ready(self, run: Run, deadline: float) -> BackendStartError | None:
        check = self.model.check_endpoint
        if check == "none":
            return None
        probe = asyncio.ensure_future(self._poll_ready(check))
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
            await _settle(run)
            return BackendStartError(
                f"model {self.id!r} exited with code {run.exit_code} while starting; its last output:\n"
                f"{self.output_tail()}"
            )
        return BackendStartError(
            f"model {self.id!r} not ready after {self.health_check_timeout:.0f} s "
            f"(checkEndpoint {check!r}; raise healthCheckTimeout if it loads slowly); its last output:\n"
            f"{self.output_tail()}"
        )

    async def _poll_ready(self, check: str) -> None:
        interval = READY_POLL_FIRST
        while True:
            if await self._ready_once(check):
                return
            await asyncio.sleep(interval)
            interval = min(interval * 2, READY_POLL_MAX)

    async def _ready_once(self, check: str) -> bool:
        base = self.model.proxy.rstrip("/")
        try:
            if check == "generate":
                # /health can say 200 minutes before the server can serve (the seed's
                # SGLang): only a real one-token completion proves readiness.
                body = {"model": self.model.use_model_name or self.id, "prompt": "Hi", "max_tokens": 1}
                timeout = aiohttp.ClientTimeout(total=GENERATE_ATTEMPT_TIMEOUT)
                async with self._http.post(f"{base}/v1/completions", json=body, timeout=timeout) as response:
                    if response.status != 200:
                        return False
                    payload = await response.json(content_type=None)
                    return bool(payload.get("choices"))
            timeout = aiohttp.ClientTimeout(total=5)
            async with self._http.get(f"{base}{check}", timeout=timeout) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False

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
            except asyncio.TimeoutError:
                log.warning("%s did not exit within %.0f s: SIGKILL", self.id, self.model.unload_timeout)
                signal_group(pid, signal.SIGKILL)
                await run.exited.wait()
            kill_all(escaped)  # strays that left the group
        # Whatever the server spawned and left in its group (after a crash, all of it).
        signal_group(pid, signal.SIGKILL)

    def _environment(self) -> dict[str, str]:
        """The server's environment: the router's, its devices, then the model's `env`."""
        return {**os.environ, **device_env(self.model, os.environ), **self._extra_env, **dict(self.model.env)}

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
        except asyncio.TimeoutError:
            signal_group(stopper.pid, signal.SIGKILL)
            output = b""
        for line in output.decode(errors="replace").splitlines():
            self._logs.write(self.id, f"[cmdStop] {line}")


class _Output(asyncio.SubprocessProtocol):
    """The server's output, line by line into the log hub, and the moment its process exits.

    The exit is noted when the process itself ends, not when its output pipe closes: a
    server's workers inherit that pipe and may outlive it.
    """

    def __init__(self, source: str, logs: LogHub, run: Run):
        self._source = source
        self._logs = logs
        self._run = run
        self._transport: asyncio.SubprocessTransport | None = None
        self._partial = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        buffer = self._partial
        buffer += data
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            self._write(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if len(buffer) > OUTPUT_LINE_LIMIT:
            self._write(buffer)
            buffer.clear()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if self._partial:
            self._write(self._partial)
            self._partial.clear()
        self._run.output_closed.set()

    def process_exited(self) -> None:
        assert self._transport is not None
        run = self._run
        run.exit_code = self._transport.get_returncode()
        run.crashed = not run.stop_wanted.is_set()
        run.exited.set()

    def _write(self, line: bytes | bytearray) -> None:
        self._logs.write(self._source, bytes(line).decode(errors="replace").rstrip("\r"))


async def _settle(run: Run) -> None:
    """Give the pipe a moment to deliver the exited process's last lines."""
    try:
        await asyncio.wait_for(run.output_closed.wait(), OUTPUT_SETTLE_SECONDS)
    except asyncio.TimeoutError:
        pass


async def _first_of(*awaitables) -> None:
    """Return as soon as one of `awaitables` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
