"""`swaplab launch doctor`: the RDMA fabric and NCCL's transport, sudo for drop_caches, the image and its entrypoint, free disk.

The fabric is read by the same script doctor runs on every node, here over fake /sys and
/dev trees built in tmp_path: a DGX Spark-like ConnectX-7 box (RoCE, one port cabled), an
InfiniBand box, a box with no HCA, ports down. The transport verdict and the per-host
NCCL table are pure functions of those facts. The rest runs `swaplab launch doctor`
against the loopback cluster of tests/sshd.py (no HCA there: TCP sockets, with the reason).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess
import tomllib
from pathlib import Path
from types import MappingProxyType

import pytest
import sshd as loopback
from sshd import CLUSTER, sim_args

from swaplab.launch import fabric
from swaplab.launch.cluster import get_cluster
from swaplab.launch.doctor import sudo_finding, sudoers_line
from swaplab.launch.findings import GIB
from swaplab.launch.payload import (
    MIN_FREE_DISK_BYTES,
    _arrival,
    disk_finding,
    entrypoint_finding,
    serves_itself,
)
from swaplab.launch.plan import make_plan
from swaplab.launch.recipe import load_recipe
from swaplab.launch.remote import SshTarget
from swaplab.launch.spec import Step

sshd = loopback.sshd
gang = loopback.gang

ZERO_GID = ":".join(["0000"] * 8)
DROP_CACHES = Step("drop-caches", ("sudo", "-n", "sysctl", "-w", "vm.drop_caches=3"), "prepare")


def ipv4_gid(address: str) -> str:
    """The sysfs spelling of an IPv4-mapped GID (::ffff:a.b.c.d)."""
    a, b, c, d = (int(part) for part in address.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"


def write_port(root: Path, hca: str, port: int = 1, *, state: str = "4: ACTIVE", physical: str = "5: LinkUp",
               link_layer: str = "Ethernet", rate: str = "200 Gb/sec (4X HDR)", netdev: str | None = None,
               gids: tuple[tuple[str, str, str], ...] = ()) -> None:
    """One HCA port as sysfs shows it: attributes, a GID table (unused entries all zeros, with no
    type or netdev to read), and the PCI function's netdev."""
    base = root / "sys/class/infiniband" / hca
    folder = base / "ports" / str(port)
    for name, value in (("state", state), ("phys_state", physical), ("link_layer", link_layer), ("rate", rate)):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(value + "\n")
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for index in range(8):
        address, kind, device = gids[index] if index < len(gids) else (ZERO_GID, "", "")
        (folder / "gids" / str(index)).write_text(address + "\n")
        if kind:
            (folder / "gid_attrs/types" / str(index)).write_text(kind + "\n")
            (folder / "gid_attrs/ndevs" / str(index)).write_text(device + "\n")
    if netdev:
        (base / "device/net" / netdev).mkdir(parents=True, exist_ok=True)
        (base / "device/net" / netdev / "operstate").write_text("up\n" if state.endswith("ACTIVE") else "down\n")


def roce_gids(netdev: str, address: str | None) -> tuple[tuple[str, str, str], ...]:
    """A mlx5 RoCE port's GID table: link-local v1 and v2, then v1 and v2 of the IPv4 address."""
    link_local = "fe80:0000:0000:0000:0a5c:2bff:fe00:0001"
    gids = ((link_local, "IB/RoCE v1", netdev), (link_local, "RoCE v2", netdev))
    if address:
        gids += ((ipv4_gid(address), "IB/RoCE v1", netdev), (ipv4_gid(address), "RoCE v2", netdev))
    return gids


def write_devices(root: Path, *names: str) -> None:
    (root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / "dev/infiniband" / name).write_text("")


