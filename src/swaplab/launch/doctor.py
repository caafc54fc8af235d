"""`swaplab launch doctor`: preflight on every node, each failure with how to fix it.

Checks, per node, side by side: ssh reachable; for container engines Docker, its GPU
runtime and the GPUs; the recipe's ports free; free memory; password-less sudo for the
plan's sudo steps (drop_caches); the RDMA fabric and the transport NCCL will use there
(swaplab.launch.fabric); the recipe's image with its id, the same everywhere, and an entrypoint
that will not swallow the server command; the model
present and identical on every node (a path: size and content hash; a Hugging Face repo:
its blobs, which the hub names by their hash, and their sizes); free disk where the model
goes, against the model's size when a node has it; what copying the models needs (rsync on
the nodes, huggingface_hub here for download = "here", and each worker reaching the head over
the fabric for download = "head"). Last, the per-host NCCL settings to paste into the clusters file. `up` runs the cheap subset (`preflight`) before it starts anything.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from swaplab.errors import SwaplabError
from swaplab.launch import fabric, remote
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.engines import get_engine
from swaplab.launch.plan import (
    NodePlan,
    Plan,
    default_run_id,
    fabric_ssh,
    hub_folder,
    make_plan,
)
from swaplab.launch.remote import RemoteError, SshTarget
from swaplab.launch.spec import HUB_REPO, Recipe, Step

MIN_FREE_DISK_BYTES = 5 << 30
MIN_FREE_MEMORY_BYTES = 2 << 30
GIB = 1 << 30
# An image entrypoint that is one of these programs, or python running one of these modules,
# serves by itself (vllm/vllm-openai, lmsysorg/sglang's server images, llama.cpp's).
SERVER_PROGRAMS = ("vllm", "sglang", "llama-server")
SERVER_MODULES = ("vllm", "sglang")


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


# $1...: the command a plan step runs under sudo (sudo's own options removed). Prints
# "user NAME", "path PATH" (the command's full path, for a sudoers line) and one of
# "sudo missing", "sudo all" (no password for anything), "sudo command" (no password for
# this command: `sudo -l` lists it) or "sudo denied MESSAGE". Runs nothing as root.
_SUDO = r"""
echo "user $(id -un)"
path=$(command -v "$1" 2>/dev/null)
if [ -z "$path" ]; then
    for dir in /usr/sbin /sbin /usr/bin /bin; do if [ -x "$dir/$1" ]; then path=$dir/$1; break; fi; done
