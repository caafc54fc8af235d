"""`swaplab sim` as a process: the engine's startup lines replayed, the port bound, served until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal

from aiohttp import web

from swaplab.errors import SwaplabError
from swaplab.sim.server import Sim
from swaplab.sim.settings import SimSettings

# On SIGTERM, streams in flight get this long before they are cut.
SHUTDOWN_GRACE_SECONDS = 0.1


async def _replay_startup(settings: SimSettings, stop: asyncio.Event) -> bool:
    """Print the engine's startup lines at their pace; True when a stop came meanwhile."""
    lines = settings.startup_lines
    pause = settings.startup_seconds / len(lines) if lines else 0.0
    for line in lines:
        print(line, flush=True)
        try:
            await asyncio.wait_for(stop.wait(), pause)
            return True
        except TimeoutError:
            pass
    return False


def run(settings: SimSettings) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit code."""
    return asyncio.run(_serve(settings))


async def _serve(settings: SimSettings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    if await _replay_startup(settings, stop):
        return 0
    sim = Sim(settings)  # the load clock starts now, before the port is bound
    runner = web.AppRunner(
        sim.app(), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_SECONDS
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        try:
            await site.start()
        except OSError as error:
            raise SwaplabError(
                f"sim cannot listen on {settings.host}:{settings.port} "
                f"({os.strerror(error.errno) if error.errno else error}); choose another --port or --host"
            ) from None
        host, port = runner.addresses[0][:2]
        shown_host = f"[{host}]" if ":" in host else host
        print(f"sim: model {settings.model} listening on http://{shown_host}:{port}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0