def spark_tree(root: Path, *, fabric_ip: str = "192.168.100.3", cabled: bool = True) -> Path:
    """A DGX Spark: a ConnectX-7 seen as four RoCE HCAs; the second port (f1) cabled to the peer."""
    for hca, netdev, up in (
        ("rocep1s0f0", "enp1s0f0np0", False), ("rocep1s0f1", "enp1s0f1np1", cabled),
        ("roceP2p1s0f0", "enP2p1s0f0np0", False), ("roceP2p1s0f1", "enP2p1s0f1np1", cabled),
    ):
        address = (fabric_ip if hca == "rocep1s0f1" else "192.168.101.3") if up else None
        write_port(root, hca, state="4: ACTIVE" if up else "1: DOWN", physical="5: LinkUp" if up else "3: Disabled",
                   netdev=netdev, gids=roce_gids(netdev, address))
    write_devices(root, "rdma_cm", "uverbs0", "uverbs1", "uverbs2", "uverbs3")
    return root


def spark_addresses(fabric_ip: str = "192.168.100.3") -> MappingProxyType:
    return MappingProxyType({
        "lo": ("127.0.0.1/8",), "enP7s7": ("10.0.0.3/24",), "enp1s0f1np1": (f"{fabric_ip}/24",),
        "enP2p1s0f1np1": ("192.168.101.3/24",),
    })


def with_host(node: fabric.NodeFabric, addresses=None, memlock: float = math.inf, **more) -> fabric.NodeFabric:
    """The tree's facts with the machine-wide ones (addresses, limits) of the box it stands for."""
    return dataclasses.replace(node, addresses=addresses or spark_addresses(), memlock=memlock, **more)


def host_access(node: fabric.NodeFabric) -> fabric.RankAccess:
    return fabric.rank_access(None, node)


# -- the fabric, read from fake trees --------------------------------------------------------


def test_a_spark_roce_box_gives_its_cabled_ports_netdevs_and_the_ipv4_roce_v2_gid(tmp_path):
    node = fabric.read_fabric(spark_tree(tmp_path))
    assert node.hcas == ("roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1")
    by_name = {port.name: port for port in node.ports}
    port = by_name["rocep1s0f1:1"]
    assert (port.state, port.physical_state, port.link_layer, port.netdev) == ("ACTIVE", "LinkUp", "Ethernet", "enp1s0f1np1")
    assert [(gid.index, gid.ipv4) for gid in port.roce_v2_ipv4()] == [(3, "192.168.100.3")]
    assert len(port.gids) == 4, "unused (all-zero) GIDs are left out"
    assert by_name["rocep1s0f0:1"].state == "DOWN" and by_name["rocep1s0f0:1"].roce_v2_ipv4() == ()
    assert node.verbs and node.devices == ("rdma_cm", "uverbs0", "uverbs1", "uverbs2", "uverbs3")

    node = with_host(node)
    assert fabric.nccl_overrides(node, "192.168.100.3") == {
        "NCCL_IB_HCA": "rocep1s0f1", "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_GID_INDEX": "3",
    }
    transport = fabric.nccl_transport(node, {}, host_access(node), host="dgx3", fabric_ip="192.168.100.3")
    assert (transport.kind, transport.gid_index, transport.cause, transport.problems) == ("RoCE", 3, None, ())
    assert [port.name for port in transport.ports] == ["rocep1s0f1:1", "roceP2p1s0f1:1"]
    assert transport.describe().startswith("RoCE over rocep1s0f1:1 (enp1s0f1np1), roceP2p1s0f1:1 (enP2p1s0f1np1), GID index 3")
    described = fabric.describe_fabric(node)
    assert "rocep1s0f1:1 ACTIVE RoCE 200 Gb/sec (4X HDR) on enp1s0f1np1, RoCE v2 GID 3 = 192.168.100.3" in described
    assert "rocep1s0f0:1 DOWN RoCE" in described and "memlock unlimited" in described


