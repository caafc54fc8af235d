"""`GET /metrics`: the router's Prometheus metrics, named like vLLM's with a `swaplab:` prefix.

A private registry, so two routers in one process (tests) never share counters and
nothing else in the process leaks into the page.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from swaplab.results.activity import ActivityRecord

# The classic text format generate_latest writes (newer prometheus_client releases
# label it 1.0.0 by default, which older scrapers do not know).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets for the same measures, so dashboards built for vLLM read ours alike.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Observations noted on the request path wait for the page to be read, up to this many.
PENDING_OBSERVATIONS = 4096
START_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)


class Metrics:
    """Every metric the router exports; the router and the fleet call the methods below."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "swaplab:requests_total", "Proxied requests by model and HTTP status.", ["model", "status"], registry=registry
        )
        self.time_to_first_token = Histogram(
            "swaplab:time_to_first_token_seconds", "Time from a request's arrival to its first streamed chunk.",
            ["model"], buckets=TTFT_BUCKETS, registry=registry,
        )
        self.e2e_request_latency = Histogram(
            "swaplab:e2e_request_latency_seconds", "Time from a request's arrival to the end of its response.",
            ["model"], buckets=E2E_BUCKETS, registry=registry,
        )
        self.prompt_tokens = Counter(
            "swaplab:prompt_tokens_total", "Prompt tokens, as the upstream reported them.", ["model"], registry=registry
        )
        self.generation_tokens = Counter(
            "swaplab:generation_tokens_total", "Generated tokens, as the upstream reported them.", ["model"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            "swaplab:client_disconnects_total", "Requests whose client went away before the end.", ["model"],
            registry=registry,
        )
        self.backend_starts = Counter(
            "swaplab:backend_starts_total", "Backend starts by outcome (ok, failed).", ["model", "outcome"],
            registry=registry,
        )
        self.backend_start_time = Histogram(
            "swaplab:backend_start_seconds", "Time from spawning a backend to its being ready (successful starts).",
            ["model"], buckets=START_BUCKETS, registry=registry,
        )
        self.requests_retried = Counter(
            "swaplab:requests_retried_total",
            "Requests sent again to a restarted backend after its server crashed before answering.",
            ["model"], registry=registry,
        )
        self.swaps = Counter("swaplab:swaps_total", "Swaps: times running models were stopped to make room.", registry=registry)
        self.queue_wait_time = Histogram(
            "swaplab:queue_wait_seconds", "Time a request waited for its model's slot (start, swap, batch).",
            ["model"], buckets=QUEUE_BUCKETS, registry=registry,
        )
        self.peer_model_available = Gauge(
            "swaplab:peer_model_available", "1 when the peer's model answered its last probe, else 0.",
            ["peer", "model"], registry=registry,
        )
        self.backend_up = Gauge("swaplab:backend_up", "1 while the model's backend is ready.", ["model"], registry=registry)
        self.activity_dropped = Counter(
            "swaplab:activity_records_dropped_total", "Activity records not written to the store (queue full or write failed).",
            registry=registry,
        )
        # Label lookups take a lock and build a tuple; requests reuse the children.
        self._per_model: dict[str, tuple] = {}
        self._per_status: dict[tuple[str, int], Counter] = {}
        self._queue_wait: dict[str, Histogram] = {}
        self._waits: list[tuple[str, float]] = []

    def observe_request(self, record: ActivityRecord) -> None:
        """Count one finished request (call with every record the observation produces)."""
        label = record.model if record.peer is None else f"{record.peer}/{record.model}"
        children = self._per_model.get(label)
        if children is None:
            children = self._per_model[label] = (
                self.time_to_first_token.labels(label),
                self.e2e_request_latency.labels(label),
                self.prompt_tokens.labels(label),
                self.generation_tokens.labels(label),
                self.client_disconnects.labels(label),
            )
        ttft, e2e, prompt, generation, disconnects = children
        requests = self._per_status.get((label, record.status))
        if requests is None:
            requests = self._per_status[(label, record.status)] = self.requests.labels(label, str(record.status))
        requests.inc()
        e2e.observe(record.duration_ms / 1000)
        if record.ttft_ms is not None:
            ttft.observe(record.ttft_ms / 1000)
        if record.prompt_tokens:
            prompt.inc(record.prompt_tokens)
        if record.completion_tokens:
            generation.inc(record.completion_tokens)
        if record.client_disconnected:
            disconnects.inc()

    def backend_started(self, model: str, seconds: float, ok: bool) -> None:
        """A backend start ended: ready after `seconds`, or failed."""
        self.backend_starts.labels(model, "ok" if ok else "failed").inc()
        if ok:
            self.backend_start_time.labels(model).observe(seconds)

    def request_retried(self, model: str) -> None:
        """The model's server crashed under a request before answering; the request went to its restart."""
        self.requests_retried.labels(model).inc()

    def swap(self) -> None:
        """Running models were stopped to make room for another."""
        self.swaps.inc()

    def queue_wait(self, model: str, seconds: float) -> None:
        """A request was admitted after waiting `seconds` (0 when admitted at once).

        Admission is on every request's way to its first byte: the wait is only noted
        here and folded into the histogram when the page is read (or the notes pile up).
        """
        self._waits.append((model, seconds))
        if len(self._waits) >= PENDING_OBSERVATIONS:
            self._fold_waits()

    def _fold_waits(self) -> None:
        waits, self._waits = self._waits, []
        for model, seconds in waits:
            child = self._queue_wait.get(model)
            if child is None:
                child = self._queue_wait[model] = self.queue_wait_time.labels(model)
            child.observe(seconds)

    def peer_availability(self, peer: str, model: str, available: bool) -> None:
        self.peer_model_available.labels(peer, model).set(1 if available else 0)

    def backend_state(self, model: str, up: bool) -> None:
        self.backend_up.labels(model).set(1 if up else 0)

    def records_dropped(self, count: int) -> None:
        """The activity writer let `count` records go (pass this as its `on_drop`)."""
        self.activity_dropped.inc(count)

    def render(self) -> tuple[bytes, str]:
        """The metrics page: body and content type."""
        self._fold_waits()
        return generate_latest(self.registry), CONTENT_TYPE
