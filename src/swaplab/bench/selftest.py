"""How much the client itself adds: against `swaplab sim`, whose TTFT and token rate are fixed.

The sim runs as its own process (so it never shares an event loop with the client)
and streams N answers at once. The same streams are read by a minimal aiohttp reader
(the floor: no parsing at all, first body byte = first token, since the sim sends its
role prelude together with the first token) and by `OpenAIClient`, in alternating
rounds so drift on a shared machine hits both alike.

All streams start in the same instant, the harshest case for TTFT: their first tokens
arrive together and each waits for the ones read before it, as at the start of every
level of a closed-loop sweep. `client_overhead_ms` is the client's TTFT p50 minus the
raw reader's, the median over pairs of rounds run back to back: what the client adds
on top of the transport. The distance of both from the sim's configured TTFT (the
sim's own handling of the burst, the loopback trip) is reported too.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import aiohttp

from swaplab.client import OpenAIClient, RequestResult
from swaplab.errors import SwaplabError
from swaplab.results.stats import distribution

SIM_MODEL = "selftest"
LISTENING = re.compile(rb"listening on (http://\S+)")
SIM_START_SECONDS = 30.0
PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class SelftestSettings:
    streams: int = 64
    ttft_ms: float = 50.0
    tokens_per_second: float = 50.0  # per stream
    output_tokens: int = 64
    rounds: int = 5  # pairs of rounds, one of each reader, which goes first alternating
    # Stream i starts i/streams of this after the first, so first tokens don't all land in
    # the same instant (as in a closed loop's steady state); 0 starts them all at once.
    spread_ms: float = 20.0


@dataclass
class ReaderFigures:
    """One reader's measurements over all its rounds."""

    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)  # (last - first) / (tokens - 1), per stream
    aggregate_tokens_per_second: list[float] = field(default_factory=list)  # per round: all tokens / round wall time
    round_ttft_p50: list[float] = field(default_factory=list)
    failed: int = 0

    def add_round(self, ttft_ms: list[float]) -> None:
        self.ttft_ms += ttft_ms
        if ttft_ms:
            self.round_ttft_p50.append(distribution(ttft_ms)["p50"])


@dataclass
class SelftestReport:
    settings: SelftestSettings
    raw: ReaderFigures
    client: ReaderFigures

    @property
    def ideal_tpot_ms(self) -> float:
        return 1000 / self.settings.tokens_per_second

    @property
    def ideal_aggregate_tokens_per_second(self) -> float:
        """All streams' tokens over the time one stream needs on the sim's schedule."""
        settings = self.settings
        one_stream = settings.ttft_ms / 1000 + (settings.output_tokens - 1) / settings.tokens_per_second
        return settings.streams * settings.output_tokens / (one_stream + settings.spread_ms / 1000)

    def summary(self) -> dict[str, Any]:
        """The figures `bench selftest` reports and stores; `client_overhead_ms` is the one every report carries."""
        settings = self.settings
        raw_ttft = distribution(self.raw.ttft_ms)
        client_ttft = distribution(self.client.ttft_ms)
        client_tpot = distribution(self.client.tpot_ms)
        raw_tpot = distribution(self.raw.tpot_ms)
        client_rate = _median(self.client.aggregate_tokens_per_second)
        raw_rate = _median(self.raw.aggregate_tokens_per_second)
        # Round to round, the sim's own handling of a 64-request burst moves TTFT by more
        # than the client costs; each pair of rounds ran back to back, so compare within pairs.
        overhead = _median([ours - raw for raw, ours in zip(self.raw.round_ttft_p50, self.client.round_ttft_p50)])
        return {
            "client_overhead_ms": overhead,
            "client_over_configured_ms": client_ttft["p50"] - settings.ttft_ms,
            "raw_over_configured_ms": raw_ttft["p50"] - settings.ttft_ms,
            "streams": settings.streams,
            "sim_ttft_ms": settings.ttft_ms,
            "sim_tokens_per_second": settings.tokens_per_second,
            "raw_ttft_ms": raw_ttft,
            "client_ttft_ms": client_ttft,
            "raw_tpot_ms": raw_tpot,
            "client_tpot_ms": client_tpot,
            "ideal_tpot_ms": self.ideal_tpot_ms,
            "raw_stream_rate_ratio": self.ideal_tpot_ms / raw_tpot["p50"],
            "client_stream_rate_ratio": self.ideal_tpot_ms / client_tpot["p50"],  # 1.0: the sim's full rate per stream
            "raw_aggregate_tokens_per_second": raw_rate,
            "client_aggregate_tokens_per_second": client_rate,
            "ideal_aggregate_tokens_per_second": self.ideal_aggregate_tokens_per_second,
            "raw_aggregate_ratio": raw_rate / self.ideal_aggregate_tokens_per_second,
            "client_aggregate_ratio": client_rate / self.ideal_aggregate_tokens_per_second,
            "failed": self.raw.failed + self.client.failed,
            "headline": f"client adds {overhead:.2f} ms to TTFT p50 at {settings.streams} streams, "
            f"{self.ideal_tpot_ms / client_tpot['p50']:.1%} of the sim's token rate",
        }