def test_the_cluster_settings_narrow_or_break_the_transport(tmp_path):
    node = with_host(fabric.read_fabric(spark_tree(tmp_path)))
    access = host_access(node)

    def verdict(**env: str) -> fabric.Transport:
        return fabric.nccl_transport(node, env, access, host="dgx3", fabric_ip="192.168.100.3")

    assert [port.name for port in verdict(NCCL_IB_HCA="rocep1s0f1").ports] == ["rocep1s0f1:1"]
    assert [port.name for port in verdict(NCCL_IB_HCA="^rocep1s0f1").ports] == ["roceP2p1s0f1:1"]
    socket = verdict(NCCL_NET="Socket")
    assert (socket.kind, socket.cause) == ("TCP sockets", None) and "NCCL_NET=Socket" in socket.reason
    assert verdict(NCCL_IB_DISABLE="1").kind == "TCP sockets"

    wrong_hca = verdict(NCCL_IB_HCA="mlx5_0")
    assert wrong_hca.kind == "TCP sockets" and wrong_hca.cause is not None
    assert "NCCL_IB_HCA=mlx5_0 matches none of dgx3's HCAs" in wrong_hca.cause.what
    assert wrong_hca.cause.fix == 'set NCCL_IB_HCA = "rocep1s0f1" in [hosts.dgx3.nccl]'

    down = verdict(NCCL_IB_HCA="rocep1s0f0")
    assert down.kind == "TCP sockets" and "no selected HCA port is up (rocep1s0f0:1 DOWN (Disabled))" in down.reason
    assert down.cause is not None and down.cause.fix == 'set NCCL_IB_HCA = "rocep1s0f1" in [hosts.dgx3.nccl]'

    other_interface = verdict(NCCL_SOCKET_IFNAME="enP7s7")
    assert other_interface.kind == "RoCE"
    assert [problem.fix for problem in other_interface.problems] == ['set NCCL_SOCKET_IFNAME = "enp1s0f1np1" in [hosts.dgx3.nccl]']
    missing_interface = verdict(NCCL_SOCKET_IFNAME="eth9")
    assert "NCCL_SOCKET_IFNAME=eth9 matches no interface of dgx3" in missing_interface.problems[0].what

    wrong_gid = verdict(NCCL_IB_GID_INDEX="0")
    assert wrong_gid.kind == "RoCE"
    assert "GID 0 of rocep1s0f1:1 is IB/RoCE v1 fe80" in wrong_gid.problems[0].what
    assert wrong_gid.problems[0].fix == 'set NCCL_IB_GID_INDEX = "3" in [hosts.dgx3.nccl]'
    assert verdict(NCCL_IB_GID_INDEX="3").problems == ()

    elsewhere = fabric.nccl_transport(node, {}, access, host="dgx3", fabric_ip="192.168.100.9")
    assert "fabric_ip 192.168.100.9 is not an address of dgx3" in elsewhere.problems[0].what


def test_a_box_whose_ports_are_all_down_falls_back_to_sockets_and_says_how_to_bring_them_up(tmp_path):
    node = with_host(fabric.read_fabric(spark_tree(tmp_path, cabled=False)))
    transport = fabric.nccl_transport(node, {}, host_access(node), host="dgx3", fabric_ip="10.0.0.3")
    assert transport.kind == "TCP sockets" and transport.cause is not None
    assert transport.reason.startswith("no selected HCA port is up (") and "rocep1s0f1:1 DOWN (Disabled)" in transport.reason
    assert "bring the link up" in transport.cause.fix and "`ip link set DEV up` for the cabled one of " in transport.cause.fix
    assert "enp1s0f1np1" in transport.cause.fix
    assert "NCCL_IB_HCA" not in fabric.nccl_overrides(node, "10.0.0.3")


def test_an_infiniband_box_uses_its_active_ports_and_names_them_exactly(tmp_path):
    ib_gid = (("fe80:0000:0000:0000:b83f:d203:00a1:0001", "IB/RoCE v1", ""),)
    write_port(tmp_path, "mlx5_1", link_layer="InfiniBand", rate="400 Gb/sec (4X NDR)", netdev="ib0", gids=ib_gid)
    write_port(tmp_path, "mlx5_10", link_layer="InfiniBand", state="1: DOWN", physical="2: Polling", netdev="ib1")
    write_devices(tmp_path, "uverbs0", "uverbs1")
    node = with_host(fabric.read_fabric(tmp_path), addresses=MappingProxyType({"ib0": ("10.10.0.5/16",), "eno1": ("172.16.0.5/24",)}))
    transport = fabric.nccl_transport(node, {}, host_access(node), host="gpu5", fabric_ip="10.10.0.5")
    assert (transport.kind, [port.name for port in transport.ports], transport.gid_index) == ("InfiniBand", ["mlx5_1:1"], None)
    # NCCL matches HCA names by prefix: mlx5_1 would take mlx5_10 too, so the list is exact ("=").
    assert fabric.nccl_overrides(node, "10.10.0.5") == {"NCCL_IB_HCA": "=mlx5_1", "NCCL_SOCKET_IFNAME": "ib0"}
    assert [port.name for port in fabric.nccl_transport(
        node, {"NCCL_IB_HCA": "=mlx5_1"}, host_access(node), host="gpu5", fabric_ip="10.10.0.5").ports] == ["mlx5_1:1"]


