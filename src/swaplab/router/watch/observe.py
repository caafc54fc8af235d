"""What one proxied request did: status, TTFT, duration, tokens, read from the bytes the relay copies.

The relay calls `on_chunk` for every chunk it forwards, so that call only notes the
time and keeps a reference to the chunk in a bounded window; nothing is parsed until
`finish`, but for one search of a stream's bytes per chunk until its first content event
(`firsttoken.first_content`): TTFT is the first token's time, never that of a comment, a ping or a
role-only prelude the backend sent while it prefilled. Token counts live in the upstream's
own accounting, which servers send at the end (OpenAI `usage`, llama.cpp `timings`) or, for
Anthropic streams, split between the first event (input) and the last (output). So the
observation keeps the first few KiB and the last few KiB of the body and looks there, once.

A request being captured (`captureBuffer`) costs the relay nothing more per chunk: the
chunks that leave the last-KiB window are kept (by reference) in its `PendingCapture`
instead of being let go, and the capture is built with the record, in the batch.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from swaplab.results.activity import ActivityRecord
from swaplab.router.watch.captures import Capture, CaptureStore, PendingCapture
from swaplab.router.watch.firsttoken import CONTENT_MARKER_BYTES, first_content

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("swaplab.router")

# Accounting objects are a few hundred bytes and sit in the last event; llama.cpp's
# final /completion event carries its settings (~3 KiB) before `timings`.
HEAD_BYTES = 16 * 1024
TAIL_BYTES = 16 * 1024
# Each accounting object is parsed from at most this many bytes after its key.
OBJECT_BYTES = 8 * 1024
ERROR_TEXT_CHARS = 300
STREAMING_TYPES = frozenset({"text/event-stream", "application/x-ndjson"})
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """The upstream's own accounting of one response; None where it said nothing."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    tokens_per_second: float | None = None  # the server's own decode rate
    prompt_per_second: float | None = None  # the server's own prefill rate (llama.cpp's timings)
    draft_tokens: int | None = None  # speculative decoding: tokens drafted
    draft_accepted_tokens: int | None = None  # and accepted


