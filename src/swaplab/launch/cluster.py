"""The clusters file: which hosts make up a cluster, where their ranks meet, and their NCCL env.

```toml
[clusters.ds4]
user = "giovanni"                          # ssh user (optional: ~/.ssh/config decides)
hf_cache_dir = "/mnt/nas/ai/huggingface"   # each node's Hugging Face cache (HF_HOME); default ~/.cache/huggingface
hf_cache_shared = true                     # optional: that folder is one disk every node sees (a NAS)
local_cache_dir = "/var/cache/hf"          # optional: mirror the recipe's models here per node (implies shared)
download = "head"                          # optional: where the models are fetched, once: "head" or "here"
download_dir = "~/.cache/huggingface"      # optional, for download = "here": this machine's HF_HOME
python = "python3"                         # optional: the head's Python with huggingface_hub (engine = "process")
ssh_options = ["ConnectTimeout=10"]        # optional extra `ssh -o` options
hosts = [{ name = "dgx3", fabric_ip = "192.168.100.3" },
         { name = "dgx4", fabric_ip = "192.168.100.4", ssh_port = 2222 }]   # head first
rdma = true                                # optional: ranks get the RDMA devices (inferred from NCCL_IB_HCA)
[clusters.ds4.container]                   # optional: extra docker run options (see ContainerOptions)
ulimits = { nofile = "65536:65536" }
[nccl.ds4]
NCCL_SOCKET_IFNAME = "enp1s0f1np1"
[hosts.dgx4]                               # optional: one host's own values
hf_cache_dir = "/data/huggingface"         #   its HF_HOME, over the cluster's (unless the hub is shared)
[hosts.dgx4.nccl]                          # optional: one host's NCCL settings, over [nccl.ds4]
NCCL_IB_HCA = "rocep1s0f1"
```
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from swaplab.config.reader import (
    KeyPath,
    as_boolean,
    as_port,
    as_string,
    as_strings,
    describe,
    dotted,
    one_of,
)
from swaplab.errors import SwaplabError
from swaplab.launch.spec import ContainerOptions
from swaplab.launch.tomlfile import Checker, read_toml

CLUSTER_KEYS = (
    "user", "hf_cache_dir", "hf_cache_shared", "local_cache_dir", "download", "download_dir", "python", "ssh_options",
    "hosts", "rdma", "container",
)
HOST_KEYS = ("name", "fabric_ip", "ssh_port")
HOST_TABLE_KEYS = ("nccl", "hf_cache_dir")
"""What a top-level [hosts.NAME] table may hold."""
DOWNLOAD_PLACES = ("head", "here")
DEFAULT_HF_CACHE = "~/.cache/huggingface"
"""huggingface_hub's own default HF_HOME: each node's cache, and this machine's, unless the clusters file says."""
CONTAINER_KEYS = ("devices", "ulimits", "cap_add", "user", "privileged", "read_only_mounts")
ULIMIT_NAMES = (
    "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc",
    "rss", "rtprio", "rttime", "sigpending", "stack",
)
"""The limits `docker run --ulimit` knows."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CAPABILITY = re.compile(r"^[A-Z][A-Z_]*$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")
_LIMIT = re.compile(r"^(-1|[0-9]+)$")


@dataclass(frozen=True)
class Host:
    """One node. `name` is what `ssh` is given (the user's ~/.ssh/config resolves it);
    `fabric_ip` is the address the ranks meet on."""

    name: str
    fabric_ip: str
    ssh_port: int | None = None

    @property
    def is_loopback(self) -> bool:
        return ipaddress.ip_address(self.fabric_ip).is_loopback


@dataclass(frozen=True)
class Cluster:
    """A named set of hosts, head first, with the env every rank on it gets."""

    name: str
    user: str | None
    hf_cache_dir: str | None
    """Every node's Hugging Face cache (HF_HOME on the host) unless its [hosts.NAME] says; None: DEFAULT_HF_CACHE."""
    hosts: tuple[Host, ...]
    nccl: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ssh_options: tuple[str, ...] = ()
    local_cache_dir: str | None = None
    """Where each node keeps its own copy of the recipe's models (None: no mirroring)."""
    host_nccl: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    """Each host's own `[hosts.NAME.nccl]`, by host name, over `nccl`."""
    rdma: bool | None = None
    """`rdma = true/false`; None: decided by the NCCL settings (see `uses_rdma`)."""
    container: ContainerOptions = field(default_factory=ContainerOptions)
    """The cluster's `[clusters.NAME.container]`, under the recipe's `[container]`."""
    hf_cache_shared: bool = False
    """`hf_cache_shared = true`: hf_cache_dir is one disk every node sees, so one download serves all."""
    download: str = "head"
    """Where the recipe's models are fetched, once: "head" (then copied from it to the other
    nodes over the fabric) or "here" (the launching machine's download_dir, then copied to every node)."""
    download_dir: str = DEFAULT_HF_CACHE
    """This machine's Hugging Face cache, for download = "here"."""
    python: str = "python3"
    """The Python the head runs the download with for engine = "process" (container engines use
    the image's): one with huggingface_hub, such as a venv's."""
    host_hf_cache_dir: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Each host's own `[hosts.NAME] hf_cache_dir`, by host name."""

    @property
    def head(self) -> Host:
        return self.hosts[0]

    def hub_of(self, host: Host) -> str:
        """The Hugging Face cache (an HF_HOME) on `host`: the cluster's when every node shares
        it, else the host's own, the cluster's, or the default."""
        own = None if self.shares_hub else self.host_hf_cache_dir.get(host.name)
        return own or self.hf_cache_dir or DEFAULT_HF_CACHE

    @property
    def shares_hub(self) -> bool:
        """Whether every node sees the same hub: said outright, or implied by a per-node mirror."""
        return self.hf_cache_shared or self.local_cache_dir is not None

    def nccl_of(self, host: Host) -> dict[str, str]:
        """The NCCL env of ranks on `host`: the cluster's `[nccl.NAME]`, then the host's own (host wins)."""
        return {**self.nccl, **self.host_nccl.get(host.name, {})}

    @property
    def uses_rdma(self) -> bool:
        """Whether ranks meet over RDMA, so their containers need the HCAs: `rdma` when set, else
        whether any host's NCCL settings name HCAs (NCCL_IB_HCA) without turning IB off."""
        if self.rdma is not None:
            return self.rdma
        return any(_asks_for_rdma(self.nccl_of(host)) for host in self.hosts)


def _asks_for_rdma(env: Mapping[str, str]) -> bool:
    # The same reading of the switches as doctor's transport (fabric.nccl_transport).
    disabled = env.get("NCCL_IB_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")
    return bool(env.get("NCCL_IB_HCA")) and not disabled and env.get("NCCL_NET", "").strip().lower() != "socket"


def load_clusters(path: str | Path) -> dict[str, Cluster]:
    """Every cluster of the clusters file; raises ConfigError listing every fault at its line."""
    document = read_toml(Path(path).expanduser())
    checker = Checker(document)
    top = checker.table(document.data, (), ("clusters", "nccl", "hosts"))
    clusters_table = top.get("clusters", {})
    if not isinstance(clusters_table, dict):
        checker.fault(("clusters",), f"clusters must be a table of [clusters.NAME] tables, not {describe(clusters_table)}")
        clusters_table = {}
    nccl_table = top.get("nccl", {})
    if not isinstance(nccl_table, dict):
        checker.fault(("nccl",), f"nccl must be a table of [nccl.CLUSTER] env tables, not {describe(nccl_table)}")
        nccl_table = {}
    for name in nccl_table:
        if name not in clusters_table:
            checker.fault(("nccl", name), f"[nccl.{name}] names no cluster; known clusters: {', '.join(clusters_table) or '(none)'}")
    clusters = {
        name: _read_cluster(checker, name, value, nccl_table.get(name, {})) for name, value in clusters_table.items()
    }
    host_nccl, host_hub = _read_host_tables(
        checker, top.get("hosts", {}), {host.name for cluster in clusters.values() for host in cluster.hosts}
    )
    clusters = {
        name: replace(
            cluster,
            host_nccl=MappingProxyType({host.name: host_nccl[host.name] for host in cluster.hosts if host.name in host_nccl}),
            host_hf_cache_dir=MappingProxyType({host.name: host_hub[host.name] for host in cluster.hosts if host.name in host_hub}),
        )
        for name, cluster in clusters.items()
    }
    if not clusters and "clusters" not in top:
        checker.fault((), "no [clusters.NAME] table; add one (see docs/launch.md)")
    checker.raise_faults()
    return clusters


def get_cluster(path: str | Path, name: str) -> Cluster:
    """The cluster `name` of the clusters file at `path`."""
    location = Path(path).expanduser()
    if not location.exists():
        raise SwaplabError(
            f"no clusters file at {location}; write one with a [clusters.{name}] table "
            "(see docs/launch.md) or pass --clusters FILE"
        )
    clusters = load_clusters(location)
    if name not in clusters:
        known = ", ".join(sorted(clusters)) or "(none)"
        raise SwaplabError(f"no cluster {name!r} in {location}; known clusters: {known}")
    return clusters[name]


def _read_cluster(checker: Checker, name: str, value: Any, nccl: Any) -> Cluster:
    where: KeyPath = ("clusters", name)
    table = checker.table(value, where, CLUSTER_KEYS)
    hosts_value = table.get("hosts")
    hosts: list[Host] = []
    if hosts_value is None:
        checker.fault(where, f"missing required key 'hosts' in [{dotted(where)}]: a list of {{ name, fabric_ip }}, head first")
    elif not isinstance(hosts_value, list) or not hosts_value:
        checker.fault(where + ("hosts",), f"{dotted(where + ('hosts',))} must be a non-empty array of {{ name, fabric_ip }} tables")
    else:
        for index, host_value in enumerate(hosts_value):
            host = _read_host(checker, where + ("hosts", index), host_value)
            if host is not None:
                hosts.append(host)
        seen: dict[str, int] = {}
        for index, host in enumerate(hosts):
            if host.fabric_ip in seen:
                checker.fault(where + ("hosts", index), f"fabric_ip {host.fabric_ip} is also host {seen[host.fabric_ip]}'s; every rank needs its own address")
            seen.setdefault(host.fabric_ip, index)
    return Cluster(
        name=name,
        user=checker.get(table, where, "user", as_string, "a string"),
        hf_cache_dir=checker.get(table, where, "hf_cache_dir", _as_directory, "an absolute path or one starting with ~/"),
        hf_cache_shared=checker.get(table, where, "hf_cache_shared", as_boolean, "true or false", default=False),
        download=checker.get(table, where, "download", one_of(DOWNLOAD_PLACES, "place"), "\"head\" or \"here\"", default="head"),
        download_dir=checker.get(
            table, where, "download_dir", _as_directory, "an absolute path or one starting with ~/", default=DEFAULT_HF_CACHE
        ),
        python=checker.get(table, where, "python", as_word, "a program name or path, such as \"~/venv/bin/python\"", default="python3"),
        local_cache_dir=checker.get(table, where, "local_cache_dir", _as_directory, "an absolute path or one starting with ~/"),
        ssh_options=checker.get(table, where, "ssh_options", _as_ssh_options, "an array of OPTION=VALUE strings", default=()),
        hosts=tuple(hosts),
        nccl=MappingProxyType(read_env_table(checker, ("nccl", name), nccl)),
        rdma=checker.get(table, where, "rdma", as_boolean, "true or false"),
        container=read_container_table(checker, where + ("container",), table.get("container", {})),
    )


def _read_host_tables(checker: Checker, value: Any, known: set[str]) -> tuple[dict[str, MappingProxyType], dict[str, str]]:
    """The top-level `[hosts.NAME]` tables: their `nccl` tables and their `hf_cache_dir`, each by
    host name; NAME must be a host of some cluster."""
    if not isinstance(value, dict):
        checker.fault(("hosts",), f"hosts must be a table of [hosts.NAME] tables, not {describe(value)}")
        return {}, {}
    tables: dict[str, MappingProxyType] = {}
    hubs: dict[str, str] = {}
    for name, item in value.items():
        where: KeyPath = ("hosts", name)
        if name not in known:
            # At the header's line: `[hosts.NAME.nccl]` records only its full path.
            header = where + ("nccl",) if isinstance(item, dict) and "nccl" in item else where
            checker.fault(header, (
                f"no cluster has a host named {name!r} (the NAME of [hosts.NAME] is a host's name); "
                f"known hosts: {', '.join(sorted(known)) or '(none)'}"
            ))
        table = checker.table(item, where, HOST_TABLE_KEYS)
        if "nccl" in table:
            tables[name] = MappingProxyType(read_env_table(checker, where + ("nccl",), table["nccl"], strings_only=True))
        hub = checker.get(table, where, "hf_cache_dir", _as_directory, "an absolute path or one starting with ~/")
        if hub is not None:
            hubs[name] = hub
    return tables, hubs


def read_container_table(checker: Checker, where: KeyPath, value: Any) -> ContainerOptions:
    """A `[container]` table (a recipe's, or a cluster's): extra `docker run` options, each checked."""
    table = checker.table(value, where, CONTAINER_KEYS)
    ulimits: dict[str, str] = {}
    limits = table.get("ulimits", {})
    if not isinstance(limits, dict):
        checker.fault(where + ("ulimits",), f"{dotted(where + ('ulimits',))} must be a table of NAME = \"SOFT:HARD\", not {describe(limits)}")
    else:
        for name in limits:
            if name not in ULIMIT_NAMES:
                checker.fault(where + ("ulimits", name), f"unknown ulimit {name!r}; docker knows {', '.join(ULIMIT_NAMES)}")
                continue
            limit = checker.get(limits, where + ("ulimits",), name, _as_limit, "\"SOFT:HARD\" (numbers, -1 for unlimited)")
            if limit is not None:
                ulimits[name] = limit
    return ContainerOptions(
        devices=checker.get(table, where, "devices", _as_devices, "an array of absolute host device paths", default=()),
        ulimits=tuple(ulimits.items()),
        cap_add=checker.get(table, where, "cap_add", _as_capabilities, "an array of capability names such as \"IPC_LOCK\"", default=()),
        user=checker.get(table, where, "user", _as_user, "\"UID:GID\" or a user name"),
        privileged=checker.get(table, where, "privileged", as_boolean, "true or false"),
        read_only_mounts=checker.get(
            table, where, "read_only_mounts", _as_read_only_mounts, "an array of \"HOST:CONTAINER\" absolute paths", default=()
        ),
    )


def _as_devices(value: Any) -> tuple[str, ...]:
    devices = as_strings(value)
    for device in devices:
        if not device.startswith("/") or ":" in device or any(character.isspace() for character in device):
            raise ValueError(f"{device!r} is not an absolute host path (such as /dev/infiniband)")
    return tuple(dict.fromkeys(devices))


def _as_limit(value: Any) -> str:
    # A bare number is both limits, as docker takes `--ulimit nofile=65536`.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = as_string(value)
    parts = text.split(":")
    if len(parts) > 2 or not all(_LIMIT.match(part) for part in parts):
        raise ValueError("write SOFT:HARD, each a number or -1 (unlimited)")
    soft, hard = parts[0], parts[-1]
    if hard != "-1" and (soft == "-1" or int(soft) > int(hard)):
        raise ValueError("the soft limit is above the hard one")
    return f"{soft}:{hard}"


def _as_capabilities(value: Any) -> tuple[str, ...]:
    names = as_strings(value)
    for name in names:
        if not _CAPABILITY.match(name):
            raise ValueError(f"{name!r} is not a capability name (uppercase letters and _, such as IPC_LOCK)")
    return tuple(dict.fromkeys(names))


def _as_user(value: Any) -> str:
    text = as_string(value)
    if not _USER.match(text):
        raise ValueError("write UID:GID, a user name, or NAME:GROUP")
    return text


def _as_read_only_mounts(value: Any) -> tuple[tuple[str, str], ...]:
    mounts = []
    for text in as_strings(value):
        host, _, container = text.partition(":")
        if not host.startswith("/") or not container.startswith("/") or ":" in container:
            raise ValueError(f"{text!r} is not HOST:CONTAINER with both paths absolute")
        mounts.append((host, container))
    return tuple(mounts)


def _read_host(checker: Checker, where: KeyPath, value: Any) -> Host | None:
    table = checker.table(value, where, HOST_KEYS)
    if not table:
        return None
    name = checker.get(table, where, "name", as_string, "the host name ssh is given", required=True)
    fabric_ip = checker.get(
        table, where, "fabric_ip", _as_ip_address, "the IP address the ranks meet on", required=True
    )
    ssh_port = checker.get(table, where, "ssh_port", as_port, "a port number")
    if name is None or fabric_ip is None:
        return None
    return Host(name=name, fabric_ip=fabric_ip, ssh_port=ssh_port)


def read_env_table(checker: Checker, where: KeyPath, value: Any, *, strings_only: bool = False) -> dict[str, str]:
    """An env table: NAME = value, values strings or (unless `strings_only`) numbers, written as text."""
    if not isinstance(value, dict):
        checker.fault(where, f"[{dotted(where)}] must be a table of NAME = \"value\", not {describe(value)}")
        return {}
    env: dict[str, str] = {}
    for key, item in value.items():
        if not ENV_NAME.match(key):
            checker.fault(where + (key,), f"{key!r} is not an environment variable name (letters, digits, _)")
        elif isinstance(item, str):
            env[key] = item
        elif isinstance(item, (int, float)) and not isinstance(item, bool) and not strings_only:
            env[key] = str(item)
        else:
            checker.fault(where + (key,), f"{dotted(where + (key,))} must be a string, not {describe(item)}; quote it")
    return env


def _as_ip_address(value: Any) -> str:
    text = as_string(value)
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError("write the node's fabric IP address itself, not a name") from None


def _as_directory(value: Any) -> str:
    text = as_string(value)
    if not (text.startswith(("/", "~/")) or text == "~"):
        raise ValueError("relative paths would depend on where ssh lands")
    return text.rstrip("/") or "/"


def as_word(value: Any) -> str:
    """A string that is one word: no spaces, nothing empty (recipes' images and models too)."""
    text = as_string(value)
    if not text or text != text.strip() or any(character.isspace() for character in text):
        raise ValueError("it must be one word without spaces")
    return text


def _as_ssh_options(value: Any) -> tuple[str, ...]:
    options = as_strings(value)
    for option in options:
        if "=" not in option or option.startswith("-"):
            raise ValueError(f"{option!r} is not OPTION=VALUE (what `ssh -o` takes)")
    return options
