"""`GET /api/performance`: the performance sampler's ring, in llama-swap's JSON.

llama-swap's UI and its API clients read this shape (`handleAPIPerformance`, its
`perf.SysStat` and `perf.GpuStat`): `{"enabled": true, "sys_stats": [...], "gpu_stats": [...]}`,
one `sys_stats` record per sample, one `gpu_stats` record per GPU per sample, and
`?after=RFC3339` for the samples taken after that moment.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from swaplab.fleet.devices import DeviceActivity
from swaplab.fleet.performance import HostSample, PerformanceSampler

MIB = 1024 * 1024

DISABLED = {"enabled": False}
"""The answer (with 503) while `performance.disabled`, as llama-swap's."""

BAD_AFTER = "invalid 'after' timestamp, use RFC3339 format"

# Go's time.RFC3339 parses a date, `T`, a time with optional fractional seconds, and Z or an offset.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def parse_after(text: str) -> datetime | None:
    """`?after=`: an RFC 3339 time (fractions beyond microseconds dropped), or None when it is none."""
    if not _RFC3339.fullmatch(text):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:  # a 61st second, a 13th month
        return None


def report(sampler: PerformanceSampler, after: datetime | None = None) -> dict[str, Any]:
    """The ring as llama-swap's `/api/performance` writes it, only the samples taken after `after` if given.

    Empty lists where llama-swap writes `null` (Go's empty slice); its UI reads both alike.
    """
    hosts, gpus = sampler.samples()
    if after is not None:
        hosts = [sample for sample in hosts if sample.time > after]
        gpus = [sample for sample in gpus if sample.time > after]
    return {
        "enabled": True,
        "sys_stats": [_sys_stat(sample) for sample in hosts],
        "gpu_stats": [_gpu_stat(sample.time, device) for sample in gpus for device in sample.devices],
    }


def _sys_stat(sample: HostSample) -> dict[str, Any]:
    return {
        "timestamp": sample.time.isoformat(),
        "cpu_util_per_core": list(sample.cpu_percent_per_core),
        "mem_total_mb": sample.memory_total_bytes // MIB,
        "mem_used_mb": sample.memory_used_bytes // MIB,
        "mem_free_mb": sample.memory_free_bytes // MIB,
        "swap_total_mb": sample.swap_total_bytes // MIB,
        "swap_used_mb": sample.swap_used_bytes // MIB,
        "load_avg_1": sample.load_average[0],
        "load_avg_5": sample.load_average[1],
        "load_avg_15": sample.load_average[2],
        "net_io": [
            {"name": counters.interface, "bytes_recv": counters.bytes_received, "bytes_sent": counters.bytes_sent}
            for counters in sample.network
        ],
    }


def _gpu_stat(time: datetime, device: DeviceActivity) -> dict[str, Any]:
    used_mb, total_mb = device.memory_used_bytes // MIB, device.memory_total_bytes // MIB
    return {
        "timestamp": time.isoformat(),
        "id": device.index,
        "name": device.name,
        "uuid": device.uuid,
        "temp_c": device.temperature_celsius,
        "vram_temp_c": 0,  # NVML has no reading of it; llama-swap's nvidia-smi source leaves it 0 too
        "gpu_util_pct": device.utilisation_percent,
        "mem_util_pct": used_mb / total_mb * 100 if total_mb else 0.0,
        "mem_used_mb": used_mb,
        "mem_total_mb": total_mb,
        "fan_speed_pct": device.fan_percent,
        "power_draw_w": device.power_watts,
    }
