"""Request/response captures (llama-swap's `captureBuffer`): what a proxied request sent and got back.

A capture is built after its request ended, in the router's bookkeeping batch, never on
the request path: the relay only keeps references to the chunks it copies
(`observe.RequestObservation`). Credentials are redacted before a capture is stored,
so no key sits in memory longer than its request. The store is a byte budget, oldest
dropped first, as llama-swap's `cache.Cache`; `GET /api/captures/{id}` reads it in
llama-swap's JSON shape (`ReqRespCapture`).
"""

from __future__ import annotations

import base64
import functools
import logging
import random
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from swaplab.config.redact import secret_name

log = logging.getLogger("swaplab.router")

MIB = 1024 * 1024
REDACTED = "[REDACTED]"
# llama-swap's `sensitiveHeaders`, compared ignoring case.
SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "cookie", "set-cookie"})
# A capture id is a random prefix of this many bits and a counter of COUNTER_BITS: unique
# across the router's restarts and across routers sharing a store, and below 2**53, so a
# browser's JSON numbers hold it exactly.
PREFIX_BITS = 32
COUNTER_BITS = 20


@dataclass(frozen=True, slots=True)
class Capture:
    """One request and its response, credentials already redacted."""

    id: int
    method: str
    path: str  # as the client sent it, without the query (llama-swap's `req_path`)
    request_headers: dict[str, str]
    request_body: bytes
    status: int  # what the client was answered; 0 when it left before any answer
    response_headers: dict[str, str]
    response_body: bytes

    @property
    def size(self) -> int:
        """Bytes it is counted as against the budget: its bodies and its headers' text."""
        request, response = self.request_headers, self.response_headers  # summed in C: every request's capture
        headers = sum(map(len, request)) + sum(map(len, request.values()))
        headers += sum(map(len, response)) + sum(map(len, response.values()))
        return len(self.request_body) + len(self.response_body) + headers + len(self.path)

    def to_json(self) -> dict[str, Any]:
        """llama-swap's `ReqRespCapture` (bodies base64, as Go encodes `[]byte`), plus `req_method` and `resp_status`.

        A response body the upstream compressed (gzip, deflate) is shown decompressed and
        without its `Content-Encoding`, as llama-swap stores it.
        """
        headers, body = _decoded(self.response_headers, self.response_body)
        return {
            "id": self.id,
            "req_method": self.method,
            "req_path": self.path,
            "req_headers": dict(sorted(self.request_headers.items())),  # Go sorts a map's keys
            "req_body": _base64(self.request_body),
            "resp_status": self.status,
            "resp_headers": dict(sorted(headers.items())),
            "resp_body": _base64(body),
        }


