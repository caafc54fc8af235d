"""The reaper kills what a dead router's pid file names only when it is what the file says: a
backend that router started (its token in the process's environment), not any process group a
planted file points at. Real processes, real signals."""

from __future__ import annotations

import json
import logging
import os
import subprocess

import psutil
import pytest
from procs import alive, wait_until

from swaplab.fleet.reaper import PidFiles


@pytest.fixture
def spawn():
    """`spawn(env)`: a `sleep` leading a process group of its own, as a backend does; all killed at the end."""
    started: list[subprocess.Popen] = []

    def start(env: dict[str, str] | None = None) -> subprocess.Popen:
        process = subprocess.Popen(["sleep", "600"], start_new_session=True, env={**os.environ, **(env or {})})
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def plant(folder, process: subprocess.Popen, **changes) -> None:
    """A pid file as another user would write it: the victim's own pid and start time (both readable
    in /proc by anyone), a router that is gone, and a token of the planter's choosing."""
    entry = {"model": "planted", "pid": process.pid, "pgid": process.pid,
             "create_time": psutil.Process(process.pid).create_time(), "router_pid": dead_pid(), "token": "guessed"}
    (folder / "backend-planted.json").write_text(json.dumps({**entry, **changes}))


@pytest.mark.parametrize("changes", [{}, {"create_time": 1.0}], ids=["its-own-start-time", "another-start-time"])
def test_a_planted_pid_file_never_gets_an_unrelated_process_killed(tmp_path, spawn, caplog, changes):
    state = tmp_path / "state"
    PidFiles(state)
    victim = spawn()  # a process of the same user, not a backend
    plant(state, victim, **changes)
    with caplog.at_level(logging.WARNING, logger="swaplab.fleet"):
        reaped = PidFiles(state).reap_leftovers(grace_seconds=2)
    assert reaped == []
    assert alive(victim.pid)
    assert "pid file of planted" in caplog.text  # ignored, with a warning
    assert not (state / "backend-planted.json").exists()


def test_a_backend_its_dead_router_started_is_still_reaped(tmp_path, spawn):
    state = tmp_path / "state"
    first = PidFiles(state)
    backend = spawn(first.environment)
    first.record("a", backend.pid)
    # The next router: another token of its own, the file of the first.
    assert PidFiles(state).reap_leftovers(grace_seconds=2) == ["a"]
    wait_until(lambda: backend.poll() is not None, 10, "the leftover backend to exit")
    assert not (state / "backend-a.json").exists()


def test_a_pid_file_that_is_a_link_is_not_read(tmp_path, spawn, caplog):
    state = tmp_path / "state"
    PidFiles(state)
    victim = spawn()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plant(elsewhere, victim, token="")
    (state / "backend-planted.json").symlink_to(elsewhere / "backend-planted.json")
    with caplog.at_level(logging.WARNING, logger="swaplab.fleet"):
        assert PidFiles(state).reap_leftovers(grace_seconds=2) == []
    assert alive(victim.pid) and (elsewhere / "backend-planted.json").exists()
    assert "ignored and removed" in caplog.text
