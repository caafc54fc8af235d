"""`swaplab serve`: load the config, reap leftovers, serve until SIGTERM/SIGINT, stop every backend.

The composition root: the router's app and the live catalogue meet here, so neither
imports the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import platformdirs
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from swaplab.catalog.live import add_catalog_routes
from swaplab.config import config_sources, load_config_sources, load_default_config
from swaplab.config.model import Config
from swaplab.errors import ConfigError, SwaplabError
from swaplab.fleet import LogHub
from swaplab.fleet.logs import LogLine
from swaplab.router.app import Router
from swaplab.router.door.lane import LANE_ENV, LaneServer, lane_enabled
from swaplab.router.watch.logformat import console_formatter, console_time, log_safe, request_log

log = logging.getLogger("swaplab.router")


class _HubHandler(logging.Handler):
    """Router log records also go to the log hub (`GET /logs`), as source `router`."""

    def __init__(self, hub: LogHub):
        super().__init__()
        self.hub = hub

    def emit(self, record: logging.LogRecord) -> None:
        self.hub.write("router", self.format(record))


def load(config_path: str | None, port: int, notes: str | None = None, config_dir: str | None = None) -> Config:
    """The config to serve (`--config`, `--config-dir`'s files merged after it); `notes`
    (`--notes`) replaces its `notes:` folder."""
    if config_path or config_dir:
        config = load_config_sources(config_path, config_dir)
    else:
        config = load_default_config(port)
    return dataclasses.replace(config, notes=notes) if notes else config


def configure_logging(config: Config, hub: LogHub) -> None:
    """The router's log: to the hub (`GET /logs`) always, to stdout as `logToStdout` says.

    `proxy` (the default) prints the router's own lines, `upstream` the backends' output
    (each line as `[model] text`), `both` both, `none` nothing. The time on the router's
    lines follows `logTimeFormat`. Set once, at start (as llama-swap's).
    """
    numeric = getattr(logging, config.log_level.upper(), logging.INFO)
    to_hub = _HubHandler(hub)
    to_hub.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handlers: list[logging.Handler] = [to_hub]
    if config.log_to_stdout in ("proxy", "both"):
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(console_formatter(config.log_time_format))
        handlers.append(console)
    root = logging.getLogger("swaplab")
    root.handlers[:] = handlers
    root.setLevel(numeric)
    root.propagate = False
    # aiohttp's own lines (a handler's uncaught error, a request its parser refused) go where the router's go.
    server = logging.getLogger("aiohttp.server")
    server.handlers[:] = handlers
    server.filters[:] = [_refused_request_in_one_line]
    server.propagate = False


def _refused_request_in_one_line(record: logging.LogRecord) -> bool:
    """A request aiohttp's parser refuses (answered 400: a line too long, a byte no URL may hold) is the
    client's mistake, logged with a traceback by aiohttp: one line at info says it instead."""
    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, BadHttpMessage):
        return True
    peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
    log.info("refused a malformed request from %s (%d): %s", peer, error.code, log_safe(error.message)[:300])
    return False


def upstream_echo(log_to_stdout: str, log_time_format: str = "") -> Callable[[LogLine], None] | None:
    """What prints the backends' output to stdout (`logToStdout: upstream` or `both`), each line
    after the time the router read it (`logTimeFormat`), or None."""
    if log_to_stdout not in ("upstream", "both"):
        return None

    def echo(line: LogLine) -> None:
        if line.source != "router":  # the router's own lines reach stdout through logging, or not at all
            sys.stdout.write(f"{console_time(log_time_format, line.time)}[{line.source}] {line.text}\n")
            sys.stdout.flush()

    return echo


def default_state_dir(port: int) -> Path:
    # One directory per listening port, so two routers on one machine never reap each other.
    return Path(platformdirs.user_state_dir("swaplab")) / f"router-{port}"


def compose(router: Router) -> web.Application:
    """The router's app, with the catalogue of its config in force, store and notes at `/catalog/`."""
    app = router.app()
    add_catalog_routes(app, lambda: router.config, router.activity.path)
    return app


def serve(
    config_path: str | None,
    host: str,
    port: int,
    state_dir: str | None = None,
    watch_config: bool = False,
    db: str | None = None,
    notes: str | None = None,
    config_dir: str | None = None,
) -> int:
    if notes:
        if not Path(notes).is_dir():
            raise SwaplabError(f"--notes {notes}: no such folder")
        notes = os.path.abspath(notes)
    config = load(config_path, port, notes, config_dir)
    hub = LogHub(echo=upstream_echo(config.log_to_stdout, config.log_time_format))
    configure_logging(config, hub)
    for warning in config.warnings:
        log.warning("%s", warning)
    directory = Path(state_dir) if state_dir else default_state_dir(port)
    # `--db`, else the config's `store.path`, else the default store.
    router = Router(config, state_dir=directory, logs=hub, db=db or config.store_path, listen_host=host)
    reloader = ConfigReloader(router, config_path, port, notes, config_dir)
    factory, loop_name = event_loop()
    use_lane = lane_enabled()  # a bad SWAPLAB_LANE is said before anything starts
    log.info("event loop: %s", loop_name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_serve(router, host, port, reloader, watch_config, use_lane))


EVENT_LOOP_ENV = "SWAPLAB_EVENT_LOOP"
# Requests under way when the router stops get this long to end (their backends are stopped first).
SHUTDOWN_SECONDS = 2.0


def event_loop() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The router's event loop: uvloop's where it is installed (`swaplab[fast]`: libuv's loop relays a
    streamed chunk for less CPU than asyncio's), else asyncio's own; `SWAPLAB_EVENT_LOOP=asyncio` (or
    `uvloop`) chooses. Returns the factory for `asyncio.Runner` (None: asyncio's) and what it is."""
    wanted = os.environ.get(EVENT_LOOP_ENV, "").strip().lower()
    if wanted not in ("", "auto", "asyncio", "uvloop"):
        raise SwaplabError(f"{EVENT_LOOP_ENV}={wanted!r}: say asyncio, uvloop or auto")
    if wanted == "asyncio":
        return None, f"asyncio (as {EVENT_LOOP_ENV} asks)"
    try:
        import uvloop
    except ImportError:
        if wanted == "uvloop":
            raise SwaplabError(f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed: pip install 'swaplab[fast]'") from None
        return None, "asyncio (uvloop is not installed: pip install 'swaplab[fast]' for a faster one)"
    return uvloop.new_event_loop, f"uvloop {uvloop.__version__}"


async def _serve(
    router: Router, host: str, port: int, reloader: ConfigReloader, watch: bool, use_lane: bool = True
) -> int:
    config = router.config
    raise_open_files_limit()
    # `logRequests`: one line per request, from the lane and from aiohttp's server alike.
    request_log_class = request_log(lambda: router.config.security.trusted_proxies)
    runner = web.AppRunner(
        compose(router), handler_cancellation=True, shutdown_timeout=SHUTDOWN_SECONDS,
        # `security.limits.headerTimeout`: from a connection's start (and from the end of each
        # response), the next request's line and headers must arrive within it, or the connection
        # is closed; a request being handled, a long stream included, is never cut. Read at start.
        keepalive_timeout=config.security.limits.header_timeout,
        # `logRequests`: one line per request; without it aiohttp does no access logging at all.
        access_log=log if config.log_requests else None,
        access_log_class=request_log_class,
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    # Model requests on the common path are served by the lane (router/door/lane.py); every other
    # request, and every connection the lane hands over, by aiohttp's server.
    lane = LaneServer(
        router.forwarder.handle_model_request, router.fleet, router.listen_loopback, runner.server,
        router.held_bodies, request_log_class(log, "") if config.log_requests else None,
    ) if use_lane else None
    try:
        server = await loop.create_server(lane or runner.server, host, port, reuse_address=True, backlog=128)
    except OSError as error:
        await runner.cleanup()
        raise SwaplabError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    if lane is not None:
        router.metrics.watch_lane(lambda: (lane.served, lane.handed_over))
    log.info("model requests: %s", "the lane, aiohttp's server for the rest" if lane else
             f"aiohttp's server ({LANE_ENV}=off)")
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reloader.request)
    watcher = loop.create_task(reloader.watch()) if watch and reloader.has_files else None
    settle_heap()
    models = ", ".join(config.models) or "(no local models)"
    started = console_time(config.log_time_format, time.time())
    print(f"{started}swaplab: listening on http://{host}:{port} ({config.path}: {models})", flush=True)
    await stop.wait()
    log.info("stopping every backend, then exiting")
    if watcher is not None:
        watcher.cancel()
    server.close()
    await router.close()
    if lane is not None:
        await lane.shutdown(SHUTDOWN_SECONDS)
    await runner.cleanup()
    return 0


def settle_heap() -> None:
    """What the router holds from its start (its modules, the config, the app) is moved out of
    the cyclic collector's way (`gc.freeze`): it lives as long as the process, and a full
    collection that walked it every time held the loop for up to 30 ms, in the middle of a
    burst of requests. Called again after a reload, so an old config's cycles are freed first."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def raise_open_files_limit() -> None:
    """The soft limit on open files raised to the hard one (as Go does for llama-swap): each client
    and each upstream connection is a file, and 1024 is soon reached by a crowd of stalled ones."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as error:
        log.debug("open files limit kept: %s", error)


class ConfigReloader:
    """SIGHUP and `--watch-config`: load every source again (`--config`, and `--config-dir` listed
    anew, so a file added or removed counts); a broken config is refused and the old stays."""

    WATCH_INTERVAL = 1.0

    def __init__(
        self, router: Router, config_path: str | None, port: int, notes: str | None = None,
        config_dir: str | None = None,
    ):
        self.router = router
        self.config_path = config_path
        self.config_dir = config_dir
        self.port = port
        self.notes = notes
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> bool:
        async with self._lock:  # one reload at a time, in the order asked
            try:
                new = await asyncio.to_thread(load, self.config_path, self.port, self.notes, self.config_dir)
            except ConfigError as error:
                log.error("config reload refused; the config in force stays:\n%s", error)
                return False
            except SwaplabError as error:
                log.error("config reload refused (%s); the config in force stays", error)
                return False
            for warning in new.warnings:
                log.warning("%s", warning)
            await self.router.reload(new)
            settle_heap()
            return True

    @property
    def has_files(self) -> bool:
        """Whether the config comes from files (not the built-in one)."""
        return bool(self.config_path or self.config_dir)

    def _fingerprint(self) -> bytes | None:
        """One digest of every source file's name and content; None while one cannot be read."""
        digest = hashlib.sha256()
        try:
            for file in config_sources(self.config_path, self.config_dir):
                digest.update(file.encode() + b"\0" + hashlib.sha256(Path(file).read_bytes()).digest())
        except (OSError, SwaplabError):
            return None
        return digest.digest()

    async def watch(self) -> None:
        """Poll the files (they may live on NFS, where change notification is unreliable)."""
        seen = self._fingerprint()
        while True:
            await asyncio.sleep(self.WATCH_INTERVAL)
            current = self._fingerprint()
            if current is not None and current != seen:
                seen = current
                log.info("%s changed: reloading", self.config_path or self.config_dir)
                await self.reload()
