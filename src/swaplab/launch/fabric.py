"""A node's RDMA fabric as NCCL will meet it, and the transport NCCL will pick there.

One concept (what NCCL finds on a node), from the facts to the settings it needs.

Facts come from one constant script (`GATHER_SCRIPT`) that prints the files of
/sys/class/infiniband that matter (each port's state, link layer, rate and GID table, the
HCA's netdevs), the names under /dev/infiniband, `ulimit -l`, `ip -o addr`, `ibdev2netdev`
where that tool exists, and Docker's memlock limits. It runs on a node over ssh
(`gather_fabric`) or here over any folder laid out like `/` (`read_fabric`: tests build fake
/sys trees). Everything after that is pure: `parse_fabric` reads the listing,
`nccl_transport` decides what NCCL will use for a rank and why, `nccl_overrides` proposes
the per-host settings, and `overrides_toml` writes them as the clusters file's
`[hosts.NAME.nccl]` tables.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from swaplab.launch import remote
from swaplab.launch.engine import find_flag
from swaplab.launch.remote import SshTarget

MIN_MEMLOCK_BYTES = 1 << 30
"""Below this, a rank's pinned buffers for the HCA may not fit (NCCL's advice: unlimited)."""
GATHER_TIMEOUT_SECONDS = 60

# $1: the root (empty on a node: "/"). One record per line, fields separated by a tab:
# "PATH<TAB>LINE" for a sysfs file (grep -Z's NUL turned into a tab), "KIND<TAB>VALUE" for
# the rest. Unused GIDs (all zeros) are left out; an unused GID's type cannot be read
# (EINVAL) and grep -s skips it.
GATHER_SCRIPT = r"""
root=$1
ib=$root/sys/class/infiniband
if [ -d "$ib" ]; then
    for hca in "$ib"/*; do [ -d "$hca" ] && printf 'hca\t%s\n' "${hca##*/}"; done
    grep -s -H -Z '' "$ib"/*/ports/*/state "$ib"/*/ports/*/phys_state "$ib"/*/ports/*/link_layer \
        "$ib"/*/ports/*/rate "$ib"/*/ports/*/gids/* "$ib"/*/ports/*/gid_attrs/types/* \
        "$ib"/*/ports/*/gid_attrs/ndevs/* "$ib"/*/device/net/*/operstate \
        | tr '\0' '\t' | grep -v -E '[[:space:]](0000:){7}0000$'
fi
if [ -d "$root/dev/infiniband" ]; then
    printf 'devdir\tyes\n'
    for device in "$root"/dev/infiniband/*; do [ -e "$device" ] && printf 'dev\t%s\n' "${device##*/}"; done
fi
printf 'memlock\t%s\n' "$(ulimit -l)"
lines() { while IFS= read -r line || [ -n "$line" ]; do printf '%s\t%s\n' "$1" "$line"; done; }
if command -v ip > /dev/null 2>&1; then
    printf 'has\tip\n'
    ip -o addr show 2>/dev/null | lines ip
fi
if command -v ibdev2netdev > /dev/null 2>&1; then ibdev2netdev 2>/dev/null | lines ibdev2netdev; fi
pid=$(pgrep -xo dockerd 2>/dev/null)
if [ -n "$pid" ]; then grep -s '^Max locked memory' "/proc/$pid/limits" | lines dockerd; fi
if [ -f "$root/etc/docker/daemon.json" ]; then lines daemon.json < "$root/etc/docker/daemon.json"; fi
exit 0
"""

_PORT_FILE = re.compile(r"^/sys/class/infiniband/([^/]+)/ports/(\d+)/(state|phys_state|link_layer|rate)$")
_GID_FILE = re.compile(r"^/sys/class/infiniband/([^/]+)/ports/(\d+)/(gids|gid_attrs/types|gid_attrs/ndevs)/(\d+)$")
_NETDEV_FILE = re.compile(r"^/sys/class/infiniband/([^/]+)/device/net/([^/]+)/operstate$")
_IBDEV2NETDEV = re.compile(r"^(\S+) port (\d+) ==> (\S+)")


@dataclass(frozen=True)
class Gid:
    """One entry of a port's GID table."""

    index: int
    address: str
    """As sysfs writes it: eight groups of four hex digits."""
    type: str
    """"RoCE v2", "IB/RoCE v1", or "" (InfiniBand ports have none)."""
    netdev: str

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        try:
            mapped = ipaddress.IPv6Address(self.address).ipv4_mapped
        except ValueError:
            return None
        return str(mapped) if mapped else None