fi
echo "path ${path:-$1}"
if ! command -v sudo > /dev/null 2>&1; then echo "sudo missing"; exit 0; fi
if sudo -n true 2>/dev/null; then echo "sudo all"; exit 0; fi
if sudo -n -l "$@" > /dev/null 2>&1; then echo "sudo command"; exit 0; fi
echo "sudo denied $(sudo -n true 2>&1 | tail -n 1)"
"""


@dataclass(frozen=True)
class _NodeReport:
    """What the per-node checks found, and the facts the cross-node checks need."""

    host: Host
    target: SshTarget
    findings: list[Finding]
    docker: bool
    node_fabric: fabric.NodeFabric | None


def doctor(recipe: Recipe, cluster: Cluster) -> list[Finding]:
    """Check every node of the cluster for the recipe: every finding, passed or failed."""
    return asyncio.run(_doctor(recipe, cluster))


async def _doctor(recipe: Recipe, cluster: Cluster) -> list[Finding]:
    hosts = cluster.hosts[: recipe.required_nodes]
    targets = [remote.target_for(cluster, host) for host in hosts]
    reachable = await asyncio.gather(*(_reach(target) for target in targets))
    findings = list(reachable)
    up = [(host, target) for host, target, finding in zip(hosts, targets, reachable, strict=True) if finding.ok]
    plan = None
    if len(hosts) < recipe.required_nodes:
        findings.append(Finding(
            cluster.name, "nodes", False, f"the recipe needs {recipe.required_nodes} nodes, the cluster has {len(hosts)}",
            "add hosts to the cluster or lower required_nodes",
        ))
    else:
        try:
            plan = make_plan(recipe, cluster, run_id=default_run_id(recipe, cluster))
        except SwaplabError as error:
            findings.append(Finding(cluster.name, "plan", False, str(error), "`up` refuses this plan; fix the clusters file or the recipe"))
    node_plans = {node.host: node for node in plan.nodes} if plan else {}
    reports = await asyncio.gather(
        *(_node_checks(recipe, host, target, node_plans.get(host)) for host, target in up)
    )
    for report in reports:
        findings += report.findings
    findings += await _image_checks(recipe, reports)
    model_findings, sizes = await _model_checks(recipe, cluster, up)
    findings += model_findings
    findings += await _copy_findings(recipe, cluster, up)
    known = max((size for size in sizes.values() if size), default=None)
    findings += await asyncio.gather(
        *(_disk_finding(recipe, cluster, host, target, sizes.get(host.name), known) for host, target in up)
    )
    overrides = {
        report.host.name: fabric.nccl_overrides(report.node_fabric, report.host.fabric_ip) for report in reports if report.node_fabric
    }
    if any(overrides.values()):
        findings.append(Finding(
            "all", "nccl", True,
            "per-host NCCL settings for the clusters file, from what each node has:\n" + fabric.overrides_toml(overrides),
        ))
    return findings


async def preflight(plan: Plan) -> list[str]:
    """What `up` checks before it starts anything: Docker where needed, the ports free,
    password-less sudo for the sudo steps. Problems with fixes."""
    problems = []
    hosts = [node.host for node in plan.nodes]
    targets = [remote.target_for(plan.cluster, host) for host in hosts]
    checks = await asyncio.gather(*(_port_findings(plan.recipe, host, target) for host, target in zip(hosts, targets, strict=True)))
    if get_engine(plan.recipe.engine).uses_docker:
        checks += await asyncio.gather(*(_docker_findings(host, target) for host, target in zip(hosts, targets, strict=True)))
    checks += await asyncio.gather(
        *(_sudo_findings(plan.recipe, node, target) for node, target in zip(plan.nodes, targets, strict=True))
    )
    for findings in checks:
        problems += [f"{f.host}: {f.detail}; fix: {f.fix}" for f in findings if not f.ok]
    return problems


async def _reach(target: SshTarget) -> Finding:
    try:
        await remote.connect(target)
    except RemoteError as error:
        return Finding(str(target), "ssh", False, str(error).split(";", 1)[0], remote.reach_hint(target))
    return Finding(str(target), "ssh", True, "reachable")


async def _node_checks(recipe: Recipe, host: Host, target: SshTarget, node: NodePlan | None) -> _NodeReport:
    findings = []
    docker = False
    if get_engine(recipe.engine).uses_docker:
        docker_findings = await _docker_findings(host, target)
        docker = docker_findings[0].ok
        findings += docker_findings
    findings += await _port_findings(recipe, host, target)
    findings.append(await _memory_finding(host, target))
    if node is not None:
        findings += await _sudo_findings(recipe, node, target)
    node_fabric = None
    if node is not None and _meets_over_nccl(recipe):
        node_fabric = await fabric.gather_fabric(target)
        findings += _fabric_findings(recipe, node, node_fabric)
    return _NodeReport(host, target, findings, docker, node_fabric)


def _meets_over_nccl(recipe: Recipe) -> bool:
    """Whether the ranks talk NCCL across nodes: several nodes, and not llama.cpp (its RPC is plain TCP)."""
    return recipe.required_nodes > 1 and recipe.engine != "llamacpp"


def _fabric_findings(recipe: Recipe, node: NodePlan, node_fabric: fabric.NodeFabric) -> list[Finding]:
    """The node's RDMA facts, and the transport NCCL will use there with the rank's env and container."""
    host = node.host
    run = next((step.argv for step in node.steps if step.kind == "rank" and step.argv[1:2] == ("run",)), None)
    access = fabric.rank_access(run, node_fabric, recipe.docker_image)
    transport = fabric.nccl_transport(node_fabric, node.env, access, host=host.name, fabric_ip=host.fabric_ip)
    findings = [Finding(host.name, "rdma", True, fabric.describe_fabric(node_fabric))]
    cause = transport.cause
    findings.append(Finding(host.name, "nccl", cause is None, f"NCCL: {transport.describe()}", cause.fix if cause else ""))
    findings += [Finding(host.name, "nccl", False, problem.what, problem.fix) for problem in transport.problems]
    return findings


async def _sudo_findings(recipe: Recipe, node: NodePlan, target: SshTarget) -> list[Finding]:
    """Each prepare step that runs `sudo` (drop-caches): can its command run without a password?"""
    findings = []
    for step in node.steps:
        command = _sudo_command(step)
        if command:
            result = await remote.run_script(target, _SUDO, *command)
            findings.append(sudo_finding(recipe, node.host.name, step, result.stdout))
    return findings


def _sudo_command(step: Step) -> tuple[str, ...]:
    """The command a `sudo ...` step runs, without sudo and its options; () for other steps."""
    if step.kind != "prepare" or step.argv[:1] != ("sudo",):
        return ()
    words = list(step.argv[1:])
    while words and words[0].startswith("-"):
        words.pop(0)
    return tuple(words)


def sudo_finding(recipe: Recipe, host: str, step: Step, output: str) -> Finding:
    """The finding for a sudo step from `_SUDO`'s output on `host` (pure)."""
    command = _sudo_command(step)
    facts = dict(line.split(" ", 1) for line in output.splitlines() if " " in line)
    line = sudoers_line(facts.get("user", "USER"), facts.get("path", command[0]), command[1:])
    why = f"`{' '.join(step.argv)}` ({step.name}, drop_caches = true)"
    verdict = facts.get("sudo", "")
    if verdict in ("all", "command"):
        return Finding(host, "sudo", True, f"password-less sudo for {why}")
    off = f"or set drop_caches = false in {recipe.path}"
    if verdict == "missing":
        return Finding(
            host, "sudo", False, f"sudo is not installed, and `up` runs {why}",
            f"install sudo on {host} (`apt-get install sudo`) and allow that command in /etc/sudoers.d/swaplab: `{line}`; {off}",
        )
    message = verdict.removeprefix("denied").strip() or "no answer from sudo"
    return Finding(
        host, "sudo", False, f"sudo asks for a password ({message}), and `up` runs {why}",
        f"on {host}, `sudo visudo -f /etc/sudoers.d/swaplab` and add `{line}`; {off}",
    )


