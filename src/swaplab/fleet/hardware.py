"""What machine swaplab runs on: llama-swap's hardware snapshot (`GET /api/hardware`, schema 1).

Detected once at start, best effort, as llama-swap does: a fact that cannot be read is
null (or the schema's `unknown`), never a guess, and detection never raises. On Linux the
facts come from files under `root` (os-release, /proc, /sys), so a test can hand it a fake
tree; elsewhere from Python's `platform`. CPU counts and the kernel's RAM total come from
psutil, GPUs from NVML (`DeviceProbe`, plus the driver version, power limit and compute
capability asked of NVML here).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import mmap
import platform
import time
from pathlib import Path
from typing import Any

import psutil

from swaplab.fleet.devices import GIB, DeviceProbe, DeviceReading, read_devices

log = logging.getLogger("swaplab.fleet")

SCHEMA_VERSION = 1

_ARCHITECTURES = {
    "x86_64": "x86_64", "amd64": "x86_64",
    "aarch64": "arm64", "arm64": "arm64",
    # A 32-bit ARM userland: armv8l is a 64-bit CPU running one.
    "armv7l": "armv7", "armv7": "armv7", "armv8l": "armv7",
    "ppc64le": "ppc64le", "riscv64": "riscv64", "s390x": "s390x",
}
_FAMILIES = {"linux": "linux", "darwin": "macos", "windows": "windows", "freebsd": "freebsd"}
# os-release IDs that gopsutil (llama-swap's source) names after their release files instead.
_OS_NAMES = {"amzn": "amazon", "rhel": "redhat", "ol": "oracle"}
# What llama-swap shows for the environments it names; any other name is shown as found.
_ENVIRONMENT_NAMES = {"docker": "Docker", "lxc": "LXC", "kvm": "KVM", "vmware": "VMware",
                      "vbox": "VirtualBox", "oracle": "VirtualBox", "hyperv": "Hyper-V", "microsoft": "Hyper-V"}
# DMI text of a virtual machine (vendor, product, BIOS and board, joined in that order) -> its
# name, after systemd-detect-virt's table; shown as llama-swap shows that tool's names.
_VM_VENDORS = (("KVM", "kvm"), ("QEMU", "qemu"), ("VMware", "vmware"),
               ("VirtualBox", "vbox"), ("innotek GmbH", "vbox"), ("Xen", "xen"), ("Parallels", "parallels"),
               ("BHYVE", "bhyve"), ("Google Compute Engine", "google"), ("Amazon EC2", "amazon"),
               ("Microsoft Corporation Virtual Machine", "hyperv"), ("Apple Virtualization", "apple"))
# /proc/cpuinfo "CPU implementer" -> vendor, and for ARM's own cores "CPU part" -> model (the kernel's names).
_ARM_IMPLEMENTERS = {0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
                     0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm", 0x56: "Marvell", 0x61: "Apple",
                     0x69: "Intel", 0xC0: "Ampere"}
_ARM_PARTS = {0xC07: "Cortex-A7", 0xC09: "Cortex-A9", 0xC0F: "Cortex-A15", 0xD03: "Cortex-A53",
              0xD04: "Cortex-A35", 0xD05: "Cortex-A55", 0xD07: "Cortex-A57", 0xD08: "Cortex-A72",
              0xD09: "Cortex-A73", 0xD0A: "Cortex-A75", 0xD0B: "Cortex-A76", 0xD0C: "Neoverse-N1",
              0xD0D: "Cortex-A77", 0xD40: "Neoverse-V1", 0xD41: "Cortex-A78", 0xD44: "Cortex-X1",
              0xD46: "Cortex-A510", 0xD47: "Cortex-A710", 0xD48: "Cortex-X2", 0xD49: "Neoverse-N2",
              0xD4D: "Cortex-A715", 0xD4E: "Cortex-X3", 0xD4F: "Neoverse-V2", 0xD81: "Cortex-A720",
              0xD82: "Cortex-X4", 0xD84: "Neoverse-V3", 0xD85: "Cortex-X925", 0xD87: "Cortex-A725",
              0xD8E: "Neoverse-N3"}
# CUDA compute capability -> NVIDIA architecture, as nvidia-smi names them.
_NVIDIA_ARCHITECTURES = {2: "Fermi", 3: "Kepler", 5: "Maxwell", 6: "Pascal", 7: "Volta", 8: "Ampere",
                         9: "Hopper", 10: "Blackwell", 11: "Blackwell", 12: "Blackwell"}
_NVIDIA_MINOR_ARCHITECTURES = {(7, 5): "Turing", (8, 9): "Ada Lovelace"}


def detect_hardware(probe: DeviceProbe | None = None, *, root: str = "/") -> dict[str, Any]:
    """The hardware snapshot of this machine, as llama-swap's `GET /api/hardware` answers it.

    `probe`: the router's NVML probe (one is opened and closed here without it). `root`:
    where the Linux files are read from.
    """
    system = platform.system()
    operating_system = _operating_system(root, system)
    return {
        "schema_version": SCHEMA_VERSION,
        "captured_at": _now(),
        "capture": {
            "scope": "inference_host",
            "method": "detected",
            "detector": {"name": "swaplab", "version": _version()},
        },
        "architecture": _architecture(platform.machine()),
        "operating_system": operating_system,
        "environment": (_environment(root, operating_system["kernel"]) if operating_system["family"] == "linux"
                        else _environment_unknown()),
        "cpu": _cpu(root),
        "memory": {"capacity_bytes": _memory_capacity(root)},
        "accelerators": _accelerators(probe),
    }


def _architecture(machine: str) -> dict[str, Any]:
    """`platform.machine()` as the schema names it; `raw_name` only when the two differ."""
    name = _ARCHITECTURES.get(machine.lower(), "other")
    return {"name": name, "raw_name": None if machine == name else (machine or None)}


def _now() -> str:
    """UTC, RFC 3339 with nanoseconds and no trailing zeros, as Go prints a `time.Time`."""
    nanoseconds = time.time_ns()
    seconds, fraction = divmod(nanoseconds, 1_000_000_000)
    when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:09d}".rstrip("0").rstrip(".") + "Z"


def _version() -> str:
    try:
        return importlib.metadata.version("swaplab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _operating_system(root: str, system: str) -> dict[str, Any]:
    family = _FAMILIES.get(system.lower(), "other")
    found: dict[str, Any] = {"family": family, "name": None, "version": None, "kernel": None}
    if family == "other":
        found["raw_family"] = _fact(system.lower())
    if family != "linux":
        found["name"] = {"macos": "macOS", "windows": "Windows"}.get(family, _fact(system.lower()))
        found["version"] = _fact(platform.mac_ver()[0]) if family == "macos" else None
        found["kernel"] = _fact(platform.release())
        return found
    release = _key_values(_read(root, "etc/os-release") or "")
    name = _fact(release.get("ID", ""))
    version = _fact(release.get("VERSION_ID", ""))
    if name == "debian":
        # Debian's point release ("12.11") lives here, not in os-release ("12").
        version = _fact(_first_line(_read(root, "etc/debian_version"))) or version
    found["name"] = _OS_NAMES.get(name, name) if name else None
    found["version"] = version
    found["kernel"] = _fact(_first_line(_read(root, "proc/sys/kernel/osrelease")))
    return found


def _environment(root: str, kernel: str | None) -> dict[str, Any]:
    """Native, container, VM or WSL, from what such places leave in the file system.

    Containers are checked before VMs: a container on a VM describes the inference host better.
    """
    if any(mark in (kernel or "").lower() for mark in ("microsoft", "wsl")):
        return _environment_of("wsl", "WSL")
    container = _container(root)
    if container is not None:
        return _environment_of("container", container or None)
    cpuinfo = _read(root, "proc/cpuinfo") or ""
    dmi = " ".join(filter(None, (_first_line(_read(root, f"sys/class/dmi/id/{fact}"))
                                 for fact in ("sys_vendor", "product_name", "bios_vendor", "board_vendor"))))
    machine = _virtual_machine(cpuinfo, dmi)
    if machine is not None:
        return _environment_of("virtual_machine", machine or None)
    if dmi or any(line.startswith("flags") for line in cpuinfo.splitlines()):
        return _environment_of("native", None)  # the hardware spoke and named no hypervisor
    return _environment_unknown()


def _container(root: str) -> str | None:
    """The container runtime's name, "" for an unnamed one, None outside a container."""
    if _exists(root, ".dockerenv"):
        return "Docker"
    if _exists(root, "run/.containerenv"):
        return "podman"
    # systemd's convention: the runtime names itself in a file or in init's environment.
    named = _fact(_first_line(_read(root, "run/systemd/container")))
    if named is None:
        environ = (_read(root, "proc/1/environ") or "").split("\0")
        named = next((_fact(entry.partition("=")[2]) for entry in environ if entry.startswith("container=")), None)
    if named is not None:
        return _ENVIRONMENT_NAMES.get(named.lower(), named)
    cgroup = _read(root, "proc/self/cgroup") or ""
    for hint, name in (("docker", "Docker"), ("lxc", "LXC"), ("machine-rkt", "rkt"), ("kubepods", "")):
        if hint in cgroup:
            return name
    return None


