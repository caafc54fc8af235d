"""A backend refused, reset or broke off a request: why, in words a client can act on, and what now.

A connection refused or reset before any byte waits a moment for the process's exit to be
seen: a crash is restarted (within its back-off) and the request goes once more to the
new server; anything else is answered in the router's own words. A response cut off
mid-stream is explained the same way.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from swaplab.errors import SwaplabError
from swaplab.fleet import Fleet
from swaplab.fleet.lease import BackendUnavailable, Lease
from swaplab.metrics import Metrics
from swaplab.router.relay.proxy import UpstreamError

log = logging.getLogger("swaplab.router")

# A backend refused or reset a connection: this long for its process to be seen exiting
# before the router concludes it still runs (a server's exit and its socket's closing are
# moments apart; a wrapper's child may go first).
EXIT_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class Failure:
    """An error the router answers itself, with its HTTP status."""

    status: int
    message: str
    retry_after: float | None = None


async def recover(fleet: Fleet, metrics: Metrics, lease: Lease, error: UpstreamError, *, first: bool) -> Lease | Failure:
    """Our own backend refused or reset the connection before answering: why, and what now.

    A server that crashed is restarted (within its crash-loop back-off) and the request
    goes once more to the new one; anything else is answered in the router's own words.
    """
    run, model_id = lease.run, lease.backend.id
    try:
        await asyncio.wait_for(asyncio.shield(run.exited.wait()), EXIT_GRACE_SECONDS)
    except TimeoutError:
        return Failure(502, f"model {model_id!r} (pid {run.pid}) is running but {error}")
    if not run.crashed:
        return Failure(503, f"model {model_id!r} was stopped ({run.stop_reason}) while this request was on its way")
    if not first:
        return Failure(
            502, f"model {model_id!r} crashed (exit {run.exit_code}) again, right after its restart, "
            "before answering this request",
        )
    log.warning("%s crashed (exit %s) under a request: restarting it and sending the request again",
                model_id, run.exit_code)
    metrics.request_retried(model_id)
    try:
        return await fleet.reacquire(lease)
    except BackendUnavailable as failure:
        return Failure(
            503, f"model {model_id!r} crashed (exit {run.exit_code}) and did not come back: {failure}",
            failure.retry_after,
        )
    except SwaplabError as failure:
        return Failure(503, f"model {model_id!r} crashed (exit {run.exit_code}) and did not come back: {failure}")


async def explain_break(lease: Lease) -> str:
    """Why a backend broke off mid-response, as the client should read it."""
    run, model_id = lease.run, lease.backend.id
    try:
        await asyncio.wait_for(asyncio.shield(run.exited.wait()), EXIT_GRACE_SECONDS)
    except TimeoutError:
        return f"model {model_id!r} closed the connection mid-stream (its process is still running)"
    if run.crashed:
        return f"model {model_id!r} exited mid-stream (code {run.exit_code})"
    return f"model {model_id!r} was stopped mid-stream ({run.stop_reason})"
