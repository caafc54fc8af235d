"""What a capture (`captureBuffer`) costs a request, in process: timeit over the observation, on and off.

Each request is what the relay does to its observation: made (with its capture armed or
not), the body it sent, the status, every chunk, the end; then what the router's batch
does 50 ms later (the record, the capture built, redacted and stored). Chunks are the
sim's SSE events (~150 bytes). The best of 15 repeats, in µs per request.

    .venv/bin/python benchmarks/capture_cost.py
"""

from __future__ import annotations

import timeit

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from swaplab.router.watch.captures import CaptureStore
from swaplab.router.watch.observe import RequestObservation

EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"fast",'
    b'"choices":[{"index":0,"delta":{"content":"word "}}]}\n\n'
)
SESSION_HEADERS = ("X-Session-ID", "X-Litellm-Session-Id")


class Request:
    """What the observation reads of an aiohttp request."""

    method = "POST"
    path = "/v1/chat/completions"
    headers = CIMultiDictProxy(CIMultiDict({
        "Host": "127.0.0.1:8080", "User-Agent": "bench", "Accept": "*/*", "Content-Type": "application/json",
        "Content-Length": "140", "Authorization": "Bearer sk-x", "X-Session-ID": "s-1",
    }))


REQUEST = Request()
RESPONSE = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"})


def relayed(store: CaptureStore | None, chunks: list[bytes]) -> RequestObservation:
    """The request path: everything the relay does to the observation."""
    observation = RequestObservation.of(
        REQUEST, "fast", REQUEST.path, "fast", None, lambda _: None, SESSION_HEADERS, store  # type: ignore[arg-type]
    )
    observation.sending(b'{"model": "fast", "messages": []}')
    observation.on_headers(200, "text/event-stream")
    for chunk in chunks:
        observation.on_chunk(chunk)
    observation.response = RESPONSE
    observation.end()
    return observation


def recorded(store: CaptureStore | None, chunks: list[bytes]) -> None:
    """The request path, then the router's batch."""
    observation = relayed(store, chunks)
    observation.record()
    if store is not None:
        capture = observation.capture(("sk-x",))
        if capture is not None:
            store.add(capture)


def best_us(function, store: CaptureStore | None, chunks: list[bytes]) -> float:
    number = max(20, 20_000 // len(chunks))
    return min(timeit.Timer(lambda: function(store, chunks)).repeat(15, number)) / number * 1e6


def main() -> None:
    print(f"{'chunks':>6}  {'measure':<26} {'off µs':>9} {'on µs':>9} {'added µs':>9}")
    for count in (18, 2000):
        chunks = [EVENT] * count
        for name, function in (("request path", relayed), ("request path + batch", recorded)):
            off = best_us(function, None, chunks)
            on = best_us(function, CaptureStore(5), chunks)
            print(f"{count:>6}  {name:<26} {off:9.2f} {on:9.2f} {on - off:+9.2f}")


if __name__ == "__main__":
    main()
