"""Fixtures shared by the end-to-end tests: real routers on free loopback ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from procs import Router, Sim, free_port_block


def write_config(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    """Write a test config; unless it sets `startPort`, its backends get a block of free ports,
    so test runs side by side (or a router left on 5800) never collide."""
    if "startPort" not in text:
        text = f"startPort: {free_port_block()}\n" + text
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def router_factory(tmp_path):
    """Start `swaplab serve` on a config text (None = the built-in default); all stopped at the end."""
    started: list[Router] = []

    def start(config_text: str | None, *extra: str, workdir: Path | None = None, **kwargs) -> Router:
        directory = workdir or tmp_path
        config = write_config(directory, config_text) if config_text is not None else None
        router = Router(config, directory, *extra, **kwargs)
        started.append(router)
        return router

    yield start
    for router in started:
        router.close()


@pytest.fixture
def scripted(tmp_path):
    """`scripted(script)` starts a `swaplab sim --script` replaying that plain-data script; all stop at the end."""
    from scripts import ScriptedSims

    sims = ScriptedSims(tmp_path)
    yield sims
    sims.close()


@pytest.fixture
def start_sim(tmp_path):
    """`start_sim(*flags)` starts a `swaplab sim` (tests/procs.py `Sim`) with those flags; all stop at the end."""
    started: list[Sim] = []

    def start(*extra: str, env: dict[str, str] | None = None, model: str = "sim-model") -> Sim:
        sim = Sim(tmp_path, *extra, env=env, model=model)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.close()