def sudoers_line(user: str, path: str, arguments: Sequence[str]) -> str:
    """The sudoers line that lets `user` run exactly `path arguments` as root without a password.

    sudoers wants `,` `:` `=` and `\\` escaped in a command's arguments (sudo-rs insists on `=`).
    """
    escaped = [re.sub(r"([,:=\\])", r"\\\1", argument) for argument in arguments]
    return f"{user} ALL=(root) NOPASSWD: {' '.join([path, *escaped])}"


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


def _model_location(recipe: Recipe, cluster: Cluster, host: Host) -> tuple[str, str] | None:
    """("path", PATH) for a model given as a path, ("hub", REPO FOLDER) for a hub repo (in the
    host's cache), None for a bare name."""
    model = recipe.model
    if not model:
        return None
    if model.startswith(("/", "~/")):
        return "path", model
    if get_engine(recipe.engine).model_is_hub_repo and HUB_REPO.match(model):
        hub = next((mount.host for mount in recipe.extra_mounts if mount.env == "HF_HOME"), None)
        return "hub", hub_folder(hub or cluster.hub_of(host), model)
    return None


async def _disk_finding(
    recipe: Recipe, cluster: Cluster, host: Host, target: SshTarget, here: int | None, model_size: int | None
) -> Finding:
    """Free space where the model goes (the node-local mirror, or where it is read from), against
    what of the model is still to come when its size is known (a node has it)."""
    location = _model_location(recipe, cluster, host)
    # Hub repos are mirrored to local_cache_dir (plan.py); a model given as a path is read where it is.
    mirror = bool(cluster.local_cache_dir and location and location[0] == "hub" and recipe.model)
    if mirror and cluster.local_cache_dir and recipe.model:
        folder = hub_folder(cluster.local_cache_dir, recipe.model)
        mirrored = await remote.run_script(target, _HUB_REPO, folder)
        here = int(mirrored.stdout.split()[0]) if mirrored.ok and mirrored.stdout.split() else None
    else:
        folder = location[1] if location else (cluster.local_cache_dir or "~")
    result = await remote.run_script(target, _FREE_DISK, folder)
    if not result.ok or not result.stdout.strip().isdigit():
        return Finding(host.name, "disk", False, f"cannot measure free space at {folder}", "check that df works on the node")
    return disk_finding(host.name, folder, int(result.stdout.strip()), here, model_size, mirror=mirror)


