"""`performance`: the host's CPU, memory and GPUs sampled every `performance.every`, the last hour kept.

llama-swap's performance monitor (its `internal/perf`): the same figures and the same ring,
one hour of samples (`ring_capacity`). The reading runs in a worker thread, since NVML can
block; the ring is only touched on the event loop's thread, so it needs no lock. The
router shows the ring as `GET /api/performance` and the latest sample as gauges on
`/metrics`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psutil

from swaplab.fleet.devices import DeviceActivity, DeviceProbe

log = logging.getLogger("swaplab.fleet")

RING_SECONDS = 3600.0
"""How much history the ring holds: llama-swap's hour."""
FIRST_SAMPLE_SECONDS = 1.0
"""The first sample comes this soon after the start (or `every`, if shorter): a CPU share
needs an interval to be measured over, and a page opened at start should not wait `every`."""


def ring_capacity(every: float) -> int:
    """Samples kept at one sample per `every` seconds: an hour's worth (720 at the default 5 s)."""
    return max(1, int(RING_SECONDS // every))


@dataclass(frozen=True)
class NetworkCounters:
    """Bytes through one interface since boot (the loopback left out, as llama-swap does)."""

    interface: str
    bytes_received: int
    bytes_sent: int


@dataclass(frozen=True)
class HostSample:
    time: datetime
    cpu_percent_per_core: tuple[float, ...]
    """Busy share of each core since the previous sample."""
    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int
    load_average: tuple[float, float, float]
    """1, 5 and 15 minutes."""
    network: tuple[NetworkCounters, ...]


@dataclass(frozen=True)
class GpuSample:
    time: datetime
    devices: tuple[DeviceActivity, ...]
    """Every GPU NVML sees, by index."""


def read_host() -> HostSample:
    """One reading of the host (psutil; cheap, but it reads /proc: call it off the event loop)."""
    memory = psutil.virtual_memory()
    try:
        swap = psutil.swap_memory()
        swap_total, swap_used = swap.total, swap.used
    except (OSError, RuntimeError):  # no swap accounting here (some containers)
        swap_total = swap_used = 0
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    try:
        interfaces = psutil.net_io_counters(pernic=True)
    except OSError:
        interfaces = {}
    return HostSample(
        time=datetime.now().astimezone(),
        # Since the previous call in this process: the sampler primes it when it starts.
        cpu_percent_per_core=tuple(psutil.cpu_percent(percpu=True)),
        memory_total_bytes=memory.total,
        memory_used_bytes=memory.used,
        memory_free_bytes=memory.free,
        swap_total_bytes=swap_total,
        swap_used_bytes=swap_used,
        load_average=(load[0], load[1], load[2]),
        network=tuple(
            NetworkCounters(name, counters.bytes_recv, counters.bytes_sent)
            for name, counters in interfaces.items()
            if name != "lo"
        ),
    )


class PerformanceSampler:
    """Samples the host and its GPUs every `every` seconds between `start` and `close`;
    `disabled` samples nothing. `configure` applies a reload."""

    def __init__(
        self,
        every: float,
        disabled: bool,
        *,
        read_gpus: Callable[[], list[DeviceActivity] | None] | None = None,
    ):
        self.every = every
        self.disabled = disabled
        self._probe = DeviceProbe()
        # NVML by default; a test on a machine without a GPU may hand in its own reading.
        self._read_gpus = read_gpus if read_gpus is not None else self._probe.activity
        self._host: deque[HostSample] = deque(maxlen=ring_capacity(every))
        self._gpus: deque[GpuSample] = deque(maxlen=ring_capacity(every))
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self.sampled = asyncio.Event()
        """Set whenever a sample lands in the ring (clear it to wait for the next one)."""

    @property
    def enabled(self) -> bool:
        return not self.disabled

    @property
    def capacity(self) -> int:
        """Samples the ring holds before the oldest goes."""
        return self._host.maxlen or 0

    def start(self) -> None:
        """Sample every `every` seconds, the first after `FIRST_SAMPLE_SECONDS` (nothing while
        disabled); call on the event loop."""
        self._started = True
        if self.disabled or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="performance sampler")

    async def close(self) -> None:
        """Stop sampling and let go of NVML."""
        self._started = False
        task = self._stop()
        if task is not None:
            await asyncio.wait([task])  # its cancellation lands (asyncio.wait never raises it here)
        await asyncio.to_thread(self._probe.close)

    def configure(self, every: float, disabled: bool) -> None:
        """A reload: a changed `every` or `disabled` starts over with an empty ring, as llama-swap does."""
        if (every, disabled) == (self.every, self.disabled):
            return
        self._stop()
        self.every, self.disabled = every, disabled
        self._host = deque(maxlen=ring_capacity(every))
        self._gpus = deque(maxlen=ring_capacity(every))
        if self._started:
            self.start()

    async def tick(self) -> None:
        """Take one sample (in a worker thread) and keep it."""
        host, gpus = await asyncio.to_thread(self._read)
        self._host.append(host)
        if gpus:
            self._gpus.append(GpuSample(host.time, tuple(gpus)))
        self.sampled.set()

    def samples(self) -> tuple[list[HostSample], list[GpuSample]]:
        """The ring, oldest first: host samples and GPU samples (none without NVML)."""
        return list(self._host), list(self._gpus)

    def latest(self) -> tuple[HostSample | None, tuple[DeviceActivity, ...]]:
        """The newest host sample and the newest GPU reading; (None, ()) before the first or while disabled."""
        if self.disabled or not self._host:
            return None, ()
        return self._host[-1], (self._gpus[-1].devices if self._gpus else ())

    def _read(self) -> tuple[HostSample, list[DeviceActivity] | None]:
        return read_host(), self._read_gpus()

    def _stop(self) -> asyncio.Task[None] | None:
        # Cancelled at its await: a reading still in its thread is dropped, never kept.
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(psutil.cpu_percent, percpu=True)  # the first sample's CPU baseline
        due = loop.time() + min(self.every, FIRST_SAMPLE_SECONDS)
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            try:
                await self.tick()
            except Exception:  # a failed reading must not end the sampling
                log.exception("performance sample failed")
            # On a fixed beat; a reading that overran it is not made up for.
            due = max(due + self.every, loop.time())
