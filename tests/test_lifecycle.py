"""One owner per backend lifecycle: a stop, an unload or a reload at any point of a start.

The fleet runs in the test's own event loop, so a stop can be placed at an exact point of
a start: before the spawn, while the process is being spawned, while it is health-checked.
The backends are real `swaplab sim` processes and every check of what runs asks the OS.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import psutil
import pytest

from fleets import opened_fleets
from procs import SIM, free_port_block
from swaplab.config.loader import load_config_text
from swaplab.errors import BackendStartError
from swaplab.fleet import LogHub, State


def processes_of(marker: str) -> list[int]:
    """Live processes (zombies don't count) whose command line carries `marker`."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(process.info["cmdline"] or ()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def config_text(marker: str, port: int, load_seconds: float = 0, entry: str = "first") -> str:
    """One model whose every process carries `marker` (and `entry`, to tell config entries apart)."""
    return f"""
startPort: {port}
healthCheckTimeout: 60
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model {marker}-{entry} --load-seconds {load_seconds}
"""


@pytest.fixture
async def fleet_of(tmp_path: Path):
    """`fleet_of(text)`: an opened fleet on that config text; all closed at the end."""
    async with opened_fleets(tmp_path) as make:
        yield lambda text: make(load_config_text(text, "test.yaml"))


async def step_until(predicate, limit: int = 100_000) -> None:
    """Let the loop run one callback round at a time until `predicate()` holds."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)  # one round of the loop, then look again: the step is the unit here, not time
    raise AssertionError("the loop never reached the state waited for")


async def output_line(logs: LogHub, source: str, text: str, timeout: float = 60.0) -> None:
    """Until a line of `source`'s output holding `text` has reached the log hub."""
    queue = logs.subscribe()
    try:
        if any(text in line.text for line in logs.recent(source)):
            return
        async with asyncio.timeout(timeout):
            while not ((line := await queue.get()).source == source and text in line.text):
                pass
    finally:
        logs.unsubscribe(queue)


# How far into a start the stop comes, in rounds of the event loop after the request
# that starts it: 0 is before the spawn, the next few are inside `subprocess_exec`
# (the child exists, its pipes are being connected), later ones are health checks.
STEPS = [0, 1, 2, 3, 4, 6, 10, 20]


@pytest.mark.parametrize("steps", STEPS)
async def test_unload_at_any_point_of_a_start_leaves_no_process(fleet_of, steps):
    marker = f"life-{uuid.uuid4().hex[:8]}"
    fleet = await fleet_of(config_text(marker, free_port_block(), load_seconds=30))
    request = asyncio.ensure_future(fleet.acquire("a"))
    await asyncio.sleep(0)  # one round: the request has asked for the start
    assert fleet.state_of("a") is State.STARTING
    for _ in range(steps):
        await asyncio.sleep(0)  # the point of the start the stop lands on, counted in rounds of the loop
    await fleet.unload("a")
    # The request that started it hears why it failed, once nothing is left of it.
    with pytest.raises(BackendStartError, match="unloaded"):
        await request
    assert fleet.state_of("a") is State.STOPPED
    assert processes_of(marker) == []
    # And nothing turns up later: no start carried on behind the stop's back. Not an
    # ordering: nothing is due to happen, this is the time a stray start gets to show.
    await asyncio.sleep(0.5)
    assert processes_of(marker) == [] and fleet.state_of("a") is State.STOPPED


async def test_unload_while_spawning_leaves_no_process(fleet_of):
    """The stop lands after the child exists but before the fleet has its handle on it."""
    marker = f"spawn-{uuid.uuid4().hex[:8]}"
    fleet = await fleet_of(config_text(marker, free_port_block(), load_seconds=30))
    request = asyncio.ensure_future(fleet.acquire("a"))
    await asyncio.sleep(0)  # one round: the request has asked for the start
    backend = fleet.backend("a")
    assert backend is not None and backend.run is not None
    await step_until(lambda: processes_of(marker))
    assert backend.pid is None or backend.state is State.STARTING
    await fleet.unload("a")
    with pytest.raises(BackendStartError):
        await request
    assert processes_of(marker) == [] and fleet.state_of("a") is State.STOPPED


async def test_unload_during_health_checks_leaves_no_process(fleet_of):
    marker = f"health-{uuid.uuid4().hex[:8]}"
    fleet = await fleet_of(config_text(marker, free_port_block(), load_seconds=30))
    request = asyncio.ensure_future(fleet.acquire("a"))
    await asyncio.sleep(0)  # one round: the request has asked for the start
    backend = fleet.backend("a")
    await step_until(lambda: backend.pid is not None)
    # The server listens and answers 503 while it loads: the health check is polling it.
    await output_line(fleet.logs, "a", "listening on")
    assert backend.state is State.STARTING and processes_of(marker) == [backend.pid]
    await fleet.unload("a")
    with pytest.raises(BackendStartError, match="unloaded"):
        await request
    assert processes_of(marker) == [] and fleet.state_of("a") is State.STOPPED


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5, 10, "health"])
async def test_reload_at_any_point_of_a_start_ends_with_the_new_entry_alone(fleet_of, steps):
    marker = f"reload-{uuid.uuid4().hex[:8]}"
    port = free_port_block()
    fleet = await fleet_of(config_text(marker, port, load_seconds=30, entry="old"))
    request = asyncio.ensure_future(fleet.acquire("a"))
    await asyncio.sleep(0)  # one round: the request has asked for the start
    if steps == "health":
        backend = fleet.backend("a")
        await step_until(lambda: backend.pid is not None)
        await output_line(fleet.logs, "a", "listening on")  # the health check is polling it while it loads
    else:
        for _ in range(steps):
            await asyncio.sleep(0)  # the point of the start the reload lands on, counted in rounds of the loop
    new = load_config_text(config_text(marker, port, load_seconds=0, entry="new"), "test.yaml")
    await fleet.reconfigure(new, ["a"])
    # The queued request is served by the new entry's server, and only that one runs.
    lease = await asyncio.wait_for(request, 60)
    try:
        assert lease.model.cmd == new.models["a"].cmd
        assert processes_of(f"{marker}-old") == []
        assert processes_of(f"{marker}-new") == [lease.backend.pid]
    finally:
        fleet.release(lease, succeeded=True)