def disk_finding(host: str, folder: str, free: int, here: int | None, model_size: int | None, *, mirror: bool = False) -> Finding:
    """Free space at `folder` against the model still to come there (its size less what `here`
    already holds), or against MIN_FREE_DISK_BYTES alone when the size is unknown (pure)."""
    detail = f"{free / GIB:.1f} GiB free at {folder}"
    missing = max(model_size - (here or 0), 0) if model_size else None
    if missing:
        detail += f"; the model needs {missing / GIB:.1f} GiB more there ({model_size / GIB:.1f} GiB in all)"
    elif missing == 0:
        detail += " (the model is there)"
    short = max(missing or 0, MIN_FREE_DISK_BYTES) - free
    if short > 0:
        return Finding(
            host, "disk", False, detail,
            f"free {short / GIB:.1f} GiB there (old models in the hub cache, `docker system prune`)"
            + (", or point local_cache_dir at a larger disk" if mirror else ""),
        )
    return Finding(host, "disk", True, detail)


async def _model_checks(
    recipe: Recipe, cluster: Cluster, nodes: Sequence[tuple[Host, SshTarget]]
) -> tuple[list[Finding], dict[str, int | None]]:
    """The model on every node, and its size on each (None where it is missing)."""
    locations = {host.name: _model_location(recipe, cluster, host) for host, _ in nodes}
    if not nodes or None in locations.values():
        return [], {}
    results = await asyncio.gather(*(
        remote.run_script(target, _MODEL_FILES if locations[host.name][0] == "path" else _HUB_REPO, locations[host.name][1])
        for host, target in nodes
    ))
    findings = []
    sizes: dict[str, int | None] = {}
    seen: dict[str, list[str]] = {}
    for (host, _), result in zip(nodes, results, strict=True):
        kind, path = locations[host.name]
        fields = result.stdout.split()
        if not result.ok or len(fields) != 2:
            sizes[host.name] = None
            coming = _how_the_model_comes(cluster, host)
            if kind == "hub" and (not recipe.offline or coming != "downloads it"):
                findings.append(Finding(host.name, "model", True, f"{recipe.model}: not in its cache yet (`up` {coming})"))
            else:
                findings.append(Finding(
                    host.name, "model", False, f"{recipe.model}: missing at {path}", _missing_fix(recipe, kind, path, host)
                ))
            continue
        size, digest = int(fields[0]), fields[1]
        sizes[host.name] = size
        seen.setdefault(f"{size} {digest}", []).append(host.name)
        findings.append(Finding(host.name, "model", True, f"{path}: {size / GIB:.2f} GiB, sha256 {digest[:16]}"))
    if len(seen) > 1:
        groups = "; ".join(f"{', '.join(names)}: {key.split()[0]} bytes, {key.split()[1][:16]}" for key, names in seen.items())
        findings.append(Finding(
            cluster.name, "model", False, f"{recipe.model} differs between nodes ({groups})",
            "copy it again from the head to the others (`rsync -a --checksum`) so every rank loads the same weights",
        ))
    return findings, sizes


def _how_the_model_comes(cluster: Cluster, host: Host) -> str:
    """What `up` does to bring a hub model to `host` (see plan._model_steps)."""
    if cluster.download == "here":
        return "sends it from here" if host == cluster.head or not cluster.shares_hub else "sends it to the shared cache"
    if host == cluster.head or cluster.shares_hub:
        return "downloads it"
    return "copies it from the head"


