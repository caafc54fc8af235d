"""The router's and the sim's HTTP as the async tests speak it: a chat, `/running`, `/sim/stats`, and waits on them."""

from __future__ import annotations

import aiohttp
from procs import eventually


async def chat(session: aiohttp.ClientSession, url: str, model: str, **body) -> tuple[int, dict]:
    payload = {"model": model, "messages": [{"role": "user", "content": "hello there"}], **body}
    async with session.post(f"{url}/v1/chat/completions", json=payload) as response:
        return response.status, await response.json(content_type=None)


async def running(session: aiohttp.ClientSession, url: str) -> dict[str, dict]:
    async with session.get(f"{url}/running") as response:
        return {entry["model"]: entry for entry in (await response.json())["running"]}


async def sim_stats(session: aiohttp.ClientSession, proxy: str) -> dict:
    async with session.get(f"{proxy}/sim/stats") as response:
        return await response.json()


async def wait_for_state(session: aiohttp.ClientSession, url: str, model: str, state: str, timeout: float = 10.0) -> None:
    """Until `/running` shows `model` in `state` (a model it does not list is stopped)."""

    async def reached() -> bool:
        return (await running(session, url)).get(model, {}).get("state", "stopped") == state

    await eventually(reached, timeout, f"{model} to reach {state}")


async def wait_for_stats(session: aiohttp.ClientSession, proxy: str, predicate, timeout: float = 10.0) -> dict:
    """Until the sim at `proxy` reports stats for which `predicate` holds; returns them."""
    seen: list[dict] = [{}]

    async def matching() -> dict | None:
        seen[0] = await sim_stats(session, proxy)
        return seen[0] if predicate(seen[0]) else None

    return await eventually(matching, timeout, lambda: f"sim stats to match, last {seen[0]}")