class RequestObservation:
    """Fed by the relay while one request is proxied; `record()` turns it into an `ActivityRecord`.

    `end` notes how the request ended and hands the observation to `on_end`, once,
    whichever path ends it; it does nothing more, so the request path never pays for
    reading the usage or building the record. `record()` does that, once, whenever the
    receiver gets to it (the router: in a batch, off the burst of requests).
    """

    __slots__ = (
        "model", "path", "peer", "requested_model", "on_end", "time", "status", "streamed",
        "request_headers", "session_headers", "capture_id", "pending", "response", "metadata", "waited_for", "context_claim",
        "content_type", "sent_bytes", "upstream", "cancelled", "flight",
        "_record", "_started", "_first_at", "_seek", "_carry", "_last_at", "_head", "_head_bytes", "_tail", "_tail_bytes",
        "_gap",
        "_ended_at", "_completed", "_disconnected", "_error",
    )

    def __init__(
        self,
        model: str,
        path: str,
        peer: str | None = None,
        *,
        requested_model: str | None = None,
        on_end: Callable[[RequestObservation], None] | None = None,
        request_headers: Mapping[str, str] | None = None,
        session_headers: tuple[str, ...] = (),
        capture: PendingCapture | None = None,
        metadata: dict[str, str] | None = None,
    ):
        self.model = model
        # Recorded without its query: a `?token=...` must not reach the store (nor does llama-swap keep it).
        self.path = path.partition("?")[0]
        """The path as the upstream got it, without the query."""
        self.peer = peer
        self.requested_model = requested_model
        self.on_end = on_end
        self.request_headers = request_headers
        """The client's headers: the session id is read from them (`session_headers`, in order), off the path."""
        self.session_headers = session_headers
        self.pending = capture
        """The request's capture while it is under way (None when captures are off)."""
        self.capture_id = capture.id if capture is not None else None
        self.response: web.StreamResponse | None = None
        """What the client was answered with (set by the relay or the router's own answer), for a capture."""
        self.metadata = metadata
        """llama-swap's annotations of the request (`{"selector": ID}`), for its record."""
        self.waited_for: str | None = None
        self.context_claim: Callable[[int | None], bool] | None = None
        """`start` or `wake` when the request waited for its model to get ready (the lease says)."""
        self.time = time.time()
        self._started = time.perf_counter()
        self.status = 0
        self.streamed = False
        self.content_type = ""
        self.sent_bytes = 0
        """Bytes of the response body relayed so far (the in-flight view reads it)."""
        self.upstream: Any = None
        """The upstream response being relayed (an aiohttp ClientResponse), for a cancel to close."""
        self.cancelled = ""
        """Why the request was cancelled from outside (`POST /api/inflight/{id}/cancel`, or cut by
        `security.limits.writeTimeout`), "" unless it was; the error of a request that then ends unfinished."""
        self.flight: Any = None
        """Its entry in the in-flight list while it is on its way (`inflight.Flight`)."""
        self._record: ActivityRecord | None = None
        self._ended_at: float | None = None
        self._completed = False
        self._disconnected = False
        self._error: str | None = None
        self._first_at: float | None = None
        """When the stream's first content event arrived (None before it, and for a body that is not a stream)."""
        self._seek: Callable[[bytes], re.Match[bytes] | None] | None = None
        """What finds a content event in a stream's bytes, until the first is found; None then, and for a body."""
        self._carry = b""  # the last bytes searched, for a marker cut in two by a chunk's edge
        self._last_at = 0.0
        self._head: list[bytes] = []
        self._head_bytes = 0
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._gap = False  # bytes were let go between the head and the tail

    @classmethod
    def of(
        cls,
        request: web.Request,
        model: str,
        path: str,
        requested_model: str,
        peer: str | None,
        on_end: Callable[[RequestObservation], None],
        session_headers: tuple[str, ...],
        captures: CaptureStore | None,
        metadata: dict[str, str] | None = None,
    ) -> RequestObservation:
        """The observation of a request the router forwards, captured while `captures` has a budget."""
        pending = captures.open(request.method, request.path, request.headers) if captures is not None else None
        return cls(
            model, path, peer, requested_model=requested_model, on_end=on_end, request_headers=request.headers,
            session_headers=session_headers, capture=pending, metadata=metadata,
        )

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self._started

    def admitted(
        self, waited_for: str | None, fallback: str, context_claim: Callable[[int | None], bool] | None = None
    ) -> None:
        """The fleet admitted the request: what it waited for (`start`, `wake`, None), why a wake it
        waited for fell back to a cold start, or a context restore to a cold prefill ("" when none did),
        and, on a server that restored saved slots (kvCache), how to ask whether its cached tokens came
        from them (`Run.claim_restored`)."""
        self.waited_for = waited_for
        self.context_claim = context_claim
        if fallback:
            self.metadata = {**(self.metadata or {}), "fallback": fallback}

    def sending(self, body: bytes) -> None:
        """The request's body as it goes upstream (after the filters): for a capture."""
        if self.pending is not None:
            self.pending.request_body = body

    def answered(self, response: web.StreamResponse, body: bytes) -> None:
        """The router answered the client itself, with `response` ending in `body`: for a capture."""
        self.response = response
        self.wrote(body)

    def on_headers(self, status: int, content_type: str) -> None:
        """The upstream's status line and content type arrived."""
        self.status = status
        self.content_type = content_type
        self.streamed = content_type in STREAMING_TYPES
        if self.streamed:
            self._seek = first_content(self.path, content_type).search

    def upstream_route(self, path: str) -> None:
        """The upstream's route is not the client's (a translated request): its stream is read in its dialect."""
        if self.streamed:
            self._seek = first_content(path, self.content_type).search

    def on_chunk(self, data: bytes) -> None:
        """One chunk of the body, as relayed (called on the hot path: keep it trivial)."""
        now = time.perf_counter()
        seek = self._seek
        if seek is not None:  # a stream before its first content event
            self._look_for_content(seek, data, now)
        self._last_at = now
        self._tail.append(data)
        size = len(data)
        self._tail_bytes += size
        self.sent_bytes += size
        if self._tail_bytes > 2 * TAIL_BYTES:
            self._trim()

    def _look_for_content(self, seek: Callable[[bytes], re.Match[bytes] | None], data: bytes, now: float) -> None:
        # One search of the new bytes (and the few before them) per chunk, only until the first content.
        window = self._carry + data if self._carry else data
        if seek(window) is None:
            self._carry = window[-CONTENT_MARKER_BYTES:]
            return
        self._first_at = now
        self._seek = None
        self._carry = b""

    def on_body(self, data: bytes) -> None:
        """A whole non-streamed body at once."""
        self.on_chunk(data)

    def wrote(self, data: bytes) -> None:
        """Bytes the router itself wrote to the client after the relayed ones (its error event or answer): for a capture."""
        if self.pending is not None:
            self.pending.trailer += data

    def _trim(self) -> None:
        # Keep at least TAIL_BYTES in the tail; what leaves it fills the head, then is let go
        # (or, while the request is captured, kept for the capture).
        tail = self._tail
        pending = self.pending
        kept = pending.chunks if pending is not None else None
        before = self._tail_bytes
        while self._tail_bytes - len(tail[0]) >= TAIL_BYTES:
            chunk = tail.popleft()
            self._tail_bytes -= len(chunk)
            if kept is not None:
                kept.append(chunk)
            room = HEAD_BYTES - self._head_bytes
            if room > 0 and not self._gap:
                if len(chunk) > room:
                    chunk = chunk[:room]
                    self._gap = True
                self._head.append(chunk)
                self._head_bytes += len(chunk)
            else:
                self._gap = True
        if kept is not None:  # counted per trim, not per chunk: at most 2 * TAIL_BYTES past the limit
            pending.hold(before - self._tail_bytes)  # type: ignore[union-attr]

    @property
    def retained_bytes(self) -> int:
        """Bytes of the body held for `finish` (bounded, however long the response; a capture's aside)."""
        return self._head_bytes + self._tail_bytes

    @property
    def ended(self) -> bool:
        return self._ended_at is not None

    def fail(self, status: int, error: str) -> None:
        """The router answered itself (no upstream response): end with that answer."""
        self.status = status
        self.end(completed=False, error=error)

    def end(self, completed: bool = True, disconnected: bool = False, error: str | None = None) -> None:
        """The request is over: note how, and hand the observation to `on_end` (only the first call counts)."""
        if self._ended_at is not None:
            return
        self._ended_at = time.perf_counter()
        self._completed = completed
        self._disconnected = disconnected
        self._error = error if error is not None or completed else self.cancelled or None
        if self.pending is not None:
            self.pending.arrive()  # its bytes no longer take room from the requests still running
        if self.on_end is not None:
            try:
                self.on_end(self)
            except Exception:  # recording must never break a request
                log.exception("recording the activity of %s %s failed", self.model, self.path)

    def finish(self, completed: bool = True, disconnected: bool = False, error: str | None = None) -> ActivityRecord:
        """`end`, then `record()`."""
        self.end(completed, disconnected, error)
        return self.record()

    def record(self) -> ActivityRecord:
        """The request's record, read from the bytes kept (built once; after `end`)."""
        if self._record is not None:
            return self._record
        assert self._ended_at is not None, "record() before end()"
        completed, disconnected, error = self._completed, self._disconnected, self._error
        head = b"".join(self._head)
        tail = b"".join(self._tail)
        if not self._gap:
            head = tail = head + tail  # one contiguous body: search all of it both ways
        counts = token_counts(head, tail)
        status = self.status or (499 if disconnected else 502)
        if self.context_claim is not None and status < 400 and self.context_claim(counts.cached_tokens):
            # Its prompt was read from a context saved before a swap and restored on this start.
            self.metadata = {**(self.metadata or {}), "context": "restored"}
        if error is None and (status >= 400 or self.streamed):
            error = error_message(tail, whole_body=not self.streamed and status >= 400)
        if error is None and not completed and not disconnected:
            error = "the upstream response ended early"
        ttft_ms = None
        tokens_per_second = counts.tokens_per_second
        if self.streamed and self._first_at is not None:
            ttft_ms = (self._first_at - self._started) * 1000
            if tokens_per_second is None and (counts.completion_tokens or 0) >= 2 and self._last_at > self._first_at:
                # Tokens after the first, over the time between the first and the last chunk.
                tokens_per_second = (counts.completion_tokens - 1) / (self._last_at - self._first_at)
        self._record = ActivityRecord(
            time=self.time,
            model=self.model,
            path=self.path,
            status=status,
            duration_ms=(self._ended_at - self._started) * 1000,
            requested_model=self.requested_model,
            peer=self.peer,
            prompt_tokens=counts.prompt_tokens,
            completion_tokens=counts.completion_tokens,
            cached_tokens=counts.cached_tokens,
            ttft_ms=ttft_ms,
            tokens_per_second=tokens_per_second,
            prompt_per_second=counts.prompt_per_second,
            draft_tokens=counts.draft_tokens,
            draft_accepted_tokens=counts.draft_accepted_tokens,
            resp_content_type=self.content_type or None,
            client_disconnected=disconnected,
            error=error,
            session_id=self.session_id(),
            capture_id=self.capture_id,
            metadata=json.dumps(self.metadata, ensure_ascii=False) if self.metadata else None,
            waited_for=self.waited_for,
        )
        self._head.clear()
        if self.pending is None:  # else the capture still needs the tail
            self._tail.clear()
        return self._record

    def session_id(self) -> str | None:
        """The client's session: the first non-empty value among `session_headers`, in their order."""
        headers = self.request_headers
        if headers is None:
            return None
        for name in self.session_headers:
            value = headers.get(name, "").strip()
            if value:
                return value
        return None

    def capture(self, secrets: Iterable[str] = ()) -> Capture | None:
        """The request and its response as captured, credentials and `secrets` redacted (once, after `end`).

        None when it was not captured, or its response grew past the whole budget.
        """
        pending = self.pending
        if pending is None or self._ended_at is None:
            return None
        self.pending = None
        response = self.response
        if response is not None:
            status, headers = response.status, response.headers.items()
        else:  # the client left before any answer
            status, headers = 0, ()
        capture = pending.build(self._tail, status, headers, secrets)
        if self._record is not None:
            self._tail.clear()
        return capture