async def _copy_findings(recipe: Recipe, cluster: Cluster, nodes: Sequence[tuple[Host, SshTarget]]) -> list[Finding]:
    """What `up` needs to fetch and copy the recipe's hub repos: huggingface_hub and rsync here
    (download = "here"), rsync on every node a copy reaches, and each worker reaching the head
    over the fabric (download = "head", copies from it)."""
    models = recipe.hub_models if get_engine(recipe.engine).model_is_hub_repo else ()
    if not models or not nodes:
        return []
    findings = []
    copies = not cluster.shares_hub or cluster.download == "here"
    if cluster.download == "here":
        findings.append(
            Finding("here", "copy", True, "huggingface_hub here, for download = \"here\"")
            if importlib.util.find_spec("huggingface_hub") else
            Finding("here", "copy", False, "huggingface_hub is missing from swaplab's Python (download = \"here\" fetches with it)",
                    "pip install 'swaplab[launch]' where swaplab is installed, or set download = \"head\"")
        )
        if shutil.which("rsync") is None:
            findings.append(Finding("here", "copy", False, "rsync is missing here", "install rsync (apt-get install rsync)"))
    head = next(((host, target) for host, target in nodes if host == cluster.head), None)
    workers = [(host, target) for host, target in nodes if host != cluster.head]
    if cluster.download == "head" and head is not None and not get_engine(recipe.engine).uses_docker:
        # engine = "process" has no image to fetch with: the head's own Python does it.
        head_host, head_target = head
        found = await remote.run(head_target, [cluster.python, "-c", "import huggingface_hub"])
        findings.append(
            Finding(head_host.name, "copy", True, f"{cluster.python} has huggingface_hub (the download runs there)")
            if found.ok else
            Finding(head_host.name, "copy", False, f"{cluster.python} cannot import huggingface_hub: {_last_line(found.stderr) or 'no message'}",
                    f"install huggingface_hub for it on {head_host.name}, or set python in the clusters file to a Python that has it")
        )
    if not copies:
        return findings
    # Into every node, or into the shared cache through the head; a head copied from runs rsync too.
    receivers = ([head] if head else []) if cluster.download == "here" and cluster.shares_hub else nodes
    present = await asyncio.gather(*(remote.run(target, ["sh", "-c", "command -v rsync"]) for _, target in receivers))
    for (host, _), result in zip(receivers, present, strict=True):
        findings.append(
            Finding(host.name, "copy", True, f"rsync {result.stdout.strip()}") if result.ok else
            Finding(host.name, "copy", False, "rsync is missing (the models are copied with it)", "install rsync on the node")
        )
    if cluster.download == "head":
        address = cluster.head.fabric_ip
        probe = [*fabric_ssh(cluster, cluster.head), "-o", "ConnectTimeout=10", address, "true"]
        reached = await asyncio.gather(*(remote.run(target, probe) for _, target in workers))
        for (host, _), result in zip(workers, reached, strict=True):
            detail = f"reaches the head at {address} over ssh (the models are copied from it)"
            findings.append(Finding(host.name, "copy", True, detail) if result.ok else Finding(
                host.name, "copy", False, f"cannot reach the head at {address} over ssh: {_last_line(result.stderr) or 'no message'}",
                f"authorize {host.name}'s key on the head (on {host.name}: `ssh-copy-id {address}`), "
                "or set download = \"here\" in the clusters file",
            ))
    return findings


def _missing_fix(recipe: Recipe, kind: str, path: str, host: Host) -> str:
    if kind == "path":
        return f"copy the model to {path} on {host.name} (e.g. `rsync -a {path} {host.name}:{path}`), or fix `model` in {recipe.path}"
    return (
        f"HF_HUB_OFFLINE is set, so `up` will not download it: fetch {recipe.model} into the hub once "
        "(`huggingface-cli download` with HF_HOME set to the hub), or unset HF_HUB_OFFLINE"
    )


