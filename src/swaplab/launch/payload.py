"""Doctor's checks of what a gang carries to its nodes: the recipe's image (present, one id
everywhere, an entrypoint that will not swallow the server command), its model (present and
identical, free disk where it goes) and what `up` needs to fetch and copy the models.

Each check runs over ssh on every reachable node side by side and returns findings
(swaplab.launch.findings); the pure parts (`disk_finding`, `serves_itself`,
`entrypoint_finding`) decide from what the nodes printed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from swaplab.launch import remote
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.engines import get_engine
from swaplab.launch.findings import GIB, Finding, last_line
from swaplab.launch.plan import DOWNLOAD_STEP, NodePlan, fabric_ssh, hub_folder, hub_of
from swaplab.launch.remote import SshTarget
from swaplab.launch.spec import HUB_REPO, Recipe

MIN_FREE_DISK_BYTES = 5 << 30
# An image entrypoint that is one of these programs, or python running one of these modules,
# serves by itself (vllm/vllm-openai, lmsysorg/sglang's server images, llama.cpp's).
SERVER_PROGRAMS = ("vllm", "sglang", "llama-server")
SERVER_MODULES = ("vllm", "sglang")

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


def _model_location(recipe: Recipe, cluster: Cluster, host: Host) -> tuple[str, str] | None:
    """("path", PATH) for a model given as a path, ("hub", REPO FOLDER) for a hub repo (in the
    host's cache), None for a bare name."""
    model = recipe.model
    if not model:
        return None
    if model.startswith(("/", "~/")):
        return "path", model
    if get_engine(recipe.engine).model_is_hub_repo and HUB_REPO.match(model):
        return "hub", hub_folder(hub_of(recipe, cluster, host), model)
    return None


async def disk_check(
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


async def model_checks(
    recipe: Recipe, cluster: Cluster, nodes: Sequence[tuple[Host, SshTarget]], plans: Mapping[Host, NodePlan]
) -> tuple[list[Finding], dict[str, int | None]]:
    """The model on every node, and its size on each (None where it is missing); a hub repo
    missing where `up` will bring it (as the node's plan says) is fine."""
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
            coming, fetches = _arrival(plans.get(host), plans.get(cluster.head))
            if kind == "hub" and not (recipe.offline and fetches):
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


def _arrival(node: NodePlan | None, head: NodePlan | None) -> tuple[str, bool]:
    """How `up` brings the hub models to a node, read from its plan (a node with no step of its
    own reads the shared cache the head's steps fill), and whether that fetches from the hub
    (which HF_HUB_OFFLINE forbids) rather than copying."""
    copies = _copies(node) if node else set()
    if "send" in copies:
        return "sends it from here", False
    if "prepare" in copies:
        return "copies it from the head", False
    if node is not None and any(step.name == DOWNLOAD_STEP for step in node.steps):
        return "downloads it", True
    if head is not None and node is not head:
        how, fetches = _arrival(head, None)
        return f"{how} to the head, into the cache every node shares", fetches
    return "downloads it", True


def _copies(node: NodePlan) -> set[str]:
    """The kinds of the node's model copies: "send" (from here), "prepare" (pulled from the head)."""
    return {step.kind for step in node.steps if step.name.startswith("copy ")}


async def copy_checks(
    recipe: Recipe, cluster: Cluster, nodes: Sequence[tuple[Host, SshTarget]], plans: Mapping[Host, NodePlan]
) -> list[Finding]:
    """What the plan's download and copies need: huggingface_hub and rsync here when the
    download runs here, the head's `python` for a process recipe's download there, rsync on
    every node a copy reaches (the head too, when workers pull from it), and each pulling worker
    reaching the head over the fabric."""
    findings = []
    head = next(((host, target) for host, target in nodes if host == cluster.head), None)
    head_steps = plans[cluster.head].steps if cluster.head in plans else ()
    download = next((step for step in head_steps if step.name == DOWNLOAD_STEP), None)
    if download is not None and download.kind == "local":
        findings.append(
            Finding("here", "copy", True, "huggingface_hub here, for download = \"here\"")
            if importlib.util.find_spec("huggingface_hub") else
            Finding("here", "copy", False, "huggingface_hub is missing from swaplab's Python (download = \"here\" fetches with it)",
                    "pip install 'swaplab[launch]' where swaplab is installed, or set download = \"head\"")
        )
        if shutil.which("rsync") is None:
            findings.append(Finding("here", "copy", False, "rsync is missing here", "install rsync (apt-get install rsync)"))
    if download is not None and download.kind == "prepare" and head is not None and not get_engine(recipe.engine).uses_docker:
        # engine = "process" has no image to fetch with: the head's own Python does it.
        head_host, head_target = head
        found = await remote.run(head_target, [cluster.python, "-c", "import huggingface_hub"])
        findings.append(
            Finding(head_host.name, "copy", True, f"{cluster.python} has huggingface_hub (the download runs there)")
            if found.ok else
            Finding(head_host.name, "copy", False, f"{cluster.python} cannot import huggingface_hub: {last_line(found.stderr) or 'no message'}",
                    f"install huggingface_hub for it on {head_host.name}, or set python in the clusters file to a Python that has it")
        )
    pulling = [(host, target) for host, target in nodes if host in plans and "prepare" in _copies(plans[host])]
    receivers = [(host, target) for host, target in nodes if host in plans and _copies(plans[host])]
    if pulling and head is not None and head not in receivers:
        receivers.insert(0, head)  # the head's rsync serves the workers' pulls
    present = await asyncio.gather(*(remote.run(target, ["sh", "-c", "command -v rsync"]) for _, target in receivers))
    for (host, _), result in zip(receivers, present, strict=True):
        findings.append(
            Finding(host.name, "copy", True, f"rsync {result.stdout.strip()}") if result.ok else
            Finding(host.name, "copy", False, "rsync is missing (the models are copied with it)", "install rsync on the node")
        )
    address = cluster.head.fabric_ip
    probe = [*fabric_ssh(cluster, cluster.head), "-o", "ConnectTimeout=10", address, "true"]
    reached = await asyncio.gather(*(remote.run(target, probe) for _, target in pulling))
    for (host, _), result in zip(pulling, reached, strict=True):
        detail = f"reaches the head at {address} over ssh (the models are copied from it)"
        findings.append(Finding(host.name, "copy", True, detail) if result.ok else Finding(
            host.name, "copy", False, f"cannot reach the head at {address} over ssh: {last_line(result.stderr) or 'no message'}",
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


async def image_checks(recipe: Recipe, nodes: Sequence[tuple[Host, SshTarget]], *, docker: Sequence[bool]) -> list[Finding]:
    """The recipe's image on each node with its id (the same everywhere), or why there is none;
    where it is present, whether its entrypoint would take the server command as arguments."""
    if not nodes:
        return []
    if not get_engine(recipe.engine).uses_docker:
        return [Finding("all", "image", True, f"none: engine = \"{recipe.engine}\" runs the recipe's args on each node, no container")]
    image = recipe.docker_image or ""
    checked = [node for node, answers in zip(nodes, docker, strict=True) if answers]
    # One inspect per node: the id, then the entrypoint as JSON, on one line.
    results = await asyncio.gather(*(
        remote.run(target, ["docker", "image", "inspect", "--format", "{{.Id}} {{json .Config.Entrypoint}}", image])
        for _, target in checked
    ))
    how = "builds it here and loads it on every node" if recipe.docker_image_dir else "copies it from here or the head, or pulls it"
    findings = []
    ids: dict[str, str] = {}
    entrypoints: dict[str, str] = {}
    for (host, _), result in zip(checked, results, strict=True):
        if result.ok and result.stdout.strip():
            ids[host.name], _, entrypoints[host.name] = result.stdout.strip().partition(" ")
            findings.append(Finding(host.name, "image", True, f"{image} present, {ids[host.name][:19]}"))
        else:
            findings.append(Finding(host.name, "image", True, f"{image} not there yet (`up` {how})"))
    if len(set(ids.values())) > 1:
        listing = "; ".join(f"{name}: {image_id[:19]}" for name, image_id in ids.items())
        findings.append(Finding(
            "all", "image", False, f"{image} differs between nodes ({listing})",
            "`up` replaces each copy whose id differs from this machine's (or, without one here, the head's); "
            f"or pin {image} by digest",
        ))
    findings += [entrypoint_finding(recipe, host, entrypoint) for host, entrypoint in entrypoints.items()]
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