# -- reading the upstream's accounting (pure functions over bytes) ---------------


def token_counts(head: bytes, tail: bytes) -> TokenCounts:
    """Token counts from the first `usage` object in `head` and the last `usage` / `timings` in `tail`.

    Later usage wins field by field: an Anthropic stream reports input tokens in its
    first event and output tokens in its last.
    """
    last = next(json_objects(tail, b'"usage"', last_first=True), None)
    if head is tail and head.find(b'"usage"') == head.rfind(b'"usage"'):
        first = None  # one body, one `usage`: the first is the last, read once (most answers)
    else:
        first = next(json_objects(head, b'"usage"'), None)
    usage = {**(first or {}), **(last or {})}
    timings = next(json_objects(tail, b'"timings"', last_first=True), None) or {}

    prompt = _integer(usage.get("prompt_tokens"))
    if prompt is None and _integer(usage.get("input_tokens")) is not None:
        # Anthropic counts cache reads and writes apart from input_tokens; OpenAI's
        # Responses API includes them in input_tokens and has no such keys.
        prompt = sum(
            _integer(usage.get(key)) or 0
            for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        )
    if prompt is None and _integer(timings.get("prompt_n")) is not None:
        prompt = timings["prompt_n"] + (_integer(timings.get("cache_n")) or 0)  # prompt_n excludes the cache

    completion = _first_integer(usage.get("completion_tokens"), usage.get("output_tokens"), timings.get("predicted_n"))
    cached = _first_integer(
        _field(usage, "prompt_tokens_details", "cached_tokens"), usage.get("cache_read_input_tokens"),
        _field(usage, "input_tokens_details", "cached_tokens"), timings.get("cache_n"),
    )
    drafted = _integer(timings.get("draft_n"))
    accepted = _integer(timings.get("draft_n_accepted"))
    if drafted is None:  # vLLM's own accounting of speculative decoding
        speculative = next(json_objects(tail, b'"speculative_decoding"', last_first=True), None) or {}
        drafted = _integer(speculative.get("num_draft_tokens"))
        accepted = _integer(speculative.get("num_accepted_draft_tokens"))
    return TokenCounts(
        prompt, completion, cached, _rate(timings.get("predicted_per_second")),
        _rate(timings.get("prompt_per_second")), drafted, accepted,
    )


