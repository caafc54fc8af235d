"""`performance.disabled` / `performance.every`: the sampler, its ring, its gauges on `/metrics`
and `GET /api/performance` in llama-swap's JSON, driven a sample at a time."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from pathlib import Path

import psutil
from aiohttp.test_utils import TestClient, TestServer
from configtext import load

from swaplab.fleet.devices import DeviceActivity, DeviceProbe
from swaplab.fleet.performance import PerformanceSampler, ring_capacity
from swaplab.metrics import Metrics
from swaplab.router.app import Router

HOST_GAUGES = (
    "swaplab:cpu_util_percent", "swaplab:memory_total_bytes", "swaplab:memory_used_bytes",
    "swaplab:memory_free_bytes", "swaplab:swap_total_bytes", "swaplab:swap_used_bytes", "swaplab:load_average",
)

# llama-swap's perf.SysStat and perf.GpuStat, field for field (internal/perf/types.go).
SYS_STAT_KEYS = {
    "timestamp", "cpu_util_per_core", "mem_total_mb", "mem_used_mb", "mem_free_mb", "swap_total_mb",
    "swap_used_mb", "load_avg_1", "load_avg_5", "load_avg_15", "net_io",
}
GPU_STAT_KEYS = {
    "timestamp", "id", "name", "uuid", "temp_c", "vram_temp_c", "gpu_util_pct", "mem_util_pct", "mem_used_mb",
    "mem_total_mb", "fan_speed_pct", "power_draw_w",
}

GIB = 1024**3
A_GPU = DeviceActivity(
    index=0, name="Test GPU 16GB", uuid="GPU-1234", utilisation_percent=42.0, memory_used_bytes=4 * GIB,
    memory_total_bytes=16 * GIB, temperature_celsius=61, power_watts=123.5, fan_percent=30.0,
)


def page(metrics: Metrics) -> str:
    return metrics.render()[0].decode()


def gauge(text: str, name: str, labels: str = "") -> float | None:
    """The value of one sample on a metrics page, or None when the page has no such sample."""
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


async def test_a_sample_puts_the_host_gauges_on_the_page():
    sampler = PerformanceSampler(5.0, False, read_gpus=lambda: None)
    metrics = Metrics()
    metrics.watch_performance(sampler.latest)
    before = page(metrics)
    assert not any(name in before for name in HOST_GAUGES)

    await sampler.tick()
    assert sampler.sampled.is_set()
    text = page(metrics)
    assert gauge(text, "swaplab:memory_total_bytes") == psutil.virtual_memory().total
    cores = re.findall(r'^swaplab:cpu_util_percent\{core="(\d+)"\} (\S+)$', text, re.MULTILINE)
    assert [int(core) for core, _ in cores] == list(range(psutil.cpu_count()))
    assert all(0.0 <= float(value) <= 100.0 for _, value in cores)
    for interval in ("1m", "5m", "15m"):
        assert gauge(text, "swaplab:load_average", f'{{interval="{interval}"}}') is not None
    assert "swaplab:gpu_" not in text  # no reading, no GPU gauges


async def test_a_gpu_reading_becomes_gauges_labelled_as_llama_swap_labels_them():
    sampler = PerformanceSampler(5.0, False, read_gpus=lambda: [A_GPU])
    metrics = Metrics()
    metrics.watch_performance(sampler.latest)
    await sampler.tick()
    text = page(metrics)
    labels = '{id="0",name="Test GPU 16GB",uuid="GPU-1234"}'
    assert gauge(text, "swaplab:gpu_util_percent", labels) == 42.0
    assert gauge(text, "swaplab:gpu_memory_used_bytes", labels) == 4 * GIB
    assert gauge(text, "swaplab:gpu_memory_total_bytes", labels) == 16 * GIB
    assert gauge(text, "swaplab:gpu_memory_util_percent", labels) == 25.0
    assert gauge(text, "swaplab:gpu_temperature_celsius", labels) == 61
    assert gauge(text, "swaplab:gpu_power_draw_watts", labels) == 123.5
    assert gauge(text, "swaplab:gpu_fan_speed_percent", labels) == 30.0


async def test_the_ring_keeps_an_hour_of_samples_and_drops_the_oldest():
    assert ring_capacity(5.0) == 720 and ring_capacity(15.0) == 240
    assert ring_capacity(3600.0) == 1 and ring_capacity(7200.0) == 1
    sampler = PerformanceSampler(1200.0, False, read_gpus=lambda: [A_GPU])
    assert sampler.capacity == 3
    landed = []
    for _ in range(5):
        await sampler.tick()
        landed.append(sampler.latest()[0])
    hosts, gpus = sampler.samples()
    assert hosts == landed[-3:]
    assert [sample.time for sample in gpus] == [sample.time for sample in landed[-3:]]


async def test_disabled_samples_nothing():
    sampler = PerformanceSampler(5.0, True)
    metrics = Metrics()
    metrics.watch_performance(sampler.latest)
    sampler.start()
    assert sampler._task is None
    await sampler.close()
    assert not sampler.sampled.is_set() and sampler.samples() == ([], [])
    assert not any(name in page(metrics) for name in HOST_GAUGES)


async def test_nvml_activity_is_none_without_a_gpu_and_real_with_one():
    probe = DeviceProbe()
    try:
        devices = probe.activity()
        readings = probe.read()
    finally:
        probe.close()
    if readings is None:  # no NVML here (no nvidia-ml-py, no driver or no GPU): nothing to say
        assert devices is None
        return
    assert devices is not None and [device.index for device in devices] == sorted(readings)
    for device in devices:
        assert device.name == readings[device.index].name and device.uuid.startswith("GPU-")
        assert 0 <= device.utilisation_percent <= 100
        assert 0 < device.memory_used_bytes <= device.memory_total_bytes
        assert abs(device.memory_total_bytes / GIB - readings[device.index].total_gib) < 0.01


# -- the router: starts and stops the sampler, follows a reload, serves /api/performance ----------


def config_text(performance: str) -> str:
    return f"models: {{}}\n{performance}"


async def router_client(tmp_path: Path, performance: str) -> tuple[Router, TestClient]:
    router = Router(load(config_text(performance)), state_dir=tmp_path / "state", db=tmp_path / "swaplab.db")
    client = TestClient(TestServer(router.app()))
    await client.start_server()
    return router, client


async def test_the_router_samples_from_its_start_and_serves_llama_swaps_json(tmp_path):
    router, client = await router_client(tmp_path, "performance: {every: 5s}\n")
    try:
        # The router started the sampler: its first sample lands without anyone asking.
        await asyncio.wait_for(router.performance.sampled.wait(), 10)
        response = await client.get("/api/performance")
        assert response.status == 200
        body = await response.json()
        assert body["enabled"] is True and set(body) == {"enabled", "sys_stats", "gpu_stats"}
        (first,) = body["sys_stats"]
        assert set(first) == SYS_STAT_KEYS
        assert first["mem_total_mb"] == psutil.virtual_memory().total // (1024 * 1024)
        assert len(first["cpu_util_per_core"]) == psutil.cpu_count()
        assert all(set(record) == GPU_STAT_KEYS for record in body["gpu_stats"])

        await router.performance.tick()
        metrics = await (await client.get("/metrics")).text()
        assert gauge(metrics, "swaplab:memory_total_bytes") == psutil.virtual_memory().total

        # ?after= the first sample's own time: only the later one, as the UI polls for news.
        later = await (await client.get("/api/performance", params={"after": first["timestamp"]})).json()
        (second,) = later["sys_stats"]
        assert datetime.fromisoformat(second["timestamp"]) > datetime.fromisoformat(first["timestamp"])
        bad = await client.get("/api/performance", params={"after": "yesterday"})
        assert bad.status == 400
        assert (await bad.json())["error"]["message"] == "invalid 'after' timestamp, use RFC3339 format"
    finally:
        await client.close()
    assert router.performance._task is None


async def test_disabled_answers_as_llama_swap_and_a_reload_turns_sampling_on_and_off(tmp_path):
    router, client = await router_client(tmp_path, "performance: {disabled: true}\n")
    try:
        response = await client.get("/api/performance")
        assert response.status == 503 and await response.json() == {"enabled": False}
        assert router.performance._task is None

        await router.reload(load(config_text("performance: {every: 10s}\n")))
        assert router.performance.capacity == 360
        await asyncio.wait_for(router.performance.sampled.wait(), 10)
        assert (await client.get("/api/performance")).status == 200
        assert gauge(await (await client.get("/metrics")).text(), "swaplab:memory_total_bytes") is not None

        await router.reload(load(config_text("performance: {disabled: true}\n")))
        assert router.performance._task is None
        response = await client.get("/api/performance")
        assert response.status == 503 and await response.json() == {"enabled": False}
        assert "swaplab:memory_total_bytes" not in await (await client.get("/metrics")).text()
    finally:
        await client.close()
