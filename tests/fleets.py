"""Fleets opened directly (no router) for tests of the fleet's own decisions: all closed at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from swaplab.config.model import Config
from swaplab.fleet import Fleet, LogHub


@asynccontextmanager
async def opened_fleets(state_root: Path) -> AsyncIterator[Callable[[Config], Awaitable[Fleet]]]:
    """`make(config)` opens a fleet on that config, each with its own state folder under
    `state_root`; every fleet made is closed when the block ends."""
    fleets: list[Fleet] = []

    async def make(config: Config) -> Fleet:
        fleet = Fleet(config, state_dir=state_root / f"state{len(fleets)}", logs=LogHub())
        await fleet.open()
        fleets.append(fleet)
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            await fleet.close()