def test_a_box_without_an_hca_uses_tcp_sockets_and_that_is_no_fault(tmp_path):
    node = with_host(fabric.read_fabric(tmp_path), addresses=MappingProxyType({"lo": ("127.0.0.1/8",), "eth0": ("10.1.0.7/24",)}))
    assert (node.hcas, node.ports, node.devices) == ((), (), None)
    transport = fabric.nccl_transport(node, {"NCCL_SOCKET_IFNAME": "eth0"}, host_access(node), host="box", fabric_ip="10.1.0.7")
    assert transport.describe() == "TCP sockets over eth0: no RDMA device on box (no /sys/class/infiniband)"
    assert (transport.cause, transport.problems) == (None, ())
    assert fabric.describe_fabric(node) == "no RDMA device (no /sys/class/infiniband); memlock unlimited"
    assert fabric.nccl_overrides(node, "10.1.0.7") == {"NCCL_SOCKET_IFNAME": "eth0"}


def test_no_uverbs_device_means_no_program_can_open_the_hca(tmp_path):
    spark_tree(tmp_path)
    shutil.rmtree(tmp_path / "dev/infiniband")
    node = with_host(fabric.read_fabric(tmp_path))
    transport = fabric.nccl_transport(node, {}, host_access(node), host="dgx3", fabric_ip="192.168.100.3")
    assert transport.kind == "TCP sockets" and "no /dev/infiniband/uverbs*" in transport.reason
    assert transport.cause is not None and "modprobe ib_uverbs" in transport.cause.fix


def test_a_container_needs_the_devices_and_an_unlimited_memlock(tmp_path):
    node = with_host(fabric.read_fabric(spark_tree(tmp_path)), dockerd_memlock=8 << 20)
    image = "vllm/vllm-openai:v0.11.0"
    plain = ["docker", "run", "--rm", "--gpus", "all", "--network", "host", image, "serve", "--device", "/dev/infiniband"]

    def verdict(argv: list[str]) -> fabric.Transport:
        access = fabric.rank_access(argv, node, image)
        return fabric.nccl_transport(node, {}, access, host="dgx3", fabric_ip="192.168.100.3")

    # The server's own --device after the image is not docker's.
    no_devices = verdict(plain)
    assert no_devices.kind == "TCP sockets" and no_devices.cause is not None
    assert "the rank's container gets no /dev/infiniband" in no_devices.reason
    assert "--device /dev/infiniband --ulimit memlock=-1" in no_devices.cause.fix

    inherited = verdict(plain[:3] + ["--device", "/dev/infiniband"] + plain[3:])
    assert inherited.kind == "RoCE"
    assert [problem.what.split(":")[0] for problem in inherited.problems] == [
        "memlock 8 MiB for the ranks (the Docker daemon's own limit, which containers inherit)"
    ]
    assert "--ulimit memlock=-1" in inherited.problems[0].fix

    fixed = verdict(plain[:3] + ["--device=/dev/infiniband", "--ulimit", "memlock=-1:-1"] + plain[3:])
    assert (fixed.kind, fixed.problems) == ("RoCE", ())
    privileged = verdict(plain[:3] + ["--privileged"] + plain[3:])
    assert privileged.kind == "RoCE" and privileged.problems  # still the daemon's 8 MiB
    defaults = dataclasses.replace(node, docker_default_memlock=math.inf)
    access = fabric.rank_access(plain[:3] + ["--privileged"] + plain[3:], defaults, image)
    assert (access.memlock, access.memlock_source) == (math.inf, "default-ulimits of /etc/docker/daemon.json")

    process = fabric.nccl_transport(
        with_host(node, memlock=64 << 10), {}, host_access(with_host(node, memlock=64 << 10)), host="dgx3", fabric_ip="192.168.100.3"
    )
    assert process.problems[0].what.startswith("memlock 64 KiB for the ranks (`ulimit -l` of the ssh user)")
    assert "/etc/security/limits.d/" in process.problems[0].fix


