"""`GET /metrics`: the router's Prometheus metrics, named like vLLM's with a `swaplab:` prefix,
and the performance sampler's latest host and GPU sample as gauges (`PerformanceCollector`).

A private registry, so two routers in one process (tests) never share counters and
nothing else in the process leaks into the page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

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
WAKE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0)
CONTEXT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class NetworkFigures(Protocol):
    @property
    def interface(self) -> str: ...
    @property
    def bytes_received(self) -> int: ...
    @property
    def bytes_sent(self) -> int: ...


class HostFigures(Protocol):
    """What the performance sampler measured of the host (`fleet.performance.HostSample`)."""

    @property
    def cpu_percent_per_core(self) -> Sequence[float]: ...
    @property
    def memory_total_bytes(self) -> int: ...
    @property
    def memory_used_bytes(self) -> int: ...
    @property
    def memory_free_bytes(self) -> int: ...
    @property
    def swap_total_bytes(self) -> int: ...
    @property
    def swap_used_bytes(self) -> int: ...
    @property
    def load_average(self) -> tuple[float, float, float]: ...
    @property
    def network(self) -> Sequence[NetworkFigures]: ...


class GpuFigures(Protocol):
    """What the performance sampler measured of one GPU (`fleet.devices.DeviceActivity`)."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def utilisation_percent(self) -> float: ...
    @property
    def memory_used_bytes(self) -> int: ...
    @property
    def memory_total_bytes(self) -> int: ...
    @property
    def temperature_celsius(self) -> int: ...
    @property
    def power_watts(self) -> float: ...
    @property
    def fan_percent(self) -> float: ...


PerformanceSource = Callable[[], tuple[HostFigures | None, Sequence[GpuFigures]]]
"""The latest host sample (None before the first, or while sampling is off) and GPU reading."""


class PerformanceCollector:
    """The performance sampler's latest sample as gauges, read when the page is rendered:
    nothing before the first sample or while `performance.disabled`, and no GPU that has gone."""

    def __init__(self, latest: PerformanceSource):
        self.latest = latest

    def collect(self) -> Iterator[Metric]:
        host, gpus = self.latest()
        if host is not None:
            yield from _host_metrics(host)
        if gpus:
            yield from _gpu_metrics(gpus)


class LaneCollector:
    """The lane's two counts: model requests it served itself, connections it handed to aiohttp's server."""

    def __init__(self, counts: Callable[[], tuple[int, int]]):
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        served, handed_over = self.counts()
        yield CounterMetricFamily("swaplab:lane_requests", "Model requests the router's lane served itself.",
                                  value=served)
        yield CounterMetricFamily("swaplab:lane_handovers",
                                  "Connections the lane handed to aiohttp's server (any request it does not take).",
                                  value=handed_over)


def _host_metrics(host: HostFigures) -> Iterator[Metric]:
    cpu = GaugeMetricFamily("swaplab:cpu_util_percent", "CPU utilisation per core (0-100).", labels=["core"])
    for core, percent in enumerate(host.cpu_percent_per_core):
        cpu.add_metric([str(core)], percent)
    yield cpu
    for name, value, help_text in (
        ("memory_total_bytes", host.memory_total_bytes, "Total memory of the host."),
        ("memory_used_bytes", host.memory_used_bytes, "Memory in use on the host."),
        ("memory_free_bytes", host.memory_free_bytes, "Free memory of the host."),
        ("swap_total_bytes", host.swap_total_bytes, "Total swap of the host."),
        ("swap_used_bytes", host.swap_used_bytes, "Swap in use on the host."),
    ):
        yield GaugeMetricFamily(f"swaplab:{name}", help_text, value=value)
    load = GaugeMetricFamily("swaplab:load_average", "Load average of the host.", labels=["interval"])
    for interval, value in zip(("1m", "5m", "15m"), host.load_average):
        load.add_metric([interval], value)
    yield load
    if host.network:
        network = CounterMetricFamily(
            "swaplab:network_bytes", "Bytes through each network interface since boot.", labels=["interface", "direction"]
        )
        for counters in host.network:
            network.add_metric([counters.interface, "recv"], counters.bytes_received)
            network.add_metric([counters.interface, "sent"], counters.bytes_sent)
        yield network


_GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuFigures], float]], ...] = (
    ("gpu_util_percent", "GPU utilisation (0-100).", lambda gpu: gpu.utilisation_percent),
    ("gpu_memory_util_percent", "GPU memory in use, percent of its total (0-100).",
     lambda gpu: 100 * gpu.memory_used_bytes / gpu.memory_total_bytes if gpu.memory_total_bytes else 0.0),
    ("gpu_memory_used_bytes", "GPU memory in use.", lambda gpu: gpu.memory_used_bytes),
    ("gpu_memory_total_bytes", "GPU memory in all.", lambda gpu: gpu.memory_total_bytes),
    ("gpu_temperature_celsius", "GPU temperature (0 where the card has no sensor NVML can read).",
     lambda gpu: gpu.temperature_celsius),
    ("gpu_power_draw_watts", "GPU power draw (0 where NVML cannot read it).", lambda gpu: gpu.power_watts),
    ("gpu_fan_speed_percent", "GPU fan speed (0-100; 0 for a card without fans).", lambda gpu: gpu.fan_percent),
)


def _gpu_metrics(gpus: Sequence[GpuFigures]) -> Iterator[Metric]:
    for name, help_text, value in _GPU_GAUGES:
        family = GaugeMetricFamily(f"swaplab:{name}", help_text, labels=["id", "name", "uuid"])
        for gpu in gpus:
            family.add_metric([str(gpu.index), gpu.name, gpu.uuid], value(gpu))
        yield family