@dataclass(frozen=True)
class Port:
    """One port of an HCA."""

    hca: str
    number: int
    state: str
    """"ACTIVE", "DOWN", "INIT", "ARMED" (sysfs' "4: ACTIVE" without the number)."""
    physical_state: str
    """"LinkUp", "Disabled", "Polling"..."""
    link_layer: str
    """"InfiniBand" or "Ethernet" (RoCE)."""
    rate: str
    netdev: str | None
    gids: tuple[Gid, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.hca}:{self.number}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    def roce_v2_ipv4(self) -> tuple[Gid, ...]:
        """The GIDs NCCL needs to route RoCE between subnets: RoCE v2 with an IPv4 address."""
        return tuple(gid for gid in self.gids if gid.type == "RoCE v2" and gid.ipv4)


@dataclass(frozen=True)
class NodeFabric:
    """What one node offers NCCL."""

    hcas: tuple[str, ...]
    ports: tuple[Port, ...]
    devices: tuple[str, ...] | None
    """Names under /dev/infiniband (uverbs0, rdma_cm...); None: no such folder."""
    memlock: float | None
    """`ulimit -l` of an ssh session, in bytes (math.inf: unlimited; None: unknown)."""
    addresses: Mapping[str, tuple[str, ...]] | None
    """Each interface's addresses as ADDRESS/PREFIX, in `ip` order; None: no `ip` tool."""
    dockerd_memlock: float | None = None
    """The Docker daemon's own memlock limit (containers inherit it), when dockerd runs."""
    docker_default_memlock: float | None = None
    """`default-ulimits` memlock of /etc/docker/daemon.json, when set."""

    @property
    def verbs(self) -> bool:
        """Whether user space can open an HCA (/dev/infiniband/uverbsN)."""
        return any(name.startswith("uverbs") for name in self.devices or ())


@dataclass(frozen=True)
class RankAccess:
    """How a rank on the node reaches its RDMA devices."""

    container: bool
    devices: bool
    """Whether the rank sees /dev/infiniband (always, for a process on the host)."""
    memlock: float | None
    memlock_source: str


@dataclass(frozen=True)
class Problem:
    """Something that keeps NCCL off the fabric or breaks it, and how to fix it."""

    what: str
    fix: str


@dataclass(frozen=True)
class Transport:
    """What NCCL will use between this node and the others, and why."""

    kind: str
    """"RoCE", "InfiniBand" or "TCP sockets"."""
    ports: tuple[Port, ...]
    """The HCA ports it uses (none for TCP sockets)."""
    interface: str | None
    """Where its TCP traffic (bootstrap, or all of it for sockets) goes; None: unknown."""
    gid_index: int | None
    reason: str
    """Why this transport: for TCP sockets, why not the HCA."""
    cause: Problem | None = None
    """The fixable problem that turned an RDMA fabric into TCP sockets, if one did."""
    problems: tuple[Problem, ...] = ()
    """Other problems NCCL will meet on this node."""
    interface_note: str = ""
    """How `interface` was chosen, when NCCL chose it rather than NCCL_SOCKET_IFNAME."""

    def describe(self) -> str:
        """One line: the transport, over what, and why."""
        interface = (self.interface or "no interface") + (f" ({self.interface_note})" if self.interface_note else "")
        if self.ports:
            over = ", ".join(f"{port.name} ({port.netdev or 'no netdev'})" for port in self.ports)
            gid = f", GID index {self.gid_index}" if self.gid_index is not None else ""
            return f"{self.kind} over {over}{gid}, bootstrap over {interface}: {self.reason}"
        return f"TCP sockets over {interface}: {self.reason}"


