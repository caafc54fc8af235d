"""`security.limits.writeTimeout`: whether a client has read nothing of its answer for too long.

A pure decision over two numbers sampled from a request's client connection: the bytes its
answer has handed to the socket (`sent`) and the bytes of them still waiting in the
transport's buffer (`buffered`). Bytes leaving (`sent - buffered` growing) are progress, so
a slow client that reads is never cut; an empty buffer is never a stall (the kernel took
everything: nothing waits for the client). The registry of requests on their way samples
them on one timer (`inflight.InFlight`), so the relay pays nothing per chunk.
"""

from __future__ import annotations

from typing import NamedTuple


class Stall(NamedTuple):
    """Bytes had left (`sent - buffered`) as of `since`, and none have left since."""

    left: int
    since: float


def next_stall(previous: Stall | None, sent: int, buffered: int, now: float) -> Stall | None:
    """The stall after this sample: None while nothing waits for the client or bytes left since the last one."""
    if buffered <= 0:
        return None
    left = sent - buffered
    if previous is None or left > previous.left:
        return Stall(left, now)
    return previous


def stalled_too_long(stall: Stall | None, now: float, limit: float) -> bool:
    """Whether the client read nothing for `limit` seconds while bytes waited for it."""
    return stall is not None and now - stall.since >= limit


def cut_message(limit: float) -> str:
    """What the request's activity row says when it is cut."""
    return f"the client read nothing for {limit:g} s: cut (security.limits.writeTimeout)"


def sample_interval(limit: float) -> float:
    """How often the connections are sampled: a cut comes at most a quarter late (and 5 s at most)."""
    return max(0.05, min(limit / 4, 5.0))