async def start_sim(settings: SelftestSettings) -> tuple[asyncio.subprocess.Process, str]:
    """`swaplab sim` on a free port with the selftest's timing; returns it and its URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "swaplab", "sim", "--port", "0", "--model", SIM_MODEL,
        "--ttft-ms", str(settings.ttft_ms), "--tokens-per-second", str(settings.tokens_per_second),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        line = await asyncio.wait_for(process.stdout.readline(), SIM_START_SECONDS)
    except TimeoutError:
        line = b""
    match = LISTENING.search(line)
    if match is None:
        await stop_sim(process)
        raise SwaplabError(f"selftest: `swaplab sim` did not start: {line.decode(errors='replace').strip() or 'no output'}")
    return process, match.group(1).decode()


async def stop_sim(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


def request_payload(settings: SelftestSettings) -> bytes:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "selftest"}], "max_tokens": settings.output_tokens}
    return OpenAIClient.encode(body)


async def _spread(settings: SelftestSettings, index: int, start):
    if settings.spread_ms and index:
        await asyncio.sleep(settings.spread_ms / 1000 * index / settings.streams)
    return await start()


async def raw_round(session: aiohttp.ClientSession, url: str, settings: SelftestSettings, figures: ReaderFigures) -> None:
    """The floor: post, note the first and last body bytes, parse nothing."""
    payload = request_payload(settings)

    async def one() -> tuple[float, float, float] | None:
        sent = perf_counter()
        first = last = 0.0
        async with session.post(url + PATH, data=payload, headers={"Content-Type": "application/json"}) as response:
            async for _ in response.content.iter_any():
                last = perf_counter()
                if not first:
                    first = last
        return (sent, first, last) if response.status == 200 and first else None

    started = perf_counter()
    outcomes = await asyncio.gather(*(_spread(settings, index, one) for index in range(settings.streams)))
    wall = max((outcome[2] for outcome in outcomes if outcome), default=started) - started
    ttfts = []
    for outcome in outcomes:
        if outcome is None:
            figures.failed += 1
            continue
        sent, first, last = outcome
        ttfts.append((first - sent) * 1000)
        # The last bytes carry the final token, the finish and usage events: close enough for a floor.
        figures.tpot_ms.append((last - first) * 1000 / (settings.output_tokens - 1))
    figures.add_round(ttfts)
    if wall > 0:
        figures.aggregate_tokens_per_second.append(settings.output_tokens * (len(outcomes) - figures.failed) / wall)


async def client_round(client: OpenAIClient, settings: SelftestSettings, figures: ReaderFigures) -> list[RequestResult]:
    """The same streams through `OpenAIClient`, with everything it records per chunk."""
    payload = request_payload(settings)
    started = perf_counter()
    results = await asyncio.gather(
        *(_spread(settings, index, lambda: client.send(PATH, payload)) for index in range(settings.streams))
    )
    succeeded = [result for result in results if result.ok and result.ttft_ms is not None and result.tpot_ms is not None]
    figures.failed += len(results) - len(succeeded)
    figures.add_round([result.ttft_ms for result in succeeded])
    figures.tpot_ms += [result.tpot_ms for result in succeeded]
    if succeeded:
        wall = max(result.end_at for result in succeeded) - started
        figures.aggregate_tokens_per_second.append(sum(result.completion_tokens or 0 for result in succeeded) / wall)
    return list(results)


async def measure(settings: SelftestSettings = SelftestSettings()) -> SelftestReport:
    """Start a sim, read its streams with both readers in alternating rounds, stop it."""
    if settings.output_tokens < 2 or settings.streams < 1 or settings.rounds < 1 or settings.tokens_per_second <= 0:
        raise SwaplabError("selftest needs at least 2 output tokens, 1 stream, 1 round and a token rate above 0")
    process, url = await start_sim(settings)
    raw, ours = ReaderFigures(), ReaderFigures()
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session, OpenAIClient(url) as client:
            # One unmeasured round each opens the connections both readers then reuse.
            await raw_round(session, url, settings, ReaderFigures())
            await client_round(client, settings, ReaderFigures())
            for pair in range(settings.rounds):
                if pair % 2:
                    await client_round(client, settings, ours)
                    await raw_round(session, url, settings, raw)
                else:
                    await raw_round(session, url, settings, raw)
                    await client_round(client, settings, ours)
    finally:
        await stop_sim(process)
    return SelftestReport(settings, raw, ours)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
