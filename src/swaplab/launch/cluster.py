"""The clusters file: which hosts make up a cluster, where their ranks meet, and their NCCL env.

```toml
[clusters.ds4]
user = "giovanni"                          # ssh user (optional: ~/.ssh/config decides)
hf_cache_dir = "/mnt/nas/ai/huggingface"   # the Hugging Face hub every node sees (HF_HOME)
local_cache_dir = "/var/cache/hf"          # optional: mirror the recipe's models here per node
ssh_options = ["ConnectTimeout=10"]        # optional extra `ssh -o` options
hosts = [{ name = "dgx3", fabric_ip = "192.168.100.3" },
         { name = "dgx4", fabric_ip = "192.168.100.4", ssh_port = 2222 }]   # head first
[nccl.ds4]
NCCL_SOCKET_IFNAME = "enp1s0f1np1"
```
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from swaplab.config.reader import (
    KeyPath,
    as_port,
    as_string,
    as_strings,
    describe,
    dotted,
)
from swaplab.errors import SwaplabError
from swaplab.launch.tomlfile import Checker, read_toml

CLUSTER_KEYS = ("user", "hf_cache_dir", "local_cache_dir", "ssh_options", "hosts")
HOST_KEYS = ("name", "fabric_ip", "ssh_port")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
    hosts: tuple[Host, ...]
    nccl: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ssh_options: tuple[str, ...] = ()
    local_cache_dir: str | None = None
    """Where each node keeps its own copy of the recipe's models (None: no mirroring)."""

    @property
    def head(self) -> Host:
        return self.hosts[0]


def load_clusters(path: str | Path) -> dict[str, Cluster]:
    """Every cluster of the clusters file; raises ConfigError listing every fault at its line."""
    document = read_toml(Path(path).expanduser())
    checker = Checker(document)
    top = checker.table(document.data, (), ("clusters", "nccl"))
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
        local_cache_dir=checker.get(table, where, "local_cache_dir", _as_directory, "an absolute path or one starting with ~/"),
        ssh_options=checker.get(table, where, "ssh_options", _as_ssh_options, "an array of OPTION=VALUE strings", default=()),
        hosts=tuple(hosts),
        nccl=MappingProxyType(read_env_table(checker, ("nccl", name), nccl)),
    )


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


def read_env_table(checker: Checker, where: KeyPath, value: Any) -> dict[str, str]:
    """An env table: NAME = value, values strings or numbers (written as text)."""
    if not isinstance(value, dict):
        checker.fault(where, f"[{dotted(where)}] must be a table of NAME = \"value\", not {describe(value)}")
        return {}
    env: dict[str, str] = {}
    for key, item in value.items():
        if not ENV_NAME.match(key):
            checker.fault(where + (key,), f"{key!r} is not an environment variable name (letters, digits, _)")
        elif isinstance(item, str):
            env[key] = item
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
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


def _as_ssh_options(value: Any) -> tuple[str, ...]:
    options = as_strings(value)
    for option in options:
        if "=" not in option or option.startswith("-"):
            raise ValueError(f"{option!r} is not OPTION=VALUE (what `ssh -o` takes)")
    return options