async def test_a_stop_never_lets_a_second_server_start_on_the_same_port(fleet_of):
    """Unload during spawn, then a queued request: exactly one server afterwards, never two."""
    marker = f"twice-{uuid.uuid4().hex[:8]}"
    fleet = await fleet_of(config_text(marker, free_port_block(), load_seconds=0))
    first = asyncio.ensure_future(fleet.acquire("a"))
    # Two rounds of the loop: the start is spawning its process when the unload comes.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    unloading = asyncio.ensure_future(fleet.unload("a"))
    second = asyncio.ensure_future(fleet.acquire("a"))
    await unloading
    with pytest.raises(BackendStartError):
        await first
    lease = await asyncio.wait_for(second, 60)
    try:
        assert processes_of(marker) == [lease.backend.pid]
    finally:
        fleet.release(lease, succeeded=True)


async def test_cmd_stop_runs_in_the_models_environment(fleet_of, tmp_path):
    """As llama-swap runs it: a stop script sees the model's `env` (a container name, a socket)."""
    marker = f"stopenv-{uuid.uuid4().hex[:8]}"
    seen = tmp_path / "seen"
    fleet = await fleet_of(f"""
startPort: {free_port_block()}
healthCheckTimeout: 60
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model {marker}
    env: ["STOP_MARK={marker}"]
    cmdStop: sh -c 'echo "$STOP_MARK" > {seen}; kill ${{PID}}'
""")
    lease = await asyncio.wait_for(fleet.acquire("a"), 60)
    fleet.release(lease, succeeded=True)
    await fleet.unload("a")
    assert seen.read_text().strip() == marker
    assert processes_of(marker) == []


def test_log_lines_written_from_another_thread_reach_subscribers_on_the_loop():
    """The activity writer logs from its own thread; asyncio queues must only be touched on their loop."""

    async def scenario() -> tuple[str, list[BaseException]]:
        hub = LogHub()
        hub.write("router", "from the loop")  # the hub now belongs to this loop
        queue = hub.subscribe()
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                hub.write("router", "from a thread")
            except BaseException as error:  # a debug loop refuses a call from the wrong thread
                errors.append(error)

        getting = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0)  # the reader now waits on the queue
        thread = threading.Thread(target=writer)
        thread.start()
        await asyncio.to_thread(thread.join)
        line = await asyncio.wait_for(getting, 5)
        return line.text, errors

    outcome: list = []
    # A loop that is never woken cannot even be torn down: run it where it can be abandoned.
    runner = threading.Thread(target=lambda: outcome.append(asyncio.run(scenario(), debug=True)), daemon=True)
    runner.start()
    runner.join(30)
    assert outcome, "the line written from another thread never reached the subscriber (its loop was never woken)"
    text, errors = outcome[0]
    assert errors == []
    assert text == "from a thread"