def test_the_per_host_table_is_toml_the_clusters_file_can_hold(tmp_path):
    dgx3 = with_host(fabric.read_fabric(spark_tree(tmp_path / "dgx3")))
    dgx4 = with_host(fabric.read_fabric(spark_tree(tmp_path / "dgx4", fabric_ip="192.168.100.4")),
                     addresses=spark_addresses("192.168.100.4"))
    text = fabric.overrides_toml({
        "dgx3": fabric.nccl_overrides(dgx3, "192.168.100.3"),
        "dgx4": fabric.nccl_overrides(dgx4, "192.168.100.4"),
        "127.0.0.1": {"NCCL_SOCKET_IFNAME": "lo"},
        "bare": {},
    })
    assert text == (
        '[hosts.dgx3.nccl]\nNCCL_IB_HCA = "rocep1s0f1"\nNCCL_SOCKET_IFNAME = "enp1s0f1np1"\nNCCL_IB_GID_INDEX = "3"\n\n'
        '[hosts.dgx4.nccl]\nNCCL_IB_HCA = "rocep1s0f1"\nNCCL_SOCKET_IFNAME = "enp1s0f1np1"\nNCCL_IB_GID_INDEX = "3"\n\n'
        '[hosts."127.0.0.1".nccl]\nNCCL_SOCKET_IFNAME = "lo"'
    )
    assert tomllib.loads(text)["hosts"]["127.0.0.1"]["nccl"] == {"NCCL_SOCKET_IFNAME": "lo"}


def test_ip_addresses_and_limits_are_read_from_the_listing():
    lines = (
        "has\tip",
        "ip\t1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever",
        "ip\t4: eth0@if12    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever",
        "memlock\tunlimited",
        "dockerd\tMax locked memory         8388608              8388608              bytes",
        'daemon.json\t{"default-ulimits": {"memlock": {"Name": "memlock", "Soft": -1, "Hard": -1}}}',
        "ibdev2netdev\tmlx5_0 port 1 ==> ib0 (Up)",
        "/sys/class/infiniband/mlx5_0/ports/1/state\t4: ACTIVE",
        "/sys/class/infiniband/mlx5_0/ports/1/link_layer\tInfiniBand",
    )
    node = fabric.parse_fabric("\n".join(lines))
    assert dict(node.addresses) == {"lo": ("127.0.0.1/8",), "eth0": ("192.0.2.2/24",)}
    assert (node.memlock, node.dockerd_memlock, node.docker_default_memlock) == (math.inf, 8 << 20, math.inf)
    assert node.ports[0].netdev == "ib0" and node.devices is None and not node.verbs
    # Linux answers all of 127/8 on lo: the loopback nodes 127.0.0.1 and 127.0.0.2 are both on lo.
    assert fabric.interface_of(node, "127.0.0.2") == "lo" and fabric.interface_of(node, "192.0.2.2") == "eth0"
    assert fabric.interface_of(node, "192.0.2.3") is None
    assert fabric.parse_fabric("memlock\t8192").memlock == 8 << 20


async def test_the_node_script_reads_the_same_tree_over_ssh(tmp_path, sshd):
    spark_tree(tmp_path / "tree")
    target = SshTarget("127.0.0.2", port=sshd.port, user=sshd.user, options=sshd.ssh_options)
    there = await fabric.gather_fabric(target, str(tmp_path / "tree"))
    here = fabric.read_fabric(tmp_path / "tree")
    assert there == here and len(there.ports) == 4


# -- sudo, disk --------------------------------------------------------------------------------