class PendingCapture:
    """A request being captured: what it sent, and the response chunks its observation let go of.

    The observation keeps its last chunks itself; what leaves that window lands in
    `chunks` (references, never copies), until more than `limit` bytes would be held:
    then `chunks` becomes None and the capture is given up, as one over the whole budget
    would not be kept anyway. With a `store`, what all the requests being captured hold
    together is bounded by its budget too (256 long streams must not hold 256 budgets):
    the one whose chunks would take the total over it is given up. Once its request has
    ended (`arrive`) it waits for the bookkeeping batch among the store's arrivals, where
    the newest win as they do in the store: what has ended no longer takes room from the
    requests still running.
    """

    __slots__ = (
        "id", "method", "path", "request_headers", "request_body", "chunks", "held", "limit", "trailer", "store",
        "reason", "arrived",
    )

    def __init__(
        self, capture_id: int, method: str, path: str, request_headers: Mapping[str, str], limit: int,
        store: CaptureStore | None = None,
    ):
        self.id = capture_id
        self.method = method
        self.path = path
        self.request_headers = request_headers  # the client's (an immutable view); redacted when built
        self.request_body = b""  # set to the body as sent upstream, after the filters
        self.chunks: list[bytes] | None = []
        self.held = 0
        self.limit = limit
        self.trailer = b""  # what the router itself wrote after the relayed bytes (an error event, its own answer)
        self.store = store
        self.reason = ""
        self.arrived = False

    def hold(self, size: int) -> None:
        """`size` more bytes are kept for the capture; past its limit, or the store's, it is given up."""
        self.held += size
        store = self.store
        if store is not None:
            store.held += size
        if self.held > self.limit:
            self.give_up(f"its response alone is more than all of captureBuffer ({self.limit} bytes)")
        elif store is not None and store.held > store.budget:
            self.give_up(f"the requests being captured at once held more than captureBuffer ({store.budget} bytes)")

    def give_up(self, reason: str) -> None:
        self.chunks = None
        self.reason = reason
        self.release()

    def arrive(self) -> None:
        """Its request has ended: it waits for the batch among the store's arrivals, no longer in flight."""
        if self.store is not None and not self.arrived and self.chunks is not None:
            self.store.arrive(self)

    def release(self) -> None:
        """What it holds no longer counts against the store's budget."""
        store = self.store
        if store is not None:
            if self.arrived:
                store.departed(self)
            else:
                store.held -= self.held
        self.held = 0

    def build(
        self, tail: Iterable[bytes], status: int, response_headers: Iterable[tuple[str, str]], secrets: Iterable[str]
    ) -> Capture | None:
        """The capture, with `tail` (the chunks the observation still holds) after the ones let go; None if given up."""
        self.release()
        if self.chunks is None:
            log.debug("capture %d not kept: %s", self.id, self.reason)
            return None
        secrets = tuple(secrets)
        body = b"".join([*self.chunks, *tail, self.trailer])
        return Capture(
            id=self.id,
            method=self.method,
            path=self.path,
            request_headers=header_map(self.request_headers.items(), secrets),
            request_body=self.request_body,
            status=status,
            response_headers=header_map(response_headers, secrets),
            response_body=body,
        )


class CaptureStore:
    """Captures by id within a byte budget (`captureBuffer` MiB): the oldest go first; 0 keeps none.

    Only the event loop touches it (the bookkeeping batch adds, the API reads).
    """

    def __init__(self, budget_mib: int):
        self.budget = max(0, budget_mib) * MIB
        self.size = 0
        self.held = 0
        """Bytes the requests being captured hold for their captures now (`PendingCapture.hold`)."""
        self.arriving = 0
        """Bytes the captures of ended requests hold until the bookkeeping batch builds them."""
        self._arrivals: OrderedDict[int, PendingCapture] = OrderedDict()
        self._captures: OrderedDict[int, tuple[Capture, int]] = OrderedDict()  # id -> (capture, its size)
        self._prefix = random.getrandbits(PREFIX_BITS)
        self._counter = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def open(self, method: str, path: str, headers: Mapping[str, str]) -> PendingCapture | None:
        """The capture of a request starting now; None while there is no budget (captures off)."""
        if self.budget <= 0:
            return None
        return PendingCapture(self.new_id(), method, path, headers, self.budget, self)

    def new_id(self) -> int:
        """An id for the next request's capture (and its activity row)."""
        if self._counter >> COUNTER_BITS:
            self._prefix, self._counter = random.getrandbits(PREFIX_BITS), 0
        self._counter += 1
        return (self._prefix << COUNTER_BITS) | self._counter

    def resize(self, budget_mib: int) -> None:
        """A reload changed `captureBuffer`: drop the oldest until the rest fit (all of them for 0)."""
        self.budget = max(0, budget_mib) * MIB
        self._fit(0)

    def add(self, capture: Capture) -> bool:
        """Keep `capture`, dropping the oldest to make room; False when it alone is over the budget."""
        size = capture.size
        if size > self.budget:
            log.debug(
                "capture %d not kept: %d bytes, more than all of captureBuffer (%d bytes)", capture.id, size, self.budget
            )
            return False
        old = self._captures.pop(capture.id, None)
        if old is not None:
            self.size -= old[1]
        self._fit(size)
        self._captures[capture.id] = (capture, size)
        self.size += size
        return True

    def arrive(self, pending: PendingCapture) -> None:
        """`pending`'s request ended: its bytes move from the ones in flight to the arrivals,
        where, as in the store, the oldest are given up while all of them are over the budget."""
        self.held -= pending.held
        self.arriving += pending.held
        pending.arrived = True
        self._arrivals[pending.id] = pending
        while self.arriving > self.budget and len(self._arrivals) > 1:
            _, oldest = self._arrivals.popitem(last=False)
            self.arriving -= oldest.held
            oldest.held = 0
            oldest.arrived = False  # nothing to give back any more
            oldest.give_up("newer captures needed the room before it was stored")

    def departed(self, pending: PendingCapture) -> None:
        """An arrival was built or given up: what it held counts no more."""
        if self._arrivals.pop(pending.id, None) is not None:
            self.arriving -= pending.held
        pending.arrived = False

    def get(self, capture_id: int) -> Capture | None:
        held = self._captures.get(capture_id)
        return held[0] if held is not None else None

    def __contains__(self, capture_id: object) -> bool:
        return capture_id in self._captures

    def __len__(self) -> int:
        return len(self._captures)

    def _fit(self, incoming: int) -> None:
        while self._captures and self.size + incoming > self.budget:
            _, (_, size) = self._captures.popitem(last=False)
            self.size -= size


