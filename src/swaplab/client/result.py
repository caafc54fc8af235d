"""What one request did, as the client saw it: timestamps, the server's own token counts, the answer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import pairwise
from time import perf_counter
from typing import Any


@dataclass(slots=True)
class RequestResult:
    """One request's record. Times are `time.perf_counter()` seconds (monotonic, this process only).

    Token counts are the server's (`usage`), never counted from chunks: a chunk may
    carry several tokens, or none. None where the server said nothing.
    """

    sent_at: float
    end_at: float = 0.0
    streamed: bool = True
    status: int | None = None  # HTTP status; None when no response arrived
    error: str | None = None  # None: the request completed
    finish_reason: str | None = None
    # Arrival time of every chunk that carried a token (content, reasoning or a
    # tool-call delta); the first is the TTFT. A role-only prelude is not one.
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp's own accounting of the request
    attempts: int = 1  # 2 when a dropped keep-alive connection was retried on a fresh one

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first_token_at(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def ttft_ms(self) -> float | None:
        """Send to the first token-bearing chunk."""
        first = self.first_token_at
        return None if first is None else (first - self.sent_at) * 1000

    @property
    def e2e_ms(self) -> float:
        """Send to the end of the response."""
        return (self.end_at - self.sent_at) * 1000

    @property
    def tpot_ms(self) -> float | None:
        """vLLM's time per output token: (e2e - TTFT) / (output tokens - 1), output tokens from usage."""
        ttft = self.ttft_ms
        if ttft is None or self.completion_tokens is None or self.completion_tokens < 2:
            return None
        return (self.e2e_ms - ttft) / (self.completion_tokens - 1)

    @property
    def itl_ms(self) -> list[float]:
        """Gaps between consecutive token-bearing chunks."""
        times = self.token_times
        return [(later - earlier) * 1000 for earlier, later in pairwise(times)]

    @property
    def server_tokens_per_second(self) -> float | None:
        """The server's own decode rate (llama.cpp `timings.predicted_per_second`), when it reports one."""
        rate = (self.timings or {}).get("predicted_per_second")
        return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None


class WallClock:
    """perf_counter seconds to unix seconds, anchored once per run (stored rows are in unix time)."""

    def __init__(self) -> None:
        self.wall = time.time()
        self.monotonic = perf_counter()

    def unix(self, moment: float | None) -> float | None:
        return None if moment is None else self.wall + (moment - self.monotonic)