def _virtual_machine(cpuinfo: str, dmi: str) -> str | None:
    """The hypervisor's name, "" for an unnamed one, None for no sign of one."""
    if "QEMU Virtual CPU" in cpuinfo or "Common KVM processor" in cpuinfo:
        return "KVM"
    for hint, name in _VM_VENDORS:
        if hint.lower() in dmi.lower() and not (name == "amazon" and ".metal" in dmi):
            return _ENVIRONMENT_NAMES.get(name, name)
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return "" if "hypervisor" in flags.split() else None


def _environment_of(kind: str, name: str | None) -> dict[str, Any]:
    return {"kind": kind, "name": name, "version": None}


def _environment_unknown() -> dict[str, Any]:
    return _environment_of("unknown", None)


def _cpu(root: str) -> dict[str, Any]:
    vendor, model, sockets = _cpuinfo(_read(root, "proc/cpuinfo") or "")
    logical = _count(True)
    physical = _count(False)
    if physical is not None and logical is not None and physical > logical:
        physical = None  # a count that contradicts the other is not a fact
    return {"vendor": vendor, "model": model, "socket_count": sockets,
            "physical_core_count": physical, "logical_thread_count": logical}


def _cpuinfo(text: str) -> tuple[str | None, str | None, int | None]:
    """Vendor, model and socket count (distinct "physical id") from /proc/cpuinfo."""
    vendor = model = arm_model = None
    implementer = None
    sockets: set[str] = set()
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("vendor_id", "vendorId"):
            vendor = vendor or _fact(value)
        elif key in ("model name", "Model Name", "cpu"):
            model = model or _fact(value)
        elif key == "CPU implementer":
            implementer = _integer(value)
            vendor = vendor or _ARM_IMPLEMENTERS.get(implementer or -1)
        elif key == "CPU part" and implementer == 0x41:
            arm_model = arm_model or _ARM_PARTS.get(_integer(value) or -1)
        elif key == "physical id" and value:
            sockets.add(value)
    if model is not None and model.startswith("POWER"):
        vendor = vendor or "IBM"
    return vendor, arm_model or model, len(sockets) or None


