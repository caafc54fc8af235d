"""Sending a level's requests: a fixed number in flight (closed loop) or Poisson arrivals at a rate.

Payloads are ready-made bytes, so the only work between a request's clock starting and
its bytes leaving is the client's own (what `swaplab bench selftest` measures).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from time import perf_counter

from swaplab.client import OpenAIClient, RequestResult

Done = Callable[[RequestResult], None]


def _ignore(result: RequestResult) -> None:
    pass


async def closed_loop(
    client: OpenAIClient, path: str, payloads: Sequence[bytes], concurrency: int, *, on_done: Done = _ignore
) -> list[RequestResult]:
    """Keep `concurrency` requests in flight until all are sent; results in payload order."""
    results: list[RequestResult | None] = [None] * len(payloads)
    indexes = iter(range(len(payloads)))

    async def slot() -> None:
        for index in indexes:  # a shared iterator: each slot takes the next unsent payload
            results[index] = result = await client.send(path, payloads[index])
            on_done(result)

    await asyncio.gather(*(slot() for _ in range(min(concurrency, len(payloads)))))
    return results  # type: ignore[return-value]


def poisson_offsets(rng: random.Random, rate: float, count: int) -> list[float]:
    """Send times (seconds from the start) of `count` Poisson arrivals at `rate` per second; the first at 0."""
    offsets = [0.0]
    for _ in range(count - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    return offsets[:count]


async def open_loop(
    client: OpenAIClient, path: str, payloads: Sequence[bytes], offsets: Sequence[float], *, on_done: Done = _ignore
) -> list[RequestResult]:
    """Send each payload at its offset from now, however many are still in flight; results in payload order."""

    async def one(payload: bytes) -> RequestResult:
        result = await client.send(path, payload)
        on_done(result)
        return result

    start = perf_counter()
    tasks = []
    for payload, offset in zip(payloads, offsets, strict=True):
        delay = start + offset - perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(payload)))
    return list(await asyncio.gather(*tasks))