async def _image_checks(recipe: Recipe, reports: Sequence[_NodeReport]) -> list[Finding]:
    """The recipe's image on each node with its id (the same everywhere), or why there is none;
    where it is present, whether its entrypoint would take the server command as arguments."""
    if not reports:
        return []
    if not get_engine(recipe.engine).uses_docker:
        return [Finding("all", "image", True, f"none: engine = \"{recipe.engine}\" runs the recipe's args on each node, no container")]
    image = recipe.docker_image or ""
    checked = [report for report in reports if report.docker]
    results = await asyncio.gather(
        *(remote.run(report.target, ["docker", "image", "inspect", "--format", "{{.Id}}", image]) for report in checked)
    )
    how = "builds it here and loads it on every node" if recipe.docker_image_dir else "copies it from here or the head, or pulls it"
    findings = []
    ids: dict[str, str] = {}
    for report, result in zip(checked, results, strict=True):
        if result.ok and result.stdout.strip():
            ids[report.host.name] = result.stdout.strip()
            findings.append(Finding(report.host.name, "image", True, f"{image} present, {ids[report.host.name][:19]}"))
        else:
            findings.append(Finding(report.host.name, "image", True, f"{image} not there yet (`up` {how})"))
    if len(set(ids.values())) > 1:
        listing = "; ".join(f"{name}: {image_id[:19]}" for name, image_id in ids.items())
        findings.append(Finding(
            "all", "image", False, f"{image} differs between nodes ({listing})",
            "`up` replaces each copy whose id differs from this machine's (or, without one here, the head's); "
            f"or pin {image} by digest",
        ))
    present = [report for report in checked if report.host.name in ids]
    entrypoints = await asyncio.gather(*(
        remote.run(report.target, ["docker", "image", "inspect", "--format", "{{json .Config.Entrypoint}}", image])
        for report in present
    ))
    findings += [
        entrypoint_finding(recipe, report.host.name, result.stdout)
        for report, result in zip(present, entrypoints, strict=True) if result.ok
    ]
    return findings


def serves_itself(entrypoint: Sequence[str]) -> bool:
    """Whether an image's entrypoint is a server (vllm, sglang, llama-server, python -m vllm...
    or sglang...), which takes a command given after the image as its own arguments (pure).

    No entrypoint, or a wrapper that execs the command it is given (NGC's nvidia_entrypoint.sh),
    runs that command as it is; so do the other wrappers (tini, a shell), as far as doctor can tell.
    """
    if not entrypoint:
        return False
    program = PurePosixPath(entrypoint[0]).name
    if program in SERVER_PROGRAMS:
        return True
    if re.fullmatch(r"python[0-9.]*", program):
        modules = [module for option, module in itertools.pairwise(entrypoint) if option == "-m"]
        return bool(modules) and modules[0].split(".")[0] in SERVER_MODULES
    return False


def entrypoint_finding(recipe: Recipe, host: str, output: str) -> Finding:
    """The finding for the image's entrypoint on `host`, from `docker image inspect --format
    '{{json .Config.Entrypoint}}'` (pure): a server entrypoint fails unless the recipe replaces it."""
    image = recipe.docker_image or ""
    try:
        words = json.loads(output) or []
    except json.JSONDecodeError:
        words = None
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        return Finding(host, "image", True, f"{image}: entrypoint not checked, unreadable ({output.strip()!r})")
    shown = f"entrypoint `{shlex.join(words)}`" if words else "no entrypoint"
    if recipe.replace_image_entrypoint:
        return Finding(host, "image", True, f"{image}: {shown}, replaced by the server command (replace_image_entrypoint = true)")
    if serves_itself(words):
        return Finding(
            host, "image", False,
            f"{image}: {shown} is a server itself; the server command after the image would become its arguments "
            "(replace_image_entrypoint = false)",
            f"set replace_image_entrypoint = true in {recipe.path}, so the server command replaces the image's entrypoint",
        )
    return Finding(host, "image", True, f"{image}: {shown}, the server command follows the image (replace_image_entrypoint = false)")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return re.sub(r"\s+", " ", lines[-1]) if lines else ""