def _count(logical: bool) -> int | None:
    try:
        count = psutil.cpu_count(logical=logical)
    except Exception as error:  # psutil.Error, or an OS it does not know
        log.debug("no CPU count: %s", error)
        return None
    return count if count and count > 0 else None


def _memory_capacity(root: str) -> int:
    """Installed RAM, capped by this process's cgroup limit, as llama-swap counts it.

    The kernel's MemTotal leaves out what it reserved; the zones' present pages (less
    device memory) count what is installed, so a 128 GiB box says 128 GiB.
    """
    try:
        total = psutil.virtual_memory().total
    except Exception as error:  # psutil.Error, or an OS it does not know
        log.debug("no memory total: %s", error)
        total = 0
    capacity = max(total, _present_pages(_read(root, "proc/zoneinfo") or "") * mmap.PAGESIZE)
    for limit_file in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        limit = _integer(_first_line(_read(root, limit_file)) or "", base=10)
        if limit and limit < capacity:
            capacity = limit
    return capacity


def _present_pages(zoneinfo: str) -> int:
    pages = 0
    counted = False
    for line in zoneinfo.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == "Node" and fields[2] == "zone":
            counted = fields[3] != "Device"
        elif counted and len(fields) == 2 and fields[0] == "present":
            pages += _integer(fields[1], base=10) or 0
    return pages


