"""Real processes for the tests: swaplab's own CLI (router, sim) started on free loopback ports,
and the waits for what they do."""

from __future__ import annotations

import asyncio
import inspect
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil

PYTHON = shlex.quote(sys.executable)
SIM = f"{PYTHON} -m swaplab sim"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_block(size: int = 10) -> int:
    """The first of `size` consecutive free loopback ports, for a config's `startPort`."""
    import random

    for _ in range(200):
        # Below Linux's ephemeral range (32768 and up by default), where outgoing
        # connections take their local ports and could take ours between check and use.
        base = random.randrange(20000, 32000 - size)
        sockets = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no block of free ports found")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def wait_until(predicate, timeout: float, what: str, interval: float = 0.02):
    """Poll `predicate` until it returns a truthy value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)  # the poll's pace, not an ordering: the condition decides, the deadline bounds it


async def eventually(check, timeout: float, what: str | Callable[[], str], interval: float = 0.01):
    """`wait_until` for a test on an event loop: await `check()` (a plain or a coroutine function)
    until it returns a truthy value, and return that; fail after `timeout` seconds saying `what`
    was waited for (a function is called then, so it can tell what was last seen)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        await asyncio.sleep(interval)  # the poll's pace, not an ordering: the condition decides, the deadline bounds it


class SwaplabProcess:
    """`python -m swaplab ARGS` as a child with its output in a file; stopped on close."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None):
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "swaplab", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=cwd,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_http(self, url: str, timeout: float = 60.0) -> None:
        def up() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"swaplab {self.args} exited with {self.popen.returncode}:\n{self.output()}")
            return http_status(url) == 200

        wait_until(up, timeout, f"{url} to answer 200")

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        return self.popen.wait(timeout)

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


class Router(SwaplabProcess):
    """`swaplab serve` on a free port with its own state directory."""

    def __init__(
        self, config: Path | None, workdir: Path, *extra: str, port: int | None = None, env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        # The built-in default gives its three backends this port + 1, + 2 and + 3: keep all four free.
        self.port = port or (free_port_block(4) if config is None else free_port())
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = workdir / "state"
        self.db = workdir / "swaplab.db"
        # Saved KV caches (kvCache, on for the built-in models) stay in the test's folder, never the user's.
        self.kv_cache_dir = workdir / "kvcache"
        env = {"SWAPLAB_KVCACHE_DIR": str(self.kv_cache_dir), **(env or {})}
        args = [
            "serve", "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(self.state_dir),
            "--db", str(self.db), *extra,
        ]
        if config is not None:
            args += ["--config", str(config)]
        super().__init__(args, workdir / f"router-{self.port}.log", env, cwd=cwd)
        self.wait_http(f"{self.url}/health")


def alive(pid: int) -> bool:
    """True while `pid` is a live process (a zombie awaiting its parent counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Sim(SwaplabProcess):
    """`swaplab sim` on a free port; `extra` are its options (`--ttft-ms 100`, ...)."""

    def __init__(self, workdir: Path, *extra: str, model: str = "sim-model", env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # In its own folder: an engine that keeps files where it runs (TabbyAPI's api_tokens.yml) keeps them there.
        folder = workdir / f"sim-{self.port}"
        folder.mkdir()
        super().__init__(["sim", "--port", str(self.port), "--model", model, *extra], workdir / f"sim-{self.port}.log",
                         env=env, cwd=folder)
        self.folder = folder
        self.wait_http(f"{self.url}/sim/stats")


def run_swaplab(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m swaplab ARGS` to completion, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "swaplab", *args],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
