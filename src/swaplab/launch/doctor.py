"""`swaplab launch doctor`: preflight on every node, each failure with how to fix it.

Checks, per node, side by side: ssh reachable; for container engines Docker, its GPU
runtime and the GPUs, and the recipe's image with the same id everywhere; the model
present and identical on every node (a path: size and content hash; a Hugging Face repo:
its blobs, which the hub names by their hash, and their sizes); free disk; free memory;
the recipe's ports free. `up` runs the cheap subset (`preflight`) before it starts anything.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

from swaplab.launch import remote
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.plan import Plan, hub_folder
from swaplab.launch.remote import RemoteError, SshTarget
from swaplab.launch.spec import HUB_REPO, Recipe

MIN_FREE_DISK_BYTES = 5 << 30
MIN_FREE_MEMORY_BYTES = 2 << 30
GIB = 1 << 30


@dataclass(frozen=True)
class Finding:
    """One check on one node: passed or not, what was seen, and how to fix a failure."""

    host: str
    check: str
    ok: bool
    detail: str
    fix: str = ""


# $1: a port. Exit 0 when some socket listens on it (any address, IPv4 or IPv6).
_LISTENING = r"""
port=$(printf '%04X' "$1")
awk -v port="$port" '$4 == "0A" { split($2, local, ":"); if (local[2] == port) found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
"""

# $1: a file or folder (a leading ~/ is the node's home). Prints "BYTES SHA256"; exit 3 when absent.
# A folder's hash covers every file's relative path and content, in sorted order.
_MODEL_FILES = r"""
path=$1
case $path in "~/"*) path=$HOME/${path#"~/"};; esac
if [ -f "$path" ]; then
    echo "$(stat -L -c %s "$path") $(sha256sum < "$path" | cut -d' ' -f1)"
elif [ -d "$path" ]; then
    cd "$path" || exit 3
    size=$(find -L . -type f -printf '%s\n' | awk '{ total += $1 } END { print total + 0 }')
    hash=$(find -L . -type f -print0 | sort -z | xargs -0 -r sha256sum | sha256sum | cut -d' ' -f1)
    echo "$size $hash"
else
    exit 3
fi
"""

# $1: a hub repo folder (models--ORG--NAME). Prints "BYTES LISTING_SHA256" of its blobs; exit 3 when absent.
_HUB_REPO = r"""
path=$1
case $path in "~/"*) path=$HOME/${path#"~/"};; esac
[ -d "$path/blobs" ] && [ -d "$path/snapshots" ] || exit 3
cd "$path/blobs" || exit 3
size=$(find . -type f ! -name '*.incomplete' -printf '%s\n' | awk '{ total += $1 } END { print total + 0 }')
listing=$(find . -type f ! -name '*.incomplete' -printf '%f %s\n' | sort | sha256sum | cut -d' ' -f1)
[ "$size" -gt 0 ] || exit 3
echo "$size $listing"
"""

# $1: a folder that may not exist yet (the nearest existing parent is measured). Prints free bytes.
_FREE_DISK = r"""
path=$1
case $path in "~/"*|"~") path=$HOME/${path#"~"};; esac
while [ ! -e "$path" ]; do path=$(dirname "$path"); done
echo $(( $(df -Pk "$path" | awk 'NR == 2 { print $4 }') * 1024 ))
"""


def doctor(recipe: Recipe, cluster: Cluster) -> list[Finding]:
    """Check every node of the cluster for the recipe: every finding, passed or failed."""
    return asyncio.run(_doctor(recipe, cluster))


async def _doctor(recipe: Recipe, cluster: Cluster) -> list[Finding]:
    hosts = cluster.hosts[: recipe.required_nodes]
    targets = [remote.target_for(cluster, host) for host in hosts]
    reachable = await asyncio.gather(*(_reach(target) for target in targets))
    findings = list(reachable)
    up = [(host, target) for host, target, finding in zip(hosts, targets, reachable, strict=True) if finding.ok]
    if len(hosts) < recipe.required_nodes:
        findings.append(Finding(
            cluster.name, "nodes", False, f"the recipe needs {recipe.required_nodes} nodes, the cluster has {len(hosts)}",
            "add hosts to the cluster or lower required_nodes",
        ))
    per_node = await asyncio.gather(*(_node_checks(recipe, cluster, host, target) for host, target in up))
    for node_findings in per_node:
        findings += node_findings
    if up and recipe.engine != "process" and recipe.docker_image:
        findings += await _same_image(recipe, up)
    model_findings = await _model_checks(recipe, cluster, up)
    findings += model_findings
    return findings


async def preflight(plan: Plan) -> list[str]:
    """What `up` checks before it starts anything: Docker where needed, the ports free. Problems with fixes."""
    problems = []
    hosts = [node.host for node in plan.nodes]
    targets = [remote.target_for(plan.cluster, host) for host in hosts]
    checks = await asyncio.gather(*(_port_findings(plan.recipe, host, target) for host, target in zip(hosts, targets, strict=True)))
    if plan.recipe.engine != "process":
        checks += await asyncio.gather(*(_docker_findings(host, target) for host, target in zip(hosts, targets, strict=True)))
    for findings in checks:
        problems += [f"{f.host}: {f.detail}; fix: {f.fix}" for f in findings if not f.ok]
    return problems


async def _reach(target: SshTarget) -> Finding:
    try:
        await remote.connect(target)
    except RemoteError as error:
        return Finding(str(target), "ssh", False, str(error).split(";", 1)[0], remote.reach_hint(target))
    return Finding(str(target), "ssh", True, "reachable")


async def _node_checks(recipe: Recipe, cluster: Cluster, host: Host, target: SshTarget) -> list[Finding]:
    findings = []
    if recipe.engine != "process":
        findings += await _docker_findings(host, target)
    findings += await _port_findings(recipe, host, target)
    findings.append(await _memory_finding(host, target))
    findings.append(await _disk_finding(recipe, cluster, host, target))
    return findings


async def _docker_findings(host: Host, target: SshTarget) -> list[Finding]:
    version = await remote.run(target, ["docker", "version", "--format", "{{.Server.Version}}"])
    if not version.ok:
        return [Finding(
            host.name, "docker", False, f"no Docker engine answers ({_last_line(version.stderr) or 'docker not found'})",
            "install Docker Engine and add the ssh user to the docker group (`sudo usermod -aG docker $USER`)",
        )]
    findings = [Finding(host.name, "docker", True, f"Docker {version.stdout.strip()}")]
    runtimes = await remote.run(target, ["docker", "info", "--format", "{{json .Runtimes}}"])
    if "nvidia" in runtimes.stdout:
        findings.append(Finding(host.name, "gpu", True, "NVIDIA container runtime registered"))
    else:
        findings.append(Finding(
            host.name, "gpu", False, "Docker has no NVIDIA runtime",
            "install the NVIDIA Container Toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker`, "
            "then restart Docker",
        ))
    gpus = await remote.run(target, ["nvidia-smi", "-L"])
    count = len([line for line in gpus.stdout.splitlines() if line.startswith("GPU ")])
    findings.append(
        Finding(host.name, "gpu", True, f"{count} GPU(s): {_last_line(gpus.stdout)}") if gpus.ok and count
        else Finding(host.name, "gpu", False, "nvidia-smi lists no GPU", "install the NVIDIA driver (nvidia-smi must list the GPUs)")
    )
    return findings


async def _port_findings(recipe: Recipe, host: Host, target: SshTarget) -> list[Finding]:
    ports = [("port", recipe.port)] + ([("rendezvous", recipe.rendezvous_port)] if recipe.rendezvous_port else [])
    findings = []
    for what, port in ports:
        busy = (await remote.run_script(target, _LISTENING, str(port))).ok
        findings.append(
            Finding(
                host.name, "port", False, f"{what} {port} is in use",
                f"see who holds it with `ss -ltnp 'sport = :{port}'` on {host.name} and stop it "
                f"(`swaplab launch status` if it is a gang), or change `{'port' if what == 'port' else 'rendezvous_port'}` in the recipe",
            ) if busy else Finding(host.name, "port", True, f"{what} {port} free")
        )
    return findings


async def _memory_finding(host: Host, target: SshTarget) -> Finding:
    result = await remote.run(target, ["grep", "-m1", "^MemAvailable:", "/proc/meminfo"])
    fields = result.stdout.split()
    if not result.ok or len(fields) < 2 or not fields[1].isdigit():
        return Finding(host.name, "memory", False, "cannot read /proc/meminfo", "the node must be Linux")
    available = int(fields[1]) * 1024
    if available < MIN_FREE_MEMORY_BYTES:
        return Finding(
            host.name, "memory", False, f"{available / GIB:.1f} GiB available",
            "stop what holds the memory (another gang: `swaplab launch status`; `docker ps`) before loading",
        )
    return Finding(host.name, "memory", True, f"{available / GIB:.1f} GiB available")


def _model_location(recipe: Recipe, cluster: Cluster) -> tuple[str, str] | None:
    """("path", PATH) for a model given as a path, ("hub", REPO FOLDER) for a hub repo, None for a bare name."""
    model = recipe.model
    if not model:
        return None
    if model.startswith(("/", "~/")):
        return "path", model
    if recipe.engine != "process" and HUB_REPO.match(model):
        hub = next((mount.host for mount in recipe.extra_mounts if mount.env == "HF_HOME"), None)
        root = hub or cluster.hf_cache_dir or "~/.cache/huggingface"
        return "hub", hub_folder(root, model)
    return None


async def _disk_finding(recipe: Recipe, cluster: Cluster, host: Host, target: SshTarget) -> Finding:
    location = _model_location(recipe, cluster)
    folder = cluster.local_cache_dir or (location[1] if location else "~")
    result = await remote.run_script(target, _FREE_DISK, folder)
    if not result.ok or not result.stdout.strip().isdigit():
        return Finding(host.name, "disk", False, f"cannot measure free space at {folder}", "check that df works on the node")
    free = int(result.stdout.strip())
    if free < MIN_FREE_DISK_BYTES:
        return Finding(
            host.name, "disk", False, f"{free / GIB:.1f} GiB free at {folder}",
            "free space there (old models in the hub cache, `docker system prune`)",
        )
    return Finding(host.name, "disk", True, f"{free / GIB:.1f} GiB free at {folder}")


async def _model_checks(recipe: Recipe, cluster: Cluster, nodes: Sequence[tuple[Host, SshTarget]]) -> list[Finding]:
    location = _model_location(recipe, cluster)
    if location is None or not nodes:
        return []
    kind, path = location
    script = _MODEL_FILES if kind == "path" else _HUB_REPO
    results = await asyncio.gather(*(remote.run_script(target, script, path) for _, target in nodes))
    findings = []
    seen: dict[str, list[str]] = {}
    for (host, _), result in zip(nodes, results, strict=True):
        fields = result.stdout.split()
        if not result.ok or len(fields) != 2:
            if kind == "hub" and not recipe.offline:
                findings.append(Finding(host.name, "model", True, f"{recipe.model}: not in the hub yet (`up` downloads it)"))
            else:
                findings.append(Finding(
                    host.name, "model", False, f"{recipe.model}: missing at {path}", _missing_fix(recipe, kind, path, host)
                ))
            continue
        size, digest = int(fields[0]), fields[1]
        seen.setdefault(f"{size} {digest}", []).append(host.name)
        findings.append(Finding(host.name, "model", True, f"{path}: {size / GIB:.2f} GiB, sha256 {digest[:16]}"))
    if len(seen) > 1:
        groups = "; ".join(f"{', '.join(names)}: {key.split()[0]} bytes, {key.split()[1][:16]}" for key, names in seen.items())
        findings.append(Finding(
            cluster.name, "model", False, f"{path} differs between nodes ({groups})",
            "copy it again from the head to the others (`rsync -a --checksum`) so every rank loads the same weights",
        ))
    return findings


def _missing_fix(recipe: Recipe, kind: str, path: str, host: Host) -> str:
    if kind == "path":
        return f"copy the model to {path} on {host.name} (e.g. `rsync -a {path} {host.name}:{path}`), or fix `model` in {recipe.path}"
    return (
        f"HF_HUB_OFFLINE is set, so `up` will not download it: fetch {recipe.model} into the hub once "
        "(`huggingface-cli download` with HF_HOME set to the hub), or unset HF_HUB_OFFLINE"
    )


async def _same_image(recipe: Recipe, nodes: Sequence[tuple[Host, SshTarget]]) -> list[Finding]:
    image = recipe.docker_image or ""
    results = await asyncio.gather(
        *(remote.run(target, ["docker", "image", "inspect", "--format", "{{.Id}}", image]) for _, target in nodes)
    )
    ids = {host.name: result.stdout.strip() for (host, _), result in zip(nodes, results, strict=True) if result.ok}
    missing = [host.name for host, _ in nodes if host.name not in ids]
    findings = []
    if missing:
        how = "builds and distributes it" if recipe.docker_image_dir else "pulls it"
        findings.append(Finding(", ".join(missing), "image", True, f"{image} not there yet (`up` {how})"))
    if len(set(ids.values())) > 1:
        listing = "; ".join(f"{name}: {image_id[:19]}" for name, image_id in ids.items())
        findings.append(Finding(
            "all", "image", False, f"{image} differs between nodes ({listing})",
            "remove the stale copies (`docker image rm`) and let `up` distribute one image"
            if recipe.docker_image_dir else f"`docker pull {image}` on every node, or pin it by digest",
        ))
    elif ids:
        findings.append(Finding("all", "image", True, f"{image}: {next(iter(ids.values()))[:19]} on {len(ids)} node(s)"))
    return findings


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return re.sub(r"\s+", " ", lines[-1]) if lines else ""