def _accelerators(probe: DeviceProbe | None) -> list[dict[str, Any]]:
    """One entry per GPU NVML sees, in NVML's (PCI bus) order; [] without NVML or a GPU."""
    readings = probe.read() if probe is not None else read_devices()
    if not readings:
        return []
    ordered = [readings[index] for index in sorted(readings)]
    driver, details = _nvml_details([reading.index for reading in ordered])
    return [_accelerator(position, reading, driver, *details.get(reading.index, (None, None)))
            for position, reading in enumerate(ordered)]


def _accelerator(position: int, reading: DeviceReading, driver: str | None,
                 power_watts: float | None, architecture: str | None) -> dict[str, Any]:
    capacity = round(reading.total_gib * GIB)
    return {
        "index": position,
        "kind": "gpu",
        "vendor": "NVIDIA",
        "model": _fact(reading.name),
        "architecture": architecture,
        "memory": {"kind": "dedicated", "capacity_bytes": capacity or None},
        "driver": {"name": "NVIDIA", "version": driver} if driver else None,
        "power_limit_watts": power_watts,
    }


def _nvml_details(indexes: list[int]) -> tuple[str | None, dict[int, tuple[float | None, str | None]]]:
    """The driver version, and each device's power limit (W) and architecture, as far as NVML answers.

    Its own NVML session: nvmlInit counts, so this does not close the caller's probe.
    """
    try:
        import pynvml
    except ImportError:
        return None, {}
    if _ask(pynvml.nvmlInit) is _FAILED:
        return None, {}
    try:
        driver = _ask(pynvml.nvmlSystemGetDriverVersion)
        details = {}
        for index in indexes:
            handle = _ask(pynvml.nvmlDeviceGetHandleByIndex, index)
            if handle is _FAILED:
                continue
            milliwatts = _ask(pynvml.nvmlDeviceGetPowerManagementLimit, handle)
            capability = _ask(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
            power = milliwatts / 1000 if isinstance(milliwatts, int | float) and milliwatts > 0 else None
            details[index] = (power, _nvidia_architecture(capability))
    finally:
        _ask(pynvml.nvmlShutdown)
    return (_fact(_text(driver)) if driver is not _FAILED else None), details


def _nvidia_architecture(capability: Any) -> str | None:
    if not (isinstance(capability, tuple) and len(capability) == 2):
        return None
    major, minor = capability
    return _NVIDIA_MINOR_ARCHITECTURES.get((major, minor)) or _NVIDIA_ARCHITECTURES.get(major)


_FAILED = object()


def _ask(call: Any, *arguments: Any) -> Any:
    """One NVML call; `_FAILED` where it cannot answer (NVMLError, or a library too broken to say)."""
    try:
        return call(*arguments)
    except Exception as error:
        log.debug("NVML %s failed: %s", getattr(call, "__name__", call), error)
        return _FAILED


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read(root: str, path: str) -> str | None:
    """A file under `root`; None where it is missing or unreadable."""
    try:
        return Path(root, path).read_text(errors="replace")
    except OSError:
        return None


def _exists(root: str, path: str) -> bool:
    try:
        return Path(root, path).exists()
    except OSError:
        return False


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def _key_values(text: str) -> dict[str, str]:
    """os-release's KEY=value lines, quotes removed."""
    pairs = {}
    for line in text.splitlines():
        key, equals, value = line.partition("=")
        if equals and not key.startswith("#"):
            pairs[key.strip()] = value.strip().strip("\"'")
    return pairs


def _fact(value: str | None) -> str | None:
    """A reported string, or None for an empty or placeholder one ("n/a", "unknown")."""
    value = (value or "").strip()
    return None if value.lower() in ("", "n/a", "unknown") else value


def _integer(text: str, base: int = 0) -> int | None:
    """`text` as an integer (base 0: "0x41" or "65"); None where it is not one."""
    try:
        return int(text.strip(), base)
    except ValueError:
        return None