class Metrics:
    """Every metric the router exports; the router and the fleet call the methods below."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "swaplab:requests_total", "Proxied requests by model and HTTP status.", ["model", "status"], registry=registry
        )
        self.time_to_first_token = Histogram(
            "swaplab:time_to_first_token_seconds", "Time from a request's arrival to its stream's first content event (a token, not a comment or ping).",
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
        self.swaps = Counter(
            "swaplab:swaps_total", "Swaps: times running models were stopped or put to sleep to make room.",
            registry=registry,
        )
        self.backend_sleeps = Counter(
            "swaplab:backend_sleeps_total", "Backends put to sleep (their GPU freed, their process kept).", ["model"],
            registry=registry,
        )
        self.backend_wakes = Counter(
            "swaplab:backend_wakes_total", "Sleeping backends woken and proved ready.", ["model"], registry=registry,
        )
        self.backend_wake_time = Histogram(
            "swaplab:backend_wake_seconds", "Time from the first wake call to the backend's being ready again.",
            ["model"], buckets=WAKE_BUCKETS, registry=registry,
        )
        self.sleep_fallbacks = Counter(
            "swaplab:sleep_fallbacks_total",
            "Sleeps or wakes that failed or timed out, so the backend was stopped (and started cold when wanted).",
            ["model", "during"], registry=registry,
        )
        self.sleepers_stopped = Counter(
            "swaplab:sleepers_stopped_total",
            "Sleeping backends stopped to stay within the host memory budget (least recently used first).",
            ["model"], registry=registry,
        )
        self.queue_wait_time = Histogram(
            "swaplab:queue_wait_seconds", "Time a request waited for its model's slot (start, swap, batch).",
            ["model"], buckets=QUEUE_BUCKETS, registry=registry,
        )
        self.peer_model_available = Gauge(
            "swaplab:peer_model_available", "1 when the peer's model answered its last probe, else 0.",
            ["peer", "model"], registry=registry,
        )
        self.context_saves = Counter(
            "swaplab:kvcache_saves_total",
            "llama.cpp slots saved to disk before their server stopped (kvCache), by outcome (ok, failed).",
            ["model", "outcome"], registry=registry,
        )
        self.context_restores = Counter(
            "swaplab:kvcache_restores_total",
            "Saved slots restored into a started server before it took requests (kvCache), by outcome (ok, failed).",
            ["model", "outcome"], registry=registry,
        )
        self.context_bytes = Counter(
            "swaplab:kvcache_bytes_total", "Bytes of KV cache saved and restored (kvCache), by direction.",
            ["model", "direction"], registry=registry,
        )
        self.context_save_time = Histogram(
            "swaplab:kvcache_save_seconds", "Time one slot's save took, failed ones included (kvCache).",
            ["model"], buckets=CONTEXT_BUCKETS, registry=registry,
        )
        self.context_restore_time = Histogram(
            "swaplab:kvcache_restore_seconds", "Time one slot's restore took, failed ones included (kvCache).",
            ["model"], buckets=CONTEXT_BUCKETS, registry=registry,
        )
        self.context_evictions = Counter(
            "swaplab:kvcache_evictions_total", "Saved caches deleted to keep the kvCache disk budget (oldest first).",
            ["model"], registry=registry,
        )
        self.context_disk = Gauge(
            "swaplab:kvcache_disk_bytes", "Bytes the saved KV caches hold on disk now, all models (kvCache).",
            registry=registry,
        )
        self.backend_up = Gauge("swaplab:backend_up", "1 while the model's backend is ready.", ["model"], registry=registry)
        self.activity_dropped = Counter(
            "swaplab:activity_records_dropped_total", "Activity records not written to the store (queue full or write failed).",
            registry=registry,
        )
        self._performance: PerformanceCollector | None = None
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

    def backend_slept(self, model: str) -> None:
        """A backend fell asleep."""
        self.backend_sleeps.labels(model).inc()

    def backend_woke(self, model: str, seconds: float) -> None:
        """A sleeping backend was ready again after `seconds`."""
        self.backend_wakes.labels(model).inc()
        self.backend_wake_time.labels(model).observe(seconds)

    def sleep_fallback(self, model: str, during: str) -> None:
        """A sleep or wake (`during`) failed: the backend was stopped instead."""
        self.sleep_fallbacks.labels(model, during).inc()

    def context_saved(self, model: str, ok: bool, seconds: float, size: int) -> None:
        """One slot's save before a stop (kvCache) ended: `size` bytes on disk, or failed."""
        self.context_saves.labels(model, "ok" if ok else "failed").inc()
        self.context_save_time.labels(model).observe(seconds)
        if ok:
            self.context_bytes.labels(model, "saved").inc(size)

    def context_restored(self, model: str, ok: bool, seconds: float, size: int) -> None:
        """One slot's restore after a start (kvCache) ended: `size` bytes read, or failed."""
        self.context_restores.labels(model, "ok" if ok else "failed").inc()
        self.context_restore_time.labels(model).observe(seconds)
        if ok:
            self.context_bytes.labels(model, "restored").inc(size)

    def watch_context_disk(self, used_bytes: Callable[[], int]) -> None:
        """`swaplab:kvcache_disk_bytes` reads `used_bytes` at every scrape."""
        self.context_disk.set_function(used_bytes)

    def context_evicted(self, model: str) -> None:
        """A saved cache was deleted for the disk budget."""
        self.context_evictions.labels(model).inc()

    def sleeper_stopped(self, model: str) -> None:
        """A sleeping backend was stopped for the host memory budget."""
        self.sleepers_stopped.labels(model).inc()

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

    def watch_performance(self, latest: PerformanceSource) -> None:
        """Show the performance sampler's latest sample on the page (host and GPU gauges)."""
        if self._performance is not None:
            self.registry.unregister(self._performance)
        self._performance = PerformanceCollector(latest)
        self.registry.register(self._performance)

    def watch_lane(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Show what the lane (router/door/lane.py) served and handed over: `counts()` gives both, read when rendered."""
        self.registry.register(LaneCollector(counts))

    def watch_held_bodies(self, held: Callable[[], int]) -> None:
        """Show the bytes of request bodies the router holds now (`security.limits.maxHeldBodiesMB`), read when rendered."""
        gauge = Gauge(
            "swaplab:request_bodies_held_bytes",
            "Bytes of request bodies held now: being read, or read and not yet answered (both front doors).",
            registry=self.registry,
        )
        gauge.set_function(held)

    def render(self) -> tuple[bytes, str]:
        """The metrics page: body and content type."""
        self._fold_waits()
        return generate_latest(self.registry), CONTENT_TYPE
