"""The hardware snapshot: llama-swap's `GET /api/hardware` shape, and what it says of a machine.

Fake Linux trees (a Debian container, WSL, bare-metal x86, arm64, a VM, nothing at all)
stand in for the machines; psutil and `platform.machine` are told what those machines
would say; a fake `pynvml` stands in for a GPU. The real machine's snapshot is checked
against llama-swap's shapes too.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import mmap
import platform
import re
import sys
import types
from pathlib import Path

import psutil
import pytest

from swaplab.fleet.devices import DeviceProbe
from swaplab.fleet.hardware import detect_hardware

SHAPE = json.loads((Path(__file__).parent / "fixtures/llama-swap-api/shapes.json").read_text())["routes"][
    "GET /api/hardware"
]
GIB = 1024**3


def values_at(payload, path: str) -> list:
    """Every value at a dotted path of shapes.json; `name[]` is every item of the list `name`."""
    values = [payload]
    for step in path.split("."):
        name = step.removesuffix("[]")
        if name:
            missing = [value for value in values if not isinstance(value, dict) or name not in value]
            assert not missing, f"{path}: no {name!r} in {missing}"
            values = [value[name] for value in values]
        if step.endswith("[]"):
            values = [item for value in values for item in value]
    return values


def json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "integer" if isinstance(value, int) else "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


def paths_of(value, prefix: str = "") -> set[str]:
    """The dotted paths of every key in a payload, lists written as `[]`."""
    found = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            found.add(path)
            found |= paths_of(item, path)
    elif isinstance(value, list):
        for item in value:
            found |= paths_of(item, prefix + "[]")
    return found


def assert_llama_swap_shape(snapshot: dict) -> None:
    """What the router serves (the snapshot through JSON) is shaped as llama-swap's: every
    required path, each value of the example's JSON type or null where nullable, enums kept,
    no key llama-swap does not have."""
    served = json.loads(json.dumps(snapshot))
    # A path only in `nullable` (a driver's name) is one whose parent may be null.
    known = list(dict.fromkeys(SHAPE["required"] + SHAPE["optional"] + SHAPE["nullable"]))
    for path in known:
        try:
            expected = {json_type(value) for value in values_at(SHAPE["example"], path)}
        except AssertionError:  # an optional path the example leaves out: its type is not recorded
            expected = None
        if expected and "number" in expected:
            expected.add("integer")  # Go prints a float64 700.0 as 700; an integer stays one
        try:
            values = values_at(served, path)
        except AssertionError:
            if path not in SHAPE["required"]:
                continue
            raise
        for value in values:
            if value is None:
                assert path in SHAPE["nullable"], f"{path} is null"
            elif expected is not None:
                assert json_type(value) in expected, f"{path}: {value!r} is not {expected}"
            if path in SHAPE["enums"]:
                assert value in SHAPE["enums"][path], f"{path}: {value!r}"
    assert paths_of(served) <= set(known)


def fake_tree(root: Path, files: dict[str, str]) -> str:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return str(root)


def x86_cpuinfo(model: str, vendor: str, sockets: list[int], flags: str) -> str:
    return "".join(
        f"processor\t: {number}\nvendor_id\t: {vendor}\ncpu family\t: 25\nmodel\t\t: 17\n"
        f"model name\t: {model}\nphysical id\t: {socket}\ncpu cores\t: 2\nflags\t\t: {flags}\n\n"
        for number, socket in enumerate(sockets)
    )


ARM_CPUINFO = "".join(
    f"processor\t: {number}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes sve2\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\nCPU revision\t: 0\n\n"
    for number in range(4)
)


@pytest.fixture
def machine(monkeypatch):
    """Make this Linux box say what another machine's `uname -m`, psutil would."""

    def pretend(arch: str, physical: int | None, logical: int | None, total: int) -> None:
        monkeypatch.setattr(platform, "system", lambda: "Linux")
        monkeypatch.setattr(platform, "machine", lambda: arch)
        counts = {True: logical, False: physical}
        monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: counts[logical])
        monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=total))

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: `import pynvml` fails
    return pretend


def test_a_debian_box_in_a_docker_container(tmp_path, machine):
    machine("x86_64", physical=16, logical=16, total=128 * GIB)
    root = fake_tree(tmp_path, {
        "etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\n'
                          'VERSION_ID="13"\nID=debian\n',
        "etc/debian_version": "13.0\n",
        "proc/sys/kernel/osrelease": "6.8.0-60-generic\n",
        "proc/cpuinfo": x86_cpuinfo("AMD EPYC 9354 32-Core Processor", "AuthenticAMD", [0] * 16, "fpu sse2 hypervisor"),
        "proc/self/cgroup": "0::/\n",
        ".dockerenv": "",
        "sys/fs/cgroup/memory.max": "17179869184\n",  # the container may use 16 GiB
    })
    snapshot = detect_hardware(root=root)
    assert_llama_swap_shape(snapshot)
    assert snapshot["architecture"] == {"name": "x86_64", "raw_name": None}
    # llama-swap names the distribution by its id and Debian by its point release
    assert snapshot["operating_system"] == {"family": "linux", "name": "debian", "version": "13.0",
                                            "kernel": "6.8.0-60-generic"}
    # the container wins over the hypervisor flag of the VM it runs on
    assert snapshot["environment"] == {"kind": "container", "name": "Docker", "version": None}
    assert snapshot["cpu"] == {"vendor": "AuthenticAMD", "model": "AMD EPYC 9354 32-Core Processor",
                               "socket_count": 1, "physical_core_count": 16, "logical_thread_count": 16}
    assert snapshot["memory"] == {"capacity_bytes": 16 * GIB}
    assert snapshot["accelerators"] == []


