"""`swaplab launch doctor`: preflight on every node, each failure with how to fix it.

Checks, per node, side by side: ssh reachable; for container engines Docker, its GPU
runtime and the GPUs; the recipe's ports free; free memory; password-less sudo for the
plan's sudo steps (drop_caches); the RDMA fabric and the transport NCCL will use there
(swaplab.launch.fabric). Then what the gang carries (swaplab.launch.payload): the image, the
model, free disk for it, and what copying the models needs. Last, the per-host NCCL
settings to paste into the clusters file. `up` runs the cheap subset (`preflight`) before it
starts anything.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

from swaplab.errors import SwaplabError
from swaplab.launch import fabric, payload, remote
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.engines import get_engine
from swaplab.launch.findings import GIB, Finding, last_line
from swaplab.launch.plan import (
    NodePlan,
    Plan,
    default_run_id,
    make_plan,
)
from swaplab.launch.remote import RemoteError, SshTarget
from swaplab.launch.spec import Recipe, Step

MIN_FREE_MEMORY_BYTES = 2 << 30


# $1: a port. Exit 0 when some socket listens on it (any address, IPv4 or IPv6).
_LISTENING = r"""
port=$(printf '%04X' "$1")
awk -v port="$port" '$4 == "0A" { split($2, local, ":"); if (local[2] == port) found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
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
    findings += await payload.image_checks(
        recipe, [(report.host, report.target) for report in reports], docker=[report.docker for report in reports]
    )
    model_findings, sizes = await payload.model_checks(recipe, cluster, up, node_plans)
    findings += model_findings
    findings += await payload.copy_checks(recipe, cluster, up, node_plans)
    known = max((size for size in sizes.values() if size), default=None)
    findings += await asyncio.gather(
        *(payload.disk_check(recipe, cluster, host, target, sizes.get(host.name), known) for host, target in up)
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
            host.name, "docker", False, f"no Docker engine answers ({last_line(version.stderr) or 'docker not found'})",
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
        Finding(host.name, "gpu", True, f"{count} GPU(s): {last_line(gpus.stdout)}") if gpus.ok and count
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


