"""Whether a gang serves: the readiness stages `up` waits through once every rank is alive (a
ready marker or `readiness.path` answering, then a one-token completion), and the one-token
probe that `status` asks too."""

from __future__ import annotations

import asyncio
import contextlib

from swaplab.client import OpenAIClient, ServerUnreachableError
from swaplab.launch.output import Observer
from swaplab.launch.plan import Plan
from swaplab.launch.supervise import POLL_SECONDS, Supervisor

# A probe of the head must not hang on a server that accepted and went quiet.
PROBE_TIMEOUT_SECONDS = 30.0


def head_client(head_url: str) -> OpenAIClient:
    """A client for probing the head."""
    return OpenAIClient(head_url, read_timeout=PROBE_TIMEOUT_SECONDS, connect_timeout=5)


async def wait_ready(plan: Plan, supervisor: Supervisor, observer: Observer) -> None:
    """The readiness stages after every rank is alive: marker or path, then a one-token completion."""
    readiness = plan.recipe.readiness
    async with head_client(plan.head_url) as client:
        if readiness.ready or readiness.path:
            waiting_for = [f"a ready marker ({' | '.join(readiness.ready)})"] if readiness.ready else []
            waiting_for += [f"{readiness.path} answering 200 on the head"] if readiness.path else []
            observer.message(f"waiting for {' or '.join(waiting_for)}")
            while not supervisor.ready_marker.is_set():
                if readiness.path and await _answers(client, readiness.path):
                    observer.message(f"{plan.head_url}{readiness.path} answers 200")
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(supervisor.ready_marker.wait(), POLL_SECONDS)
            if supervisor.ready_marker.is_set():
                observer.message(f"ready marker: {supervisor.ready_line}")
        observer.message("waiting for a one-token completion on the head")
        while True:
            answer = await one_token(client)
            if answer is not None:
                observer.message(f"the head answered a one-token completion ({answer})")
                return
            await asyncio.sleep(POLL_SECONDS)


async def one_token(client: OpenAIClient) -> str | None:
    """'model M: "text"' once the head completes one token, else None."""
    try:
        status, document = await client.get_json("/v1/models")
    except ServerUnreachableError:
        return None
    models = (document or {}).get("data") if isinstance(document, dict) else None
    if status != 200 or not models:
        return None
    model = models[0].get("id", "")
    result = await client.complete(model, "Hi", max_tokens=1, stream=False)
    if result.ok and result.status == 200:
        return f"model {model}: {result.text!r}"
    return None


async def _answers(client: OpenAIClient, path: str) -> bool:
    try:
        status, _ = await client.get_json(path)
    except ServerUnreachableError:
        return False
    return status == 200