def header_map(headers: Iterable[tuple[str, str]], secrets: Iterable[str] = ()) -> dict[str, str]:
    """Headers as llama-swap captures them: Go's canonical names, the first value of each, credentials redacted.

    Redacted: llama-swap's `sensitiveHeaders` (`SENSITIVE_HEADERS`; not `auth.CREDENTIAL_HEADERS`,
    the two that carry the router's own key), any header whose name names a secret
    (`config.redact.secret_name`: `X-Goog-Api-Key`, `X-Auth-Token`), and any header whose
    value contains one of `secrets` (the config's `apiKeys`, the peers' `apiKey`s).
    """
    secrets = [secret for secret in secrets if secret]
    flat: dict[str, str] = {}
    for name, value in headers:
        key = canonical_header(name)
        if key in flat:
            continue
        if key in _CANONICAL_SENSITIVE or secret_name(key):
            value = REDACTED
        else:
            for secret in secrets:
                if secret in value:
                    value = REDACTED
                    break
        flat[key] = value
    return flat


@functools.lru_cache(maxsize=1024)  # the same few names, request after request
def canonical_header(name: str) -> str:
    """Go's `CanonicalHeaderKey`: `x-api-key` -> `X-Api-Key` (names with a space or odd bytes stay as they are)."""
    if not name or not all(c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in name):
        return name
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


_CANONICAL_SENSITIVE = frozenset(canonical_header(name) for name in SENSITIVE_HEADERS)


def _decoded(headers: Mapping[str, str], body: bytes) -> tuple[Mapping[str, str], bytes]:
    encoding = next((v for k, v in headers.items() if k.lower() == "content-encoding"), "").strip().lower()
    if encoding not in ("gzip", "deflate") or not body:
        return headers, body
    try:
        # 32 + MAX_WBITS reads a gzip header; deflate bodies come zlib-wrapped or raw.
        plain = zlib.decompress(body, 32 + zlib.MAX_WBITS) if encoding == "gzip" else _inflate(body)
    except zlib.error:
        return headers, body  # shown as it came
    return {k: v for k, v in headers.items() if k.lower() != "content-encoding"}, plain


def _inflate(body: bytes) -> bytes:
    try:
        return zlib.decompress(body)
    except zlib.error:
        return zlib.decompress(body, -zlib.MAX_WBITS)


def _base64(body: bytes) -> str | None:
    # Go marshals a nil []byte as null: llama-swap's capture of an empty body.
    return base64.b64encode(body).decode() if body else None