def _rate(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def json_objects(buffer: bytes, key: bytes, *, last_first: bool = False):
    """Yield each JSON object that is the value of `key` (a quoted key, e.g. b'"usage"') in `buffer`.

    A key inside a JSON string cannot match: its quotes would be escaped. Values that
    are not objects (`"usage": null`) and objects cut off by the buffer's edge are skipped.
    """
    position = len(buffer) if last_first else 0
    while True:
        position = buffer.rfind(key, 0, position) if last_first else buffer.find(key, position)
        if position < 0:
            return
        found = position
        if not last_first:
            position += len(key)
        start = found + len(key)
        window = buffer[start : start + OBJECT_BYTES].decode("utf-8", "replace")
        stripped = window.lstrip()
        if not stripped.startswith(":"):
            continue
        value_text = stripped[1:].lstrip()
        if not value_text.startswith("{"):
            continue
        try:
            value, _ = _DECODER.raw_decode(value_text)
        except ValueError:
            continue
        yield value


def error_message(buffer: bytes, *, whole_body: bool) -> str | None:
    """The upstream's error message: its last `"error": {...}` object, else (for a whole error body) the text."""
    for error in json_objects(buffer, b'"error"', last_first=True):
        message = error.get("message")
        if isinstance(message, str) and message:
            return message[:ERROR_TEXT_CHARS]
        return json.dumps(error)[:ERROR_TEXT_CHARS]
    if not whole_body:
        return None
    text = buffer.decode("utf-8", "replace").strip()
    try:
        document = json.loads(text)
    except ValueError:
        return text[:ERROR_TEXT_CHARS] or None
    if isinstance(document, dict):
        for key in ("error", "message", "detail"):
            value = document.get(key)
            if isinstance(value, str) and value:
                return value[:ERROR_TEXT_CHARS]
    return text[:ERROR_TEXT_CHARS] or None


def _field(document: dict[str, Any], outer: str, inner: str) -> Any:
    nested = document.get(outer)
    return nested.get(inner) if isinstance(nested, dict) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _first_integer(*values: Any) -> int | None:
    """The first of `values` that is an integer (a JSON number without a fraction; never a bool), or None.
    One call for a chain of fallbacks: every answer's usage is read with these."""
    for value in values:
        if type(value) is int:
            return value
    return None