def read_fabric(root: Path | str) -> NodeFabric:
    """The fabric of a tree laid out like `/` under `root`, read here with the node script itself."""
    root = str(root).rstrip("/")
    done = subprocess.run(
        ["sh", "-c", GATHER_SCRIPT, "swaplab", root], capture_output=True, text=True, check=False,
        timeout=GATHER_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL,
    )
    return parse_fabric(done.stdout, root)


async def gather_fabric(target: SshTarget, root: str = "") -> NodeFabric:
    """The fabric of a node, over ssh (`root`: a tree laid out like `/` there, for tests)."""
    result = await remote.run_script(target, GATHER_SCRIPT, root.rstrip("/"), timeout=GATHER_TIMEOUT_SECONDS)
    return parse_fabric(result.stdout, root.rstrip("/"))


def parse_fabric(listing: str, root: str = "") -> NodeFabric:
    """A node's fabric from GATHER_SCRIPT's listing (`root`: the prefix its paths carry)."""
    files: dict[str, str] = {}
    records: dict[str, list[str]] = {}
    for line in listing.splitlines():
        kind, _, value = line.partition("\t")
        if kind.startswith("/"):
            files[kind[len(root):] if root and kind.startswith(root + "/") else kind] = value.strip()
        else:
            records.setdefault(kind, []).append(value)
    hcas = tuple(sorted(set(records.get("hca", ())) | {m.group(1) for path in files if (m := _PORT_FILE.match(path))}))
    return NodeFabric(
        hcas=hcas,
        ports=_ports(files, records.get("ibdev2netdev", [])),
        devices=tuple(sorted(records.get("dev", ()))) if "devdir" in records else None,
        memlock=_limit(records.get("memlock", [""])[0], unit=1024),
        addresses=_addresses(records.get("ip", [])) if "has" in records else None,
        dockerd_memlock=_limit(records["dockerd"][0].split()[3], unit=1) if len(records.get("dockerd", [""])[0].split()) > 3 else None,
        docker_default_memlock=_daemon_memlock("\n".join(records.get("daemon.json", []))),
    )


def _ports(files: Mapping[str, str], ibdev2netdev: Sequence[str]) -> tuple[Port, ...]:
    attributes: dict[tuple[str, int], dict[str, str]] = {}
    gid_parts: dict[tuple[str, int, int], dict[str, str]] = {}
    hca_netdevs: dict[str, list[str]] = {}
    for path, value in files.items():
        if match := _PORT_FILE.match(path):
            attributes.setdefault((match.group(1), int(match.group(2))), {})[match.group(3)] = value
        elif match := _GID_FILE.match(path):
            key = (match.group(1), int(match.group(2)), int(match.group(4)))
            gid_parts.setdefault(key, {})[match.group(3).rsplit("/", 1)[-1]] = value
        elif match := _NETDEV_FILE.match(path):
            hca_netdevs.setdefault(match.group(1), []).append(match.group(2))
    tool = {(m.group(1), int(m.group(2))): m.group(3) for line in ibdev2netdev if (m := _IBDEV2NETDEV.match(line.strip()))}
    ports = []
    for (hca, number), values in sorted(attributes.items()):
        gids = tuple(
            Gid(index, parts["gids"], parts.get("types", ""), parts.get("ndevs", ""))
            for (gid_hca, gid_port, index), parts in sorted(gid_parts.items())
            if gid_hca == hca and gid_port == number and "gids" in parts
        )
        # The port's own netdev: a GID's (exact, per port), then ibdev2netdev's, then the
        # PCI function's only one.
        netdevs = sorted(hca_netdevs.get(hca, []))
        netdev = next((gid.netdev for gid in gids if gid.netdev), None) or tool.get((hca, number)) or (
            netdevs[0] if len(netdevs) == 1 else None
        )
        ports.append(Port(
            hca=hca, number=number, state=_after_colon(values.get("state", "")),
            physical_state=_after_colon(values.get("phys_state", "")), link_layer=values.get("link_layer", ""),
            rate=values.get("rate", ""), netdev=netdev, gids=gids,
        ))
    return tuple(ports)


def _after_colon(text: str) -> str:
    """sysfs' "4: ACTIVE" as "ACTIVE"."""
    return text.split(":", 1)[-1].strip()