def test_the_sudoers_line_allows_exactly_the_plan_command_escaped_the_sudoers_way():
    assert sudoers_line("giovanni", "/usr/sbin/sysctl", ("-w", "vm.drop_caches=3")) == \
        "giovanni ALL=(root) NOPASSWD: /usr/sbin/sysctl -w vm.drop_caches\\=3"


@pytest.mark.parametrize(("output", "ok", "detail", "fix"), [
    ("user giovanni\npath /usr/sbin/sysctl\nsudo command\n", True,
     "password-less sudo for `sudo -n sysctl -w vm.drop_caches=3` (drop-caches, drop_caches = true)", ""),
    ("user giovanni\npath /usr/sbin/sysctl\nsudo denied sudo: a password is required\n", False,
     "sudo asks for a password (sudo: a password is required), and `up` runs `sudo -n sysctl -w vm.drop_caches=3`",
     "on dgx3, `sudo visudo -f /etc/sudoers.d/swaplab` and add `giovanni ALL=(root) NOPASSWD: /usr/sbin/sysctl -w vm.drop_caches\\=3`"),
    ("user root\npath /sbin/sysctl\nsudo missing\n", False, "sudo is not installed, and `up` runs `sudo -n sysctl",
     ("install sudo on dgx3 (`apt-get install sudo`) and allow that command in /etc/sudoers.d/swaplab: "
      "`root ALL=(root) NOPASSWD: /sbin/sysctl -w vm.drop_caches\\=3`")),
])
def test_the_sudo_finding_says_what_and_how(tmp_path, output, ok, detail, fix):
    recipe = load_recipe(Path(__file__).parent / "fixtures/launch/glm53-flash-exl3")
    finding = sudo_finding(recipe, "dgx3", DROP_CACHES, output)
    assert (finding.ok, finding.host, finding.check) == (ok, "dgx3", "sudo")
    assert finding.detail.startswith(detail)
    assert finding.fix.startswith(fix)
    if not ok:
        assert finding.fix.endswith(f"or set drop_caches = false in {recipe.path}")


def test_free_disk_is_weighed_against_what_of_the_model_is_still_to_come():
    assert disk_finding("a", "/hub", 100 * GIB, None, None).detail == "100.0 GiB free at /hub"
    present = disk_finding("a", "/hub", 100 * GIB, 60 * GIB, 60 * GIB)
    assert present.ok and present.detail == "100.0 GiB free at /hub (the model is there)"
    partial = disk_finding("a", "/hub", 100 * GIB, 20 * GIB, 60 * GIB)
    assert partial.ok and partial.detail.endswith("the model needs 40.0 GiB more there (60.0 GiB in all)")
    short = disk_finding("a", "/cache", 30 * GIB, None, 160 * GIB, mirror=True)
    assert not short.ok and short.fix.startswith("free 130.0 GiB there") and "local_cache_dir" in short.fix
    assert not disk_finding("a", "/hub", MIN_FREE_DISK_BYTES - 1, None, None).ok


# -- the image's entrypoint ------------------------------------------------------------------


@pytest.mark.parametrize(("entrypoint", "serves"), [
    (["vllm", "serve"], True),  # vllm/vllm-openai
    (["/usr/local/bin/vllm", "serve"], True),
    (["python3", "-m", "vllm.entrypoints.openai.api_server"], True),  # older vllm/vllm-openai
    (["/usr/bin/python3.12", "-u", "-m", "sglang.launch_server"], True),
    (["sglang", "serve"], True),
    (["/app/llama-server"], True),  # ghcr.io/ggml-org/llama.cpp:server
    (["/opt/nvidia/nvidia_entrypoint.sh"], False),  # NGC: execs the command it is given
    ([], False),
    (["/bin/bash"], False),
    (["sh", "-c", 'exec "$@"', "--"], False),
    (["/usr/bin/tini", "--"], False),
    (["python3", "-m", "http.server"], False),
    (["python3"], False),
    (["/app/tools.sh"], False),  # llama.cpp:full's dispatcher, not a server by itself
])
def test_an_entrypoint_serves_itself_when_it_is_a_server_program_or_module(entrypoint, serves):
    assert serves_itself(entrypoint) is serves