def test_a_wsl_box(tmp_path, machine):
    machine("x86_64", physical=8, logical=16, total=32 * GIB)
    root = fake_tree(tmp_path, {
        "etc/os-release": 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\n',
        "etc/debian_version": "bookworm/sid\n",
        "proc/sys/kernel/osrelease": "5.15.153.1-microsoft-standard-WSL2\n",
        "proc/cpuinfo": x86_cpuinfo("Intel(R) Core(TM) i9-13900K", "GenuineIntel", [0, 0], "fpu hypervisor"),
    })
    snapshot = detect_hardware(root=root)
    assert_llama_swap_shape(snapshot)
    assert snapshot["operating_system"] == {"family": "linux", "name": "ubuntu", "version": "22.04",
                                            "kernel": "5.15.153.1-microsoft-standard-WSL2"}
    assert snapshot["environment"] == {"kind": "wsl", "name": "WSL", "version": None}
    assert snapshot["cpu"]["vendor"] == "GenuineIntel"
    assert snapshot["cpu"]["physical_core_count"] == 8
    assert snapshot["cpu"]["logical_thread_count"] == 16
    assert snapshot["memory"] == {"capacity_bytes": 32 * GIB}


def test_a_bare_metal_x86_box_counts_its_installed_ram(tmp_path, machine):
    # The kernel keeps some of the 128 GiB for itself; the zones' present pages still count it.
    machine("x86_64", physical=64, logical=128, total=125 * GIB)
    pages = 128 * GIB // mmap.PAGESIZE
    root = fake_tree(tmp_path, {
        "etc/os-release": 'NAME="Red Hat Enterprise Linux"\nID="rhel"\nVERSION_ID="9.4"\n',
        "proc/sys/kernel/osrelease": "5.14.0-427.el9.x86_64\n",
        "proc/cpuinfo": x86_cpuinfo("Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel", [0, 0, 1, 1], "fpu avx512f"),
        "proc/self/cgroup": "0::/user.slice/user-1000.slice/session-3.scope\n",
        "proc/zoneinfo": f"Node 0, zone      DMA\n  pages free 3\n        present  {pages // 4}\n"
                         f"Node 1, zone   Normal\n        present  {pages - pages // 4}\n        managed  7\n"
                         f"Node 1, zone   Device\n        present  {pages}\n",
        "sys/fs/cgroup/memory.max": "max\n",
        "sys/class/dmi/id/sys_vendor": "Supermicro\n",
        "sys/class/dmi/id/product_name": "SYS-421GE-TNRT\n",
    })
    snapshot = detect_hardware(root=root)
    assert_llama_swap_shape(snapshot)
    assert snapshot["operating_system"]["name"] == "redhat"  # gopsutil's name for rhel
    assert snapshot["operating_system"]["version"] == "9.4"
    assert snapshot["environment"] == {"kind": "native", "name": None, "version": None}
    assert snapshot["cpu"]["socket_count"] == 2
    assert snapshot["cpu"]["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert snapshot["memory"] == {"capacity_bytes": 128 * GIB}


def test_an_arm64_box_names_its_cores_from_the_cpu_part(tmp_path, machine):
    machine("aarch64", physical=72, logical=72, total=480 * GIB)
    root = fake_tree(tmp_path, {
        "etc/os-release": 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\n',
        "proc/sys/kernel/osrelease": "6.8.0-1015-nvidia-64k\n",
        "proc/cpuinfo": ARM_CPUINFO,
        "sys/class/dmi/id/sys_vendor": "NVIDIA\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",  # cgroup v1: no limit
    })
    snapshot = detect_hardware(root=root)
    assert_llama_swap_shape(snapshot)
    assert snapshot["architecture"] == {"name": "arm64", "raw_name": "aarch64"}
    assert snapshot["environment"]["kind"] == "native"
    # no "physical id" on arm: the socket count is unknown, not guessed
    assert snapshot["cpu"] == {"vendor": "ARM", "model": "Neoverse-V2", "socket_count": None,
                               "physical_core_count": 72, "logical_thread_count": 72}
    assert snapshot["memory"] == {"capacity_bytes": 480 * GIB}


@pytest.mark.parametrize(("files", "name"), [
    ({"sys/class/dmi/id/sys_vendor": "QEMU\n", "sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n"},
     "qemu"),
    ({"sys/class/dmi/id/sys_vendor": "Microsoft Corporation\n", "sys/class/dmi/id/product_name": "Virtual Machine\n"},
     "Hyper-V"),
    ({"proc/cpuinfo": x86_cpuinfo("AMD EPYC", "AuthenticAMD", [0], "fpu hypervisor")}, None),  # Firecracker: no DMI
])
def test_a_virtual_machine(tmp_path, machine, files, name):
    machine("x86_64", physical=2, logical=2, total=8 * GIB)
    snapshot = detect_hardware(root=fake_tree(tmp_path, files))
    assert_llama_swap_shape(snapshot)
    assert snapshot["environment"] == {"kind": "virtual_machine", "name": name, "version": None}


def test_what_cannot_be_read_is_null_or_unknown_never_guessed(tmp_path, machine):
    machine("mips64", physical=4, logical=2, total=GIB)  # a physical count above the logical one is no fact
    snapshot = detect_hardware(root=str(tmp_path))
    assert_llama_swap_shape(snapshot)
    assert snapshot["architecture"] == {"name": "other", "raw_name": "mips64"}
    assert snapshot["operating_system"] == {"family": "linux", "name": None, "version": None, "kernel": None}
    assert snapshot["environment"] == {"kind": "unknown", "name": None, "version": None}
    assert snapshot["cpu"] == {"vendor": None, "model": None, "socket_count": None,
                               "physical_core_count": None, "logical_thread_count": 2}


def test_other_operating_systems_are_named_from_the_platform(tmp_path, machine, monkeypatch):
    machine("arm64", physical=10, logical=10, total=64 * GIB)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "mac_ver", lambda: ("15.1", ("", "", ""), "arm64"))
    snapshot = detect_hardware(root=str(tmp_path))
    assert_llama_swap_shape(snapshot)
    assert snapshot["architecture"] == {"name": "arm64", "raw_name": None}
    assert snapshot["operating_system"]["family"] == "macos"
    assert snapshot["operating_system"]["name"] == "macOS"
    assert snapshot["operating_system"]["version"] == "15.1"
    monkeypatch.setattr(platform, "system", lambda: "Haiku")
    snapshot = detect_hardware(root=str(tmp_path))
    assert_llama_swap_shape(snapshot)
    assert snapshot["operating_system"]["family"] == "other"
    assert snapshot["operating_system"]["raw_family"] == "haiku"