def _limit(text: str, *, unit: int) -> float | None:
    text = text.strip()
    if text == "unlimited" or text == "-1":
        return math.inf
    return int(text) * unit if text.isdigit() else None


def _daemon_memlock(text: str) -> float | None:
    try:
        memlock = json.loads(text)["default-ulimits"]["memlock"]
        soft = int(memlock["Soft"])
    except (ValueError, KeyError, TypeError):
        return None
    return math.inf if soft < 0 else soft


def _addresses(lines: Sequence[str]) -> Mapping[str, tuple[str, ...]]:
    addresses: dict[str, list[str]] = {}
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("inet", "inet6"):
            addresses.setdefault(fields[1].split("@", 1)[0], []).append(fields[3])
    return MappingProxyType({name: tuple(values) for name, values in addresses.items()})


def interface_of(fabric: NodeFabric, ip: str) -> str | None:
    """The interface that holds `ip` (127/8 on lo for any loopback address); None when none does."""
    wanted = ipaddress.ip_address(ip)
    for exact in (True, False):
        for name, addresses in (fabric.addresses or {}).items():
            for text in addresses:
                interface = ipaddress.ip_interface(text)
                if interface.ip == wanted if exact else (wanted.is_loopback and wanted in interface.network):
                    return name
    return None


def rank_access(argv: Sequence[str] | None, fabric: NodeFabric, image: str | None = None) -> RankAccess:
    """How a rank run by `argv` (a `docker run`, or None for a process on the node) reaches the HCA."""
    if not argv or Path(argv[0]).name not in ("docker", "podman") or list(argv[1:2]) != ["run"]:
        return RankAccess(False, True, fabric.memlock, "`ulimit -l` of the ssh user")
    # Only the options before the image: the server's own flags follow it (vLLM has a --device).
    options = list(argv[2 : list(argv).index(image)] if image and image in argv else argv[2:])
    devices = bool(find_flag(options, ("--privileged",))) or any(
        "/dev/infiniband" in (value or "") for _, value in find_flag(options, ("--device", "-v", "--volume", "--mount"))
    )
    for _, value in find_flag(options, ("--ulimit",)):
        name, _, limits = (value or "").partition("=")
        if name == "memlock":
            return RankAccess(True, devices, _limit(limits.split(":", 1)[0], unit=1), "`--ulimit memlock` of its docker run")
    if fabric.docker_default_memlock is not None:
        return RankAccess(True, devices, fabric.docker_default_memlock, "default-ulimits of /etc/docker/daemon.json")
    return RankAccess(True, devices, fabric.dockerd_memlock, "the Docker daemon's own limit, which containers inherit")


def format_bytes(value: float | None) -> str:
    """A memlock limit for people: unlimited, 64 KiB, 8 MiB, 1.5 GiB."""
    if value is None:
        return "unknown"
    if value == math.inf:
        return "unlimited"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            amount = value / size
            return f"{amount:.0f} {unit}" if amount == int(amount) else f"{amount:.1f} {unit}"
    return f"{value:.0f} B"


def describe_fabric(fabric: NodeFabric) -> str:
    """One line: each HCA port with its state and netdev, /dev/infiniband, the ssh user's memlock."""
    if not fabric.ports:
        where = "/sys/class/infiniband is empty" if fabric.hcas or fabric.devices is not None else "no /sys/class/infiniband"
        return f"no RDMA device ({where}); memlock {format_bytes(fabric.memlock)}"
    ports = []
    for port in fabric.ports:
        kind = "RoCE" if port.roce else "IB"
        gids = port.roce_v2_ipv4()
        gid = f", RoCE v2 GID {gids[0].index} = {gids[0].ipv4}" if port.roce and gids else ""
        rate = f" {port.rate}" if port.rate else ""
        ports.append(f"{port.name} {port.state or '?'} {kind}{rate} on {port.netdev or 'no netdev'}{gid}")
    devices = ", ".join(fabric.devices) if fabric.devices else ("empty" if fabric.devices is not None else "absent")
    return f"{'; '.join(ports)}; /dev/infiniband {devices}; memlock {format_bytes(fabric.memlock)}"