def container_recipe(folder: Path, *lines: str):
    folder.mkdir()
    (folder / "recipe.toml").write_text("\n".join([
        'engine = "vllm"', 'docker_image = "vllm/vllm-openai:v0.11.0"', 'model = "Qwen/Qwen3-8B"',
        "required_nodes = 2", "tensor_parallel_size = 2", *lines, "",
    ]))
    return load_recipe(folder)


def test_an_image_whose_entrypoint_is_the_server_fails_until_the_recipe_replaces_it(tmp_path):
    recipe = container_recipe(tmp_path / "plain")
    assert not recipe.replace_image_entrypoint  # vllm's default, for NGC images
    doubled = entrypoint_finding(recipe, "dgx3", '["vllm","serve"]\n')
    assert (doubled.ok, doubled.host, doubled.check) == (False, "dgx3", "image")
    assert doubled.detail == (
        "vllm/vllm-openai:v0.11.0: entrypoint `vllm serve` is a server itself; the server command after the image "
        "would become its arguments (replace_image_entrypoint = false)"
    )
    assert doubled.fix.startswith(f"set replace_image_entrypoint = true in {recipe.path}")

    fixed = entrypoint_finding(container_recipe(tmp_path / "fixed", "replace_image_entrypoint = true"), "dgx3", '["vllm","serve"]\n')
    assert fixed.ok, fixed
    assert fixed.detail == (
        "vllm/vllm-openai:v0.11.0: entrypoint `vllm serve`, replaced by the server command (replace_image_entrypoint = true)"
    )


@pytest.mark.parametrize(("output", "shown"), [
    ('["/opt/nvidia/nvidia_entrypoint.sh"]\n', "entrypoint `/opt/nvidia/nvidia_entrypoint.sh`"),
    ("null\n", "no entrypoint"),
    ("[]\n", "no entrypoint"),
])
def test_a_wrapper_or_no_entrypoint_leaves_the_server_command_after_the_image(tmp_path, output, shown):
    finding = entrypoint_finding(container_recipe(tmp_path / "plain"), "dgx3", output)
    assert finding.ok, finding
    assert finding.detail == (
        f"vllm/vllm-openai:v0.11.0: {shown}, the server command follows the image (replace_image_entrypoint = false)"
    )


def test_an_entrypoint_doctor_cannot_read_is_said_not_failed(tmp_path):
    finding = entrypoint_finding(container_recipe(tmp_path / "plain"), "dgx3", "template: :1: unexpected\n")
    assert finding.ok and finding.detail == "vllm/vllm-openai:v0.11.0: entrypoint not checked, unreadable ('template: :1: unexpected')"


# -- doctor on the loopback cluster --------------------------------------------------------


def test_doctor_on_the_loopback_cluster_says_tcp_sockets_and_prints_the_table(gang):
    gang.recipe(sim_args())
    result = gang.launch("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for address in ("127.0.0.1", "127.0.0.2"):
        assert f"ok    {address:<16} rdma     no RDMA device (no /sys/class/infiniband); memlock " in result.stdout
        verdict = next(line for line in lines if line.startswith(f"ok    {address:<16} nccl     NCCL: "))
        assert verdict.endswith(f": no RDMA device on {address} (no /sys/class/infiniband)"), verdict
        assert "TCP sockets over " in verdict
    assert 'ok    all              image    none: engine = "process" runs the recipe\'s args on each node, no container' in lines
    table = result.stdout.split("per-host NCCL settings for the clusters file, from what each node has:\n", 1)[1]
    assert table.startswith('[hosts."127.0.0.1".nccl]\nNCCL_SOCKET_IFNAME = "lo"\n\n[hosts."127.0.0.2".nccl]\nNCCL_SOCKET_IFNAME = "lo"\n')
    assert "sudo" not in result.stdout  # engine = "process" drops no caches by default


def _sudo_state() -> str:
    """This machine's own answer, found without doctor: missing, ok or denied."""
    if shutil.which("sudo") is None:
        return "missing"
    done = subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False, stdin=subprocess.DEVNULL)
    return "ok" if done.returncode == 0 else "denied"


