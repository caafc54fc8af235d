"""The clusters file's per-host NCCL tables and container options, and what reaches a rank:
faults at their lines, host settings over the cluster's, and doctor's verdict on the fake
DGX Spark tree seeing both (the host's HCA, and the container's /dev/infiniband)."""

from __future__ import annotations

from pathlib import Path

from test_launch_doctor import spark_addresses, spark_tree, with_host
from test_launch_recipe import faults_of
from test_launch_recipe import write as write_file

from swaplab.launch import fabric
from swaplab.launch.cluster import get_cluster, load_clusters
from swaplab.launch.doctor import _fabric_findings
from swaplab.launch.plan import make_plan
from swaplab.launch.recipe import load_recipe

FIXTURES = Path(__file__).parent / "fixtures" / "launch"
SEED = FIXTURES / "glm53-flash-exl3" / "recipe.toml"
SPARKS = """\
[clusters.ds4]
hosts = [{ name = "dgx3", fabric_ip = "192.168.100.3" },
         { name = "dgx4", fabric_ip = "192.168.100.4" }]
"""


def write(tmp_path: Path, text: str, name: str = "clusters.toml") -> Path:
    """A clusters file (or, named, a recipe) in `tmp_path`."""
    return write_file(tmp_path, text, name)


def test_per_host_nccl_tables_load_for_the_hosts_of_each_cluster_quoted_names_too(tmp_path):
    path = write(tmp_path, SPARKS + """\
[clusters.loop]
hosts = [{ name = "127.0.0.1", fabric_ip = "127.0.0.1" }]
[nccl.ds4]
NCCL_SOCKET_IFNAME = "enp1s0f1np1"
NCCL_IB_HCA = "rocep1s0f1"
[hosts.dgx4.nccl]
NCCL_IB_HCA = "roceP2p1s0f1"
[hosts."127.0.0.1".nccl]
NCCL_SOCKET_IFNAME = "lo"
""")
    clusters = load_clusters(path)
    ds4, loop = clusters["ds4"], clusters["loop"]
    assert ds4.host_nccl == {"dgx4": {"NCCL_IB_HCA": "roceP2p1s0f1"}}
    assert ds4.nccl_of(ds4.hosts[0]) == {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1"}
    assert ds4.nccl_of(ds4.hosts[1]) == {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "roceP2p1s0f1"}
    assert loop.host_nccl == {"127.0.0.1": {"NCCL_SOCKET_IFNAME": "lo"}}
    assert ds4.uses_rdma and not loop.uses_rdma


def test_every_fault_of_host_tables_rdma_and_container_options_at_its_line(tmp_path):
    path = write(tmp_path, SPARKS + """\
rdma = "yes"

[clusters.ds4.container]
devices = ["dev/infiniband", "/dev/x"]
ulimits = { memlock = "-1:-1", nofile = "65536:1024", bogus = "1:1", stack = "big" }
cap_add = ["ipc_lock"]
user = "root user"
privileged = "no"
read_only_mounts = ["/a:b"]
extra = 1

[hosts.dgx3.nccl]
NCCL_IB_HCA = "rocep1s0f1"
NCCL_IB_GID_INDEX = 3

[hosts.dgx9.nccl]
NCCL_IB_HCA = "x"

[hosts.dgx4]
other = 2
""")
    assert faults_of(load_clusters, path) == [
        f"{path}:4: clusters.ds4.rdma must be true or false, not a string 'yes'",
        (f"{path}:7: clusters.ds4.container.devices must be an array of absolute host device paths, not an array "
         "['dev/infiniband', '/dev/x']: 'dev/infiniband' is not an absolute host path (such as /dev/infiniband)"),
        (f"{path}:8: clusters.ds4.container.ulimits.nofile must be \"SOFT:HARD\" (numbers, -1 for unlimited), "
         "not a string '65536:1024': the soft limit is above the hard one"),
        (f"{path}:8: unknown ulimit 'bogus'; docker knows core, cpu, data, fsize, locks, memlock, msgqueue, nice, "
         "nofile, nproc, rss, rtprio, rttime, sigpending, stack"),
        (f"{path}:8: clusters.ds4.container.ulimits.stack must be \"SOFT:HARD\" (numbers, -1 for unlimited), "
         "not a string 'big': write SOFT:HARD, each a number or -1 (unlimited)"),
        (f"{path}:9: clusters.ds4.container.cap_add must be an array of capability names such as \"IPC_LOCK\", not an "
         "array ['ipc_lock']: 'ipc_lock' is not a capability name (uppercase letters and _, such as IPC_LOCK)"),
        (f"{path}:10: clusters.ds4.container.user must be \"UID:GID\" or a user name, not a string 'root user': "
         "write UID:GID, a user name, or NAME:GROUP"),
        f"{path}:11: clusters.ds4.container.privileged must be true or false, not a string 'no'",
        (f"{path}:12: clusters.ds4.container.read_only_mounts must be an array of \"HOST:CONTAINER\" absolute paths, "
         "not an array ['/a:b']: '/a:b' is not HOST:CONTAINER with both paths absolute"),
        (f"{path}:13: unknown key 'extra' in clusters.ds4.container; known keys: devices, ulimits, cap_add, user, "
         "privileged, read_only_mounts"),
        f"{path}:17: hosts.dgx3.nccl.NCCL_IB_GID_INDEX must be a string, not an integer; quote it",
        (f"{path}:19: no cluster has a host named 'dgx9' (the NAME of [hosts.NAME] is a host's name); "
         "known hosts: dgx3, dgx4"),
        f"{path}:23: unknown key 'other' in hosts.dgx4; known keys: nccl, hf_cache_dir",
    ]


def test_a_recipes_container_table_is_checked_the_same_way_and_means_nothing_to_process(tmp_path):
    recipe = write(tmp_path, SEED.read_text() + '\n[container]\ncap_add = ["IPC_LOCK", "sys nice"]\nuser = "1000:1000"\n', "recipe.toml")
    line = next(number for number, text in enumerate(recipe.read_text().splitlines(), 1) if text.startswith("cap_add"))
    assert faults_of(load_recipe, recipe) == [
        (f"{recipe}:{line}: container.cap_add must be an array of capability names such as \"IPC_LOCK\", not an array "
         "['IPC_LOCK', 'sys nice']: 'sys nice' is not a capability name (uppercase letters and _, such as IPC_LOCK)"),
    ]
    process = write(tmp_path, 'engine = "process"\nargs = ["true"]\n[container]\nuser = "1000"\n', "process.toml")
    assert faults_of(load_recipe, process) == [
        f"{process}:3: container means nothing to engine = \"process\" (it runs args directly, no container); remove it",
    ]


def spark_fabrics(tmp_path: Path) -> dict[str, fabric.NodeFabric]:
    return {
        "dgx3": with_host(fabric.read_fabric(spark_tree(tmp_path / "dgx3"))),
        "dgx4": with_host(fabric.read_fabric(spark_tree(tmp_path / "dgx4", fabric_ip="192.168.100.4")),
                          addresses=spark_addresses("192.168.100.4"), docker_default_memlock=8 << 20),
    }


def nccl_verdicts(tmp_path: Path, clusters_text: str) -> dict[str, list[tuple[bool, str, str]]]:
    """Doctor's nccl findings per host, for the seed planned on the cluster `clusters_text` describes."""
    recipe = load_recipe(SEED)
    plan = make_plan(recipe, get_cluster(write(tmp_path, clusters_text), "ds4"), run_id="r")
    fabrics = spark_fabrics(tmp_path)
    return {
        node.host.name: [
            (finding.ok, finding.detail, finding.fix)
            for finding in _fabric_findings(recipe, node, fabrics[node.host.name]) if finding.check == "nccl"
        ]
        for node in plan.nodes
    }


def test_doctor_sees_a_hosts_own_hca_over_the_clusters(tmp_path):
    verdicts = nccl_verdicts(tmp_path, SPARKS + """\
[nccl.ds4]
NCCL_SOCKET_IFNAME = "enp1s0f1np1"
NCCL_IB_HCA = "mlx5_0"
[hosts.dgx3.nccl]
NCCL_IB_HCA = "rocep1s0f1"
""")
    # dgx3's override selects its cabled port; dgx4 keeps the cluster's, which matches nothing there.
    [(ok, detail, _)] = verdicts["dgx3"]
    assert ok and detail.startswith("NCCL: RoCE over rocep1s0f1:1 (enp1s0f1np1)"), detail
    ok, detail, fix = verdicts["dgx4"][0]
    assert not ok and "NCCL_IB_HCA=mlx5_0 matches none of dgx4's HCAs" in detail
    assert fix == 'set NCCL_IB_HCA = "rocep1s0f1" in [hosts.dgx4.nccl]'


def test_doctor_sees_the_rdma_flags_a_hosts_hca_gives_every_container(tmp_path):
    # No NCCL_IB_HCA cluster-wide: dgx4's own makes the fabric RDMA, so both ranks get the HCAs
    # and an unlimited memlock in their docker run (dgx4's daemon default of 8 MiB no longer counts).
    verdicts = nccl_verdicts(tmp_path, SPARKS + """\
[nccl.ds4]
NCCL_SOCKET_IFNAME = "enp1s0f1np1"
[hosts.dgx4.nccl]
NCCL_IB_HCA = "rocep1s0f1"
""")
    for host in ("dgx3", "dgx4"):
        [(ok, detail, fix)] = verdicts[host]
        assert ok and detail.startswith("NCCL: RoCE over rocep1s0f1:1 (enp1s0f1np1)"), (host, detail, fix)
    verdicts = nccl_verdicts(tmp_path, SPARKS + "rdma = false\n[hosts.dgx4.nccl]\nNCCL_IB_HCA = \"rocep1s0f1\"\n")
    ok, detail, fix = verdicts["dgx4"][0]
    assert not ok and "the rank's container gets no /dev/infiniband" in detail