def _nccl_list(spec: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL's device-list syntax: ^ excludes, = matches names exactly (else by prefix), NAME:PORT."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    spec = spec.removeprefix("=")
    entries: list[tuple[str, int | None]] = []
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, port = entry.partition(":")
        entries.append((name, int(port) if port.isdigit() else None))
    return exclude, exact, entries


def _selects(spec: str, name: str, port: int | None = None) -> bool:
    exclude, exact, entries = _nccl_list(spec)
    hit = any(
        (name == wanted if exact else name.startswith(wanted)) and (wanted_port is None or port is None or wanted_port == port)
        for wanted, wanted_port in entries
    )
    return hit != exclude


def nccl_default_interface(fabric: NodeFabric) -> str | None:
    """The interface NCCL picks with NCCL_SOCKET_IFNAME unset: ib*, else any but docker*/lo, else docker*, else lo."""
    usable = [
        name for name, addresses in (fabric.addresses or {}).items()
        if any(not ipaddress.ip_interface(text).ip.is_link_local for text in addresses)
    ]
    for prefer in (lambda n: n.startswith("ib"), lambda n: not n.startswith(("docker", "lo")), lambda n: n.startswith("docker"), lambda n: n == "lo"):
        found = [name for name in usable if prefer(name)]
        if found:
            return found[0]
    return None


def _enabled(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def nccl_transport(
    fabric: NodeFabric, env: Mapping[str, str], access: RankAccess, *, host: str, fabric_ip: str
) -> Transport:
    """What NCCL will use on this node for a rank with `env` and `access`, why, and what will break."""
    problems: list[Problem] = []
    table = f"[hosts.{toml_key(host)}.nccl]"
    fabric_interface = interface_of(fabric, fabric_ip)
    if fabric.addresses is not None and fabric_interface is None:
        owned = ", ".join(f"{name} {text}" for name, texts in fabric.addresses.items() for text in texts if name != "lo")
        problems.append(Problem(
            f"fabric_ip {fabric_ip} is not an address of {host}: the other ranks cannot meet it there",
            f"set fabric_ip of {host} in the clusters file to its fabric address ({owned or 'it has none but loopback'})",
        ))
    interface = fabric_interface
    note = ""
    socket_spec = env.get("NCCL_SOCKET_IFNAME")
    if socket_spec and fabric.addresses is not None:
        chosen = [name for name in fabric.addresses if _selects(socket_spec, name)]
        interface = chosen[0] if chosen else None
        if not chosen:
            note = f"NCCL_SOCKET_IFNAME={socket_spec} matches none"
            problems.append(Problem(
                f"NCCL_SOCKET_IFNAME={socket_spec} matches no interface of {host} ({', '.join(fabric.addresses)}): NCCL fails at init",
                f"set NCCL_SOCKET_IFNAME = {json.dumps(fabric_interface or '?')} in {table}",
            ))
        elif fabric_interface and fabric_interface not in chosen:
            problems.append(Problem(
                f"NCCL_SOCKET_IFNAME={socket_spec} picks {', '.join(chosen)}, not {fabric_interface}, which holds fabric_ip {fabric_ip}",
                f"set NCCL_SOCKET_IFNAME = {json.dumps(fabric_interface)} in {table}",
            ))
    if not socket_spec:
        # Not a fault: NCCL's own pick may well reach the other nodes, only maybe not over the fabric.
        interface = nccl_default_interface(fabric) or fabric_interface
        note = "NCCL's pick, NCCL_SOCKET_IFNAME unset" + (
            f"; fabric_ip {fabric_ip} is on {fabric_interface}" if fabric_interface and interface != fabric_interface else ""
        )

    def sockets(reason: str, cause: Problem | None = None) -> Transport:
        found = list(problems)
        if (env.get("NCCL_NET") or "").lower() == "ib":
            found.append(Problem(f"NCCL_NET=IB, but {reason}: NCCL fails at init instead of using sockets", "fix the cause, or unset NCCL_NET"))
        return Transport("TCP sockets", (), interface, None, reason, cause, tuple(found), note)

    if (env.get("NCCL_NET") or "").lower() == "socket":
        return sockets("NCCL_NET=Socket asks for it")
    if _enabled(env.get("NCCL_IB_DISABLE")):
        return sockets("NCCL_IB_DISABLE=1 asks for it")
    if not fabric.ports:
        return sockets(f"no RDMA device on {host} (" + ("no /sys/class/infiniband)" if not fabric.hcas else "its HCAs list no port)"))
    hca_spec = env.get("NCCL_IB_HCA")
    selected = [port for port in fabric.ports if not hca_spec or _selects(hca_spec, port.hca, port.number)]
    proposal = nccl_overrides(fabric, fabric_ip)
    fix_hca = f"set NCCL_IB_HCA = {json.dumps(proposal['NCCL_IB_HCA'])} in {table}" if "NCCL_IB_HCA" in proposal else "check the cabling (`ibstat`)"
    if not selected:
        reason = f"NCCL_IB_HCA={hca_spec} matches none of {host}'s HCAs ({', '.join(fabric.hcas)})"
        return sockets(reason, Problem(reason, fix_hca))
    active = [port for port in selected if port.active]
    if not active:
        states = ", ".join(f"{port.name} {port.state or '?'} ({port.physical_state or '?'})" for port in selected)
        reason = f"no selected HCA port is up ({states})"
        other = [port for port in fabric.ports if port.active and port not in selected]
        fix = fix_hca if other else (
            "bring the link up: check the cable and the switch or peer, "
            f"`ip link set DEV up` for the cabled one of {', '.join(port.netdev or port.name for port in selected)}, "
            "then `ibstat` or `rdma link` must say ACTIVE"
        )
        return sockets(reason, Problem(reason, fix))
    if not fabric.verbs:
        reason = f"{host} has no /dev/infiniband/uverbs*, so no program can open its HCAs"
        return sockets(reason, Problem(reason, "load the RDMA user-space drivers: `sudo modprobe ib_uverbs rdma_ucm` (and add them to /etc/modules-load.d/)"))
    if access.container and not access.devices:
        reason = "the rank's container gets no /dev/infiniband (its docker run has no --device /dev/infiniband)"
        return sockets(reason, Problem(
            reason,
            "the rank's docker run needs `--device /dev/infiniband --ulimit memlock=-1`, which the plan adds on an "
            "RDMA fabric: set rdma = true in [clusters.NAME] (or NCCL_IB_HCA in its [nccl.NAME] or [hosts.HOST.nccl]); "
            "until then NCCL runs over TCP",
        ))
    # The port on the fabric_ip's netdev first: its GID is the one that must route.
    ports = tuple(sorted(active, key=lambda port: port.netdev != fabric_interface))
    kind = "RoCE" if ports[0].roce else "InfiniBand"
    reason = f"NCCL_IB_HCA={hca_spec} selects {'them' if len(ports) > 1 else 'it'}" if hca_spec else "NCCL_IB_HCA unset: every active port"
    idle = [port.name for port in selected if not port.active]
    if idle:
        reason += f" ({', '.join(idle)} down, not used)"
    gid_index = None
    if ports[0].roce:
        gid_index, gid_problems = _gid_check(ports[0], env, fabric_ip, table)
        problems += gid_problems
    if access.memlock is not None and access.memlock < MIN_MEMLOCK_BYTES:
        fix = (
            "add `--ulimit memlock=-1` to the rank's docker run (ulimits = { memlock = \"-1:-1\" } in [container]), or `\"default-ulimits\": "
            "{\"memlock\": {\"Name\": \"memlock\", \"Soft\": -1, \"Hard\": -1}}` to /etc/docker/daemon.json and restart Docker"
            if access.container else
            "raise it for the ssh user: `USER - memlock unlimited` in /etc/security/limits.d/rdma.conf, then log in again"
        )
        problems.append(Problem(
            f"memlock {format_bytes(access.memlock)} for the ranks ({access.memlock_source}): "
            "NCCL pins buffers for the HCA and may fail to register them (ibv_reg_mr: Cannot allocate memory)",
            fix,
        ))
    return Transport(kind, ports, interface, gid_index, reason, None, tuple(problems), note)


def _gid_check(port: Port, env: Mapping[str, str], fabric_ip: str, table: str) -> tuple[int | None, list[Problem]]:
    best = _best_gid(port, fabric_ip)
    wanted = env.get("NCCL_IB_GID_INDEX")
    if wanted is not None and wanted.strip().lstrip("-").isdigit():
        index = int(wanted)
        gid = next((gid for gid in port.gids if gid.index == index), None)
        if gid is None or gid.type != "RoCE v2" or not gid.ipv4:
            what = f"GID {index} of {port.name} is " + (f"{gid.type or 'untyped'} {gid.address}" if gid else "unused")
            fix = f"set NCCL_IB_GID_INDEX = \"{best.index}\" in {table}" if best else f"give {port.netdev or 'its netdev'} an IPv4 address"
            return index, [Problem(f"NCCL_IB_GID_INDEX={index}, but {what}, not RoCE v2 over IPv4", fix)]
        return index, []
    if best is None:
        return None, [Problem(
            f"{port.name} has no RoCE v2 GID with an IPv4 address ({port.netdev or 'its netdev'} has no IPv4 address): "
            "NCCL falls back to a link-local GID that does not route",
            f"give {port.netdev or 'its netdev'} its fabric address (`ip addr add {fabric_ip}/24 dev {port.netdev or 'NETDEV'}`, persist it in netplan)",
        )]
    return best.index, []


def _best_gid(port: Port, fabric_ip: str) -> Gid | None:
    gids = port.roce_v2_ipv4()
    return next((gid for gid in gids if gid.ipv4 == fabric_ip), gids[0] if gids else None)


def nccl_overrides(fabric: NodeFabric, fabric_ip: str) -> dict[str, str]:
    """The NCCL settings this node needs, from what it has: NCCL_IB_HCA (the active ports, those
    on the fabric_ip's netdev when there are), NCCL_SOCKET_IFNAME (the fabric_ip's interface),
    NCCL_IB_GID_INDEX (RoCE: the RoCE v2 GID of an IPv4 address, the fabric_ip's first)."""
    settings: dict[str, str] = {}
    interface = interface_of(fabric, fabric_ip)
    active = [port for port in fabric.ports if port.active]
    chosen = [port for port in active if interface and port.netdev == interface] or active
    if chosen:
        settings["NCCL_IB_HCA"] = _hca_list(chosen, fabric.ports)
    if interface:
        names = list(fabric.addresses or ())
        ambiguous = any(name != interface and name.startswith(interface) for name in names)
        settings["NCCL_SOCKET_IFNAME"] = f"={interface}" if ambiguous else interface
    if chosen and chosen[0].roce and (gid := _best_gid(chosen[0], fabric_ip)):
        settings["NCCL_IB_GID_INDEX"] = str(gid.index)
    return settings


def _hca_list(chosen: Sequence[Port], ports: Sequence[Port]) -> str:
    """NCCL_IB_HCA for exactly `chosen`: NAME, or NAME:PORT where the HCA has other ports; "=" when a name
    is another HCA's prefix (NCCL matches by prefix)."""
    per_hca = {port.hca: sum(other.hca == port.hca for other in ports) for port in chosen}
    entries = [port.name if per_hca[port.hca] > 1 else port.hca for port in chosen]
    hcas = {port.hca for port in ports}
    ambiguous = any(other != port.hca and other.startswith(port.hca) for port in chosen for other in hcas)
    return ("=" if ambiguous else "") + ",".join(dict.fromkeys(entries))


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(name: str) -> str:
    """A TOML key for `name`: bare when it can be, else a quoted string (host names with dots)."""
    return name if _BARE_KEY.match(name) else json.dumps(name)


def overrides_toml(settings: Mapping[str, Mapping[str, str]]) -> str:
    """`[hosts.NAME.nccl]` tables, one per host with settings, for the clusters file."""
    blocks = []
    for host, values in settings.items():
        if values:
            lines = [f"[hosts.{toml_key(host)}.nccl]"] + [f"{key} = {json.dumps(value)}" for key, value in values.items()]
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