def test_doctor_checks_password_less_sudo_when_drop_caches_is_on(gang):
    path = gang.recipe(sim_args())
    path.write_text("drop_caches = true\n" + path.read_text())
    result = gang.launch("doctor")
    lines = [line for line in result.stdout.splitlines() if line.startswith(("ok    127.0.0.2        sudo", "FAIL  127.0.0.2        sudo"))]
    assert len(lines) == 1, result.stdout
    state = _sudo_state()
    if state == "ok":
        assert lines[0].startswith("ok    127.0.0.2        sudo     password-less sudo for `sudo -n sysctl -w vm.drop_caches=3`")
        assert result.returncode == 0, result.stdout
    else:
        expected = "sudo is not installed" if state == "missing" else "sudo asks for a password"
        assert lines[0].startswith(f"FAIL  127.0.0.2        sudo     {expected}"), lines
        assert "NOPASSWD: " in result.stdout and "vm.drop_caches\\=3`" in result.stdout
        assert result.returncode == 1


def test_doctor_refuses_a_container_recipe_on_loopback_addresses_as_up_would(tmp_path, sshd):
    clusters = loopback.write_cluster(tmp_path, sshd)
    folder = tmp_path / "vllm-loop"
    folder.mkdir()
    (folder / "recipe.toml").write_text(
        'engine = "vllm"\ndocker_image = "vllm/vllm-openai:v0.11.0"\nmodel = "Qwen/Qwen3-8B"\nrequired_nodes = 2\ntensor_parallel_size = 2\n'
    )
    result = subprocess.run(
        [*loopback.SWAPLAB, "launch", "doctor", str(folder), "--cluster", CLUSTER, "--clusters", str(clusters)],
        capture_output=True, text=True, timeout=240, check=False, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1
    assert "FAIL  loop             plan     host 127.0.0.1 of cluster 'loop' has the loopback fabric_ip 127.0.0.1" in result.stdout



def test_up_refuses_before_starting_anything_when_drop_caches_needs_a_sudo_it_cannot_have(gang):
    if _sudo_state() == "ok":
        pytest.skip("sudo -n works on this machine: drop-caches would run, not be refused")
    path = gang.recipe(sim_args())
    path.write_text("drop_caches = true\n" + path.read_text())
    up = gang.launch("up", timeout=120)
    assert up.returncode == 2, up.stderr
    assert "preflight failed:" in up.stderr and "127.0.0.1: sudo " in up.stderr and "NOPASSWD: " in up.stderr
    assert "starting rank" not in up.stderr and "[rank " not in up.stdout


@pytest.mark.parametrize(("cluster_lines", "arrivals"), [
    # The default: fetched on the head, each worker copies it.
    ("", ["downloads it", "copies it from the head", "copies it from the head", "copies it from the head"]),
    # One NAS: the head fetches into it for everyone, and offline that is a fetch too.
    ('hf_cache_shared = true\n', ["downloads it"] + ["downloads it to the head, into the cache every node shares"] * 3),
    ('download = "here"\n', ["sends it from here"] * 4),
    ('download = "here"\nhf_cache_shared = true\n',
     ["sends it from here"] + ["sends it from here to the head, into the cache every node shares"] * 3),
])
def test_doctor_says_how_a_missing_model_will_arrive_as_the_plan_brings_it(tmp_path, cluster_lines, arrivals):
    fixtures = Path(__file__).parent / "fixtures" / "launch"
    text = (fixtures / "clusters.toml").read_text().replace("[clusters.ds4x4]\n", "[clusters.ds4x4]\n" + cluster_lines)
    (tmp_path / "clusters.toml").write_text(text)
    plan = make_plan(load_recipe(fixtures / "qwen-sglang-tp4"), get_cluster(tmp_path / "clusters.toml", "ds4x4"), run_id="r")
    said = [_arrival(node, plan.nodes[0]) for node in plan.nodes]
    assert [how for how, _ in said] == arrivals
    # Only a fetch from the hub is what HF_HUB_OFFLINE forbids.
    assert [fetches for _, fetches in said] == [how.startswith("downloads") for how in arrivals]
