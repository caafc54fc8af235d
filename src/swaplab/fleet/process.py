"""One backend process and its small state machine: stopped, starting, ready, stopping.

A `Backend` is driven only by the `Fleet`, which decides *when* to start or stop it;
the backend knows *how*: spawn in its own session with a parent-death signal, drain
its output, wait for real readiness, stop by `cmdStop` or signals, sweep what escaped.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import signal
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
        on_exit: Callable[[Backend, bool], None],
        extra_env: dict[str, str] | None = None,
    ):
        self.model = model
        self.health_check_timeout = health_check_timeout
        self._logs = logs
        self._pid_files = pid_files
        self._http = http
        self._on_exit = on_exit
        self._extra_env = extra_env or {}
        self.state = State.STOPPED
        self.process: asyncio.subprocess.Process | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.start_seconds: float | None = None
        self.last_exit_code: int | None = None
        self.last_error: str = ""
        self.consecutive_failures = 0
        self.backoff_until = 0.0
        self._stop_requested = False
        self._exited: asyncio.Event = asyncio.Event()

    @property
    def id(self) -> str:
        return self.model.id

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process and self.process.returncode is None else None

    def output_tail(self, lines: int = 15) -> str:
        return self._logs.tail(self.id, lines)

    # -- start -----------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Begin starting (the state changes now, synchronously); the task ends when ready or failed."""
        assert self.state is State.STOPPED, f"{self.id}: start while {self.state}"
        self.state = State.STARTING
        self._stop_requested = False
        return asyncio.get_running_loop().create_task(self._start(), name=f"start {self.id}")

    async def _start(self) -> None:
        begun = time.monotonic()
        self.started_at = time.time()
        try:
            await self._spawn()
            await self._wait_ready(begun + self.health_check_timeout)
        except BaseException as error:
            if self._stop_requested and not isinstance(error, asyncio.CancelledError):
                error = BackendStartError(f"model {self.id!r} was stopped while starting")
            self.last_error = str(error)
            if self._stop_requested:
                raise error  # stop() owns the state from here
            if self.process is not None and self.process.returncode is None:
                await self._terminate()
            self.state = State.STOPPED
            self._record_failure()
            raise error
        self.state = State.READY
        self.ready_at = time.time()
        self.start_seconds = time.monotonic() - begun
        log.info("%s ready in %.2f s (pid %s)", self.id, self.start_seconds, self.pid)

    async def _spawn(self) -> None:
        argv = list(self.model.cmd)
        env = {**os.environ, **device_env(self.model, os.environ), **self._extra_env, **dict(self.model.env)}
        self._exited = asyncio.Event()
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
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
        self._pid_files.record(self.id, self.process.pid)
        log.info("%s starting: pid %d", self.id, self.process.pid)
        asyncio.get_running_loop().create_task(self._supervise(self.process), name=f"supervise {self.id}")

    async def _supervise(self, process: asyncio.subprocess.Process) -> None:
        """Drain the output into the log hub until the process exits, then report the exit."""
        assert process.stdout is not None
        while True:
            try:
                raw = await process.stdout.readline()
            except ValueError:  # a line over the stream limit: take what is buffered
                raw = await process.stdout.read(65536)
            if not raw:
                break
            self._logs.write(self.id, raw.decode(errors="replace").rstrip("\r\n"))
        code = await process.wait()
        self.last_exit_code = code
        self._pid_files.remove(self.id)
        self._exited.set()
        expected = self._stop_requested
        if not expected:
            self.last_error = f"exited with code {code}"
            log.warning("%s exited on its own with code %s; its last output:\n%s", self.id, code, self.output_tail(8))
            if self.state is State.READY:
                self.state = State.STOPPED
                self._record_failure()
        # During STARTING, _start notices the exit and reports it; during STOPPING, _stop does.
        self._on_exit(self, expected)

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

    async def _wait_ready(self, deadline: float) -> None:
        check = self.model.check_endpoint
        if check == "none":
            return
        probe = asyncio.ensure_future(self._poll_ready(check))
        exited = asyncio.ensure_future(self._exited.wait())
        try:
            done, _ = await asyncio.wait(
                {probe, exited}, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            probe.cancel()
            exited.cancel()
        if probe in done:
            return
        if exited in done:
            raise BackendStartError(
                f"model {self.id!r} exited with code {self.last_exit_code} while starting; its last output:\n"
                f"{self.output_tail()}"
            )
        raise BackendStartError(
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

    # -- stop ------------------------------------------------------------------

    def stop(self) -> asyncio.Task[None]:
        """Begin stopping (state changes now); the task ends when no process of it is left."""
        self._stop_requested = True
        if self.state is State.STOPPED:
            return asyncio.get_running_loop().create_task(asyncio.sleep(0))
        self.state = State.STOPPING
        return asyncio.get_running_loop().create_task(self._stop(), name=f"stop {self.id}")

    async def _stop(self) -> None:
        try:
            await self._terminate()
        finally:
            self.state = State.STOPPED
            log.info("%s stopped", self.id)

    async def _terminate(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        pid = process.pid
        escaped = descendants(pid)
        if self.model.cmd_stop:
            await self._run_cmd_stop(pid)
        else:
            signal_group(pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self._exited.wait(), timeout=self.model.unload_timeout)
        except asyncio.TimeoutError:
            log.warning("%s did not exit within %.0f s: SIGKILL", self.id, self.model.unload_timeout)
            signal_group(pid, signal.SIGKILL)
            await self._exited.wait()
        # Whatever the server spawned and left behind: its group, then strays that left the group.
        signal_group(pid, signal.SIGKILL)
        kill_all(escaped)

    async def _run_cmd_stop(self, pid: int) -> None:
        argv = [part.replace("${PID}", str(pid)) for part in self.model.cmd_stop or ()]
        try:
            stopper = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
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
