"""What the GPUs themselves say: NVML's per-device memory (placement) and activity
(the performance sampler), when there is NVML to ask.

Optional: `nvidia-ml-py` (the `gpu` extra) provides `pynvml`. Without it, without a
driver or without a GPU, every reading is None and nothing else changes: placement
then goes by the declared claims alone. Device ids are NVML's indexes, the ones
`nvidia-smi` prints.

What they say lags a moment behind a backend that just left: `Settling` keeps which devices
are still handing memory back, and has the fleet look again shortly rather than refuse.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from swaplab.config.model import ModelConfig

log = logging.getLogger("swaplab.fleet")

GIB = 1024**3

MEMORY_SETTLE_SECONDS = 10.0
MEMORY_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class DeviceReading:
    index: int
    name: str
    total_gib: float
    used_gib: float
    free_gib: float


@dataclass(frozen=True)
class DeviceActivity:
    """What one GPU is doing now; a sensor NVML has not on this card (fans on a data-centre
    card, power on some laptops) reads 0, as llama-swap reports it."""

    index: int
    name: str
    uuid: str
    utilisation_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_celsius: int
    power_watts: float
    fan_percent: float


class DeviceProbe:
    """NVML, opened on first use and kept open; `read()` is None where NVML cannot answer."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._unavailable = False

    def read(self) -> dict[int, DeviceReading] | None:
        """Memory of every device, by index; None without NVML or without a GPU."""
        nvml = self._open()
        if nvml is None:
            return None
        try:
            readings = {}
            for index, handle, name in _devices(nvml):
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                readings[index] = DeviceReading(
                    index=index,
                    name=name,
                    total_gib=memory.total / GIB,
                    used_gib=memory.used / GIB,
                    free_gib=memory.free / GIB,
                )
        except nvml.NVMLError as error:
            log.debug("NVML reading failed: %s", error)
            return None
        return readings or None

    def process_memory(self, pids: Collection[int]) -> dict[int, float] | None:
        """GiB each device holds for these processes (NVML's per-process accounting, what
        `nvidia-smi` lists); None without NVML, or where the driver does not say."""
        nvml = self._open()
        if nvml is None:
            return None
        wanted = set(pids)
        taken: dict[int, float] = {}
        try:
            for index, handle, _name in _devices(nvml):
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = getattr(process, "usedGpuMemory", None)
                    if process.pid in wanted and isinstance(used, int):
                        taken[index] = taken.get(index, 0.0) + used / GIB
        except nvml.NVMLError as error:
            log.debug("NVML process reading failed: %s", error)
            return None
        return taken or None

    def activity(self) -> list[DeviceActivity] | None:
        """Utilisation, memory and sensors of every device, by index; None without NVML or a GPU.

        NVML may block for a while (a card waking up): call it off the event loop.
        """
        nvml = self._open()
        if nvml is None:
            return None
        try:
            devices = []
            for index, handle, name in _devices(nvml):
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                utilisation = _sensor(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
                power_milliwatts = _sensor(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
                devices.append(DeviceActivity(
                    index=index,
                    name=name,
                    uuid=_text(_sensor(nvml, nvml.nvmlDeviceGetUUID, handle) or ""),
                    utilisation_percent=float(utilisation.gpu) if utilisation is not None else 0.0,
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                    temperature_celsius=int(
                        _sensor(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU) or 0
                    ),
                    power_watts=(power_milliwatts or 0) / 1000,
                    fan_percent=float(_sensor(nvml, nvml.nvmlDeviceGetFanSpeed, handle) or 0),
                ))
        except nvml.NVMLError as error:
            log.debug("NVML reading failed: %s", error)
            return None
        return devices or None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as error:
                log.debug("nvmlShutdown failed: %s", error)
            self._nvml = None

    def _open(self) -> Any:
        if self._nvml is not None or self._unavailable:
            return self._nvml
        try:
            import pynvml
        except ImportError:
            log.debug("no NVML: nvidia-ml-py is not installed (pip install 'swaplab[gpu]')")
            self._unavailable = True
            return None
        try:
            pynvml.nvmlInit()
        except Exception as error:  # NVMLError, or a library too broken to say which
            # No driver or no GPU: this machine has nothing to report, now or later.
            log.debug("no NVML: %s", error)
            self._unavailable = True
            return None
        self._nvml = pynvml
        return pynvml


def _devices(nvml: Any):
    """(index, handle, name) of every device NVML sees."""
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        yield index, handle, _text(nvml.nvmlDeviceGetName(handle))


def _sensor(nvml: Any, read: Any, *arguments: Any) -> Any:
    """One optional reading: None where this card has no such sensor (NVML_ERROR_NOT_SUPPORTED and kin)."""
    try:
        return read(*arguments)
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_devices() -> dict[int, DeviceReading] | None:
    """One reading of every device's memory, NVML opened and closed around it."""
    probe = DeviceProbe()
    try:
        return probe.read()
    finally:
        probe.close()


def free_gib(readings: dict[int, DeviceReading] | None) -> dict[int, float] | None:
    """Free GiB per device index, as `placement.place` takes it."""
    if readings is None:
        return None
    return {index: reading.free_gib for index, reading in readings.items()}


class Settling:
    """The devices a backend left moments ago, whose memory the driver may still be handing back.

    The driver hands a stopped backend's GPU memory back shortly after its processes exit (a TP
    worker killed with the group may take a moment longer): for MEMORY_SETTLE_SECONDS after a
    backend left a device, a shortfall NVML reports there means wait and read again, not refuse.
    """

    def __init__(self) -> None:
        self._left_at: dict[int, float] = {}
        self._poll: asyncio.TimerHandle | None = None

    def left(self, devices: Iterable[int], now: float) -> None:
        """A backend left these devices (it stopped, or fell asleep) at `now` (monotonic)."""
        for device in devices:
            self._left_at[device] = now

    def devices(self, now: float) -> list[int]:
        """The devices still settling at `now`."""
        return [d for d, left in self._left_at.items() if now - left < MEMORY_SETTLE_SECONDS]

    def look_again(self, decide: Callable[[], None]) -> None:
        """No event says when the driver has handed memory back: `decide` again in MEMORY_POLL_SECONDS
        (once, however often this is asked meanwhile)."""
        if self._poll is None:
            def poll() -> None:
                self._poll = None
                decide()

            self._poll = asyncio.get_running_loop().call_later(MEMORY_POLL_SECONDS, poll)

    def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()


def device_env(model: ModelConfig, inherited: Mapping[str, str]) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` from the model's `devices`, unless its `env` sets it.

    Device ids are NVML's (`nvidia-smi`'s) indexes, in PCI bus order; CUDA numbers
    devices fastest first unless told otherwise, which on a mixed box names another
    GPU. So `CUDA_DEVICE_ORDER=PCI_BUS_ID` comes along, unless already set.
    """
    own = {name for name, _ in model.env}
    if not model.devices or "CUDA_VISIBLE_DEVICES" in own:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in model.devices)}
    if "CUDA_DEVICE_ORDER" not in own and "CUDA_DEVICE_ORDER" not in inherited:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env
