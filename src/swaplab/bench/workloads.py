"""Bench workloads: the levels a run sends, their lengths and request counts. Pure decisions over settings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swaplab.errors import SwaplabError

KINDS = ("throughput", "prefill", "prefix-cache")
DEFAULT_CONCURRENCY = (1, 2, 4, 8)
DEFAULT_PREFILL_LENGTHS = (1024, 8192, 32768)
# Fixed concurrency: each slot serves this many requests on average per level.
REQUESTS_PER_SLOT = 4
# Poisson arrivals: this many seconds' worth of requests per level, and at least MIN_RATE_REQUESTS.
RATE_SECONDS = 4
MIN_RATE_REQUESTS = 8
DEFAULT_PREFILL_REQUESTS = 2
DEFAULT_PREFIX_CACHE_REQUESTS = 4


@dataclass(frozen=True)
class Level:
    """One point of a sweep: requests of one shape sent at one concurrency or rate."""

    name: str  # "c=4", "rate=2", "in=8192", "uncached", "cached": the requests' `level` in the store
    input_tokens: int  # prompt tokens, as the server counts them
    output_tokens: int
    requests: int
    concurrency: int | None = 1  # None with a rate
    rate: float | None = None  # requests per second, Poisson arrivals
    cached: bool = False  # prefix-cache: prompts share the rep's prefix, after one priming request

    def naming(self) -> dict[str, Any]:
        """The keys that say which level this is, for reports."""
        keys: dict[str, Any] = {"level": self.name}
        if self.rate is not None:
            keys["rate"] = self.rate
        else:
            keys["concurrency"] = self.concurrency
        keys["input_tokens"] = self.input_tokens
        keys["output_tokens"] = self.output_tokens
        return keys


@dataclass(frozen=True)
class Workload:
    kind: str
    levels: tuple[Level, ...]
    prefix_tokens: int = 0  # prefix-cache: the shared prefix's tokens (part of each prompt's input_tokens)


def throughput(
    *, input_tokens: int, output_tokens: int, concurrency: Sequence[int] = (), rates: Sequence[float] = (),
    requests: int | None = None,
) -> Workload:
    """A concurrency sweep (closed loop) or, with `rates`, Poisson arrivals at each rate."""
    _positive("--input-tokens", input_tokens)
    _positive("--output-tokens", output_tokens)
    if requests is not None:
        _positive("--requests", requests)
    levels = []
    if rates:
        for rate in rates:
            if not rate > 0:
                raise SwaplabError(f"--rate must be above 0, got {rate}")
            count = requests or max(MIN_RATE_REQUESTS, math.ceil(rate * RATE_SECONDS))
            levels.append(Level(f"rate={_number(rate)}", input_tokens, output_tokens, count, concurrency=None, rate=rate))
    else:
        for slots in concurrency or DEFAULT_CONCURRENCY:
            _positive("--concurrency", slots)
            count = requests or REQUESTS_PER_SLOT * slots
            levels.append(Level(f"c={slots}", input_tokens, output_tokens, count, concurrency=slots))
    _distinct(levels)
    return Workload("throughput", tuple(levels))


def prefill(
    *, input_tokens: Sequence[int], output_tokens: int, context_tokens: int | None, requests: int | None = None,
) -> Workload:
    """TTFT at growing prompt lengths, one request at a time.

    Given lengths are used as they are (the target refuses those beyond its context);
    the defaults are capped at the context, ending with the longest prompt that fits.
    """
    _positive("--output-tokens", output_tokens)
    lengths = list(input_tokens)
    if not lengths:
        lengths = list(DEFAULT_PREFILL_LENGTHS)
        if context_tokens is not None:
            room = context_tokens - output_tokens
            fitting = [length for length in lengths if length <= room]
            if len(fitting) < len(lengths) and room > 0 and room not in fitting:
                fitting.append(room)
            lengths = fitting
    for length in lengths:
        _positive("--input-tokens", length)
    count = requests or DEFAULT_PREFILL_REQUESTS
    levels = [Level(f"in={length}", length, output_tokens, count) for length in sorted(lengths)]
    _distinct(levels)
    return Workload("prefill", tuple(levels))


def prefix_cache(
    *, prefix_tokens: int, suffix_tokens: int, output_tokens: int, requests: int | None = None,
) -> Workload:
    """The same prompt length uncached (fresh random prefixes) and cached (one shared prefix, fresh suffixes)."""
    _positive("--prefix-tokens", prefix_tokens)
    _positive("--suffix-tokens", suffix_tokens)
    _positive("--output-tokens", output_tokens)
    count = requests or DEFAULT_PREFIX_CACHE_REQUESTS
    total = prefix_tokens + suffix_tokens
    levels = (
        Level("uncached", total, output_tokens, count),
        Level("cached", total, output_tokens, count, cached=True),
    )
    return Workload("prefix-cache", levels, prefix_tokens=prefix_tokens)


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise SwaplabError(f"{flag} must be at least 1, got {value}")


def _distinct(levels: list[Level]) -> None:
    names = [level.name for level in levels]
    if len(set(names)) != len(names):
        raise SwaplabError(f"the same level is asked for twice: {', '.join(names)}")


def _number(value: float) -> str:
    return f"{value:g}"