def test_this_machine_is_described_in_llama_swaps_shape(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    before = datetime.datetime.now(datetime.UTC)
    snapshot = detect_hardware()
    assert_llama_swap_shape(snapshot)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", snapshot["captured_at"])
    captured = datetime.datetime.strptime(snapshot["captured_at"][:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    assert abs(captured - before) < datetime.timedelta(seconds=10)
    assert snapshot["capture"] == {"scope": "inference_host", "method": "detected",
                                   "detector": {"name": "swaplab", "version": importlib.metadata.version("swaplab")}}
    assert snapshot["memory"]["capacity_bytes"] > 0
    assert snapshot["accelerators"] == []  # no NVML


class FakeNvml(types.ModuleType):
    """`pynvml` as it answers on a box with H200s; NVML's init is counted, as the real one's is."""

    class NVMLError(Exception):
        pass

    def __init__(self, count: int, power_supported: bool = True, driver: str | None = "570.124.06") -> None:
        super().__init__("pynvml")
        self.count, self.power_supported, self.driver, self.opened = count, power_supported, driver, 0

    def nvmlInit(self):
        self.opened += 1

    def nvmlShutdown(self):
        self.opened -= 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=150754820096, used=0, free=150754820096)

    def nvmlSystemGetDriverVersion(self):
        if self.driver is None:
            raise self.NVMLError("Not Supported")
        return self.driver

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        if not self.power_supported:
            raise self.NVMLError("Not Supported")
        return 700000

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (9, 0)


def test_each_gpu_nvml_sees_is_an_accelerator(monkeypatch):
    nvml = FakeNvml(count=2)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = DeviceProbe()
    snapshot = detect_hardware(probe)
    assert_llama_swap_shape(snapshot)
    assert snapshot["accelerators"] == [
        {"index": index, "kind": "gpu", "vendor": "NVIDIA", "model": "NVIDIA H200", "architecture": "Hopper",
         "memory": {"kind": "dedicated", "capacity_bytes": 150754820096},
         "driver": {"name": "NVIDIA", "version": "570.124.06"}, "power_limit_watts": 700.0}
        for index in (0, 1)
    ]
    assert nvml.opened == 1  # the router's probe is still open; detection closed only its own session
    probe.close()
    assert nvml.opened == 0


def test_what_nvml_cannot_say_is_null(monkeypatch):
    nvml = FakeNvml(count=1, power_supported=False, driver=None)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    snapshot = detect_hardware()
    assert_llama_swap_shape(snapshot)
    [gpu] = snapshot["accelerators"]
    assert gpu["driver"] is None
    assert gpu["power_limit_watts"] is None
    assert gpu["memory"]["capacity_bytes"] == 150754820096
    assert nvml.opened == 0


def test_no_gpu_no_accelerators(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(count=0))
    assert detect_hardware()["accelerators"] == []
