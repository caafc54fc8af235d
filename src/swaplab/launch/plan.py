"""What `up` runs on each node, step by step, as exact argv: a pure function of recipe and cluster.

Every step's argv is what runs on its node (through ssh, each word quoted, after a leading
`~/` is replaced with that node's home: see `expand_home`). Recipe data never reaches a
shell: where a step needs one (none does today beyond fixed scripts), the data would follow
the script as positional arguments.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from swaplab.errors import SwaplabError
from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.engine import Gang
from swaplab.launch.engines import get_engine
from swaplab.launch.hooks import staging_steps
from swaplab.launch.spec import HubModel, Mount, Recipe, Step

DEFAULT_HF_HOME = "/root/.cache/huggingface"
"""Where the node's Hugging Face cache is mounted when the recipe mounts no HF_HOME itself."""

DOWNLOAD_SCRIPT = (
    "import sys\n"
    "from huggingface_hub import snapshot_download\n"
    "for spec in sys.argv[1:]:\n"
    "    repo, _, revision = spec.partition('@')\n"
    "    print(snapshot_download(repo, revision=revision or None), flush=True)\n"
)
"""Run once (in the recipe's image on the head, or here); the repos arrive as arguments
(`REPO` or `REPO@REVISION`), never as code."""

DOWNLOAD_STEP = "download-models"
RSYNC = ("rsync", "--archive", "--mkpath", "--info=name1,progress2,stats1")
"""Every copy of a hub repo: attributes and symlinks kept, folders made, each file named as it
is copied, progress, and a two-line summary (nothing named: nothing was copied)."""

VERIFY_SCRIPT = """\
import hashlib, os, sys
source, mirror = sys.argv[1], sys.argv[2]
faults, files, size = [], 0, 0
for name in sorted(os.listdir(os.path.join(source, "blobs"))):
    if name.endswith(".incomplete"):
        continue
    expected = os.path.getsize(os.path.join(source, "blobs", name))
    copy = os.path.join(mirror, "blobs", name)
    if not os.path.isfile(copy) or os.path.getsize(copy) != expected:
        faults.append(f"{name}: missing or not {expected} bytes")
        continue
    # Hub blobs are named by their hash: sha256 for LFS files, git's blob sha1 otherwise.
    digest = hashlib.sha256() if len(name) == 64 else hashlib.sha1(b"blob %d\\0" % expected)
    with open(copy, "rb") as blob:
        while chunk := blob.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != name:
        faults.append(f"{name}: content does not match its hash")
    files, size = files + 1, size + expected
for line in faults:
    print("mirror fault:", line, file=sys.stderr)
print(f"verified {files} files, {size} bytes in {mirror}")
sys.exit(1 if faults or not files else 0)
"""
"""Checks a mirrored hub repo on its node: every blob of the source present with its size,
and its content matching the hash it is named by (no second read of the source needed)."""


@dataclass(frozen=True)
class NodePlan:
    """The steps of one node, in order, and the environment its rank process gets."""

    host: Host
    rank: int
    steps: tuple[Step, ...]
    env: Mapping[str, str]
    """For engine "process", the environment to run the rank with; for container engines
    the same variables are already `-e` flags in the docker run argv (shown for reference)."""


@dataclass(frozen=True)
class Plan:
    """Everything `up` would do for a recipe on a cluster."""

    recipe: Recipe
    cluster: Cluster
    run_id: str
    nodes: tuple[NodePlan, ...]
    head_url: str
    """http://<head fabric_ip>:<port>"""
    labels: Mapping[str, str]
    """swaplab.run, swaplab.recipe, swaplab.recipe-hash (each container adds swaplab.rank)."""
    start_order: tuple[tuple[int, str], ...] = ()
    """The rank steps as (rank, step name), in the order the engine needs them started."""

    def rank_steps(self) -> tuple[tuple[NodePlan, Step], ...]:
        """The long-running steps in start order, each with its node."""
        by_rank = {node.rank: node for node in self.nodes}
        return tuple(
            (by_rank[rank], next(step for step in by_rank[rank].steps if step.name == name))
            for rank, name in self.start_order
        )


def default_run_id(recipe: Recipe, cluster: Cluster) -> str:
    """The run id of a recipe on a cluster: the recipe's slug and a hash of its values and the
    cluster's name. Deterministic, so `plan` shows what `up` runs and golden files stay put."""
    suffix = hashlib.sha256(f"{recipe.digest()}\n{cluster.name}".encode()).hexdigest()[:8]
    return f"{recipe.slug}-{suffix}"


def make_plan(recipe: Recipe, cluster: Cluster, *, run_id: str) -> Plan:
    """The plan of `recipe` on `cluster` (pure: reads nothing, runs nothing).

    Raises SwaplabError when the cluster cannot carry the recipe (too few hosts, or a
    loopback fabric_ip for an engine whose ranks meet over a real fabric).
    """
    engine = get_engine(recipe.engine)
    if len(cluster.hosts) < recipe.required_nodes:
        raise SwaplabError(
            f"recipe {recipe.path} needs {recipe.required_nodes} nodes; cluster {cluster.name!r} has "
            f"{len(cluster.hosts)}: add hosts to it or lower required_nodes"
        )
    hosts = cluster.hosts[: recipe.required_nodes]
    if engine.uses_docker:
        for host in hosts:
            if host.is_loopback:
                raise SwaplabError(
                    f"host {host.name} of cluster {cluster.name!r} has the loopback fabric_ip {host.fabric_ip}: "
                    f"{recipe.engine} ranks on different nodes meet there; set its fabric address "
                    "(loopback is for engine = \"process\" only)"
                )
    labels = MappingProxyType({
        "swaplab.run": run_id,
        "swaplab.recipe": recipe.slug,
        "swaplab.recipe-hash": recipe.digest(),
    })
    own_hub = own_hub_mount(recipe)
    hubs = tuple(hub_of(recipe, cluster, host) for host in hosts)
    models = recipe.hub_models if engine.model_is_hub_repo else ()
    mirroring = bool(cluster.local_cache_dir and models)
    # What each rank reads: its node-local mirror, or its hub.
    rank_hubs = tuple(cluster.local_cache_dir or hub for hub in hubs) if mirroring else hubs
    if engine.uses_docker:
        # Every container engine gets the node's cache, so nothing downloads into a throwaway container.
        hub_mount = own_hub or Mount(host=hubs[0], container=DEFAULT_HF_HOME, env="HF_HOME")
        mounts = recipe.extra_mounts if own_hub else (*recipe.extra_mounts, hub_mount)
        mount_env = {mount.env: mount.container for mount in mounts if mount.env}
    else:
        hub_mount, mounts = None, ()
        mount_env = {}
    gang = Gang(
        recipe=recipe,
        cluster=cluster,
        hosts=hosts,
        run_id=run_id,
        labels=labels,
        mounts=mounts,
        base_env=MappingProxyType({**mount_env, **recipe.env, **cluster.nccl}),
        engine=engine,
        hub_mount=hub_mount,
        hub_dirs=rank_hubs if (engine.uses_docker or models) else (),
    )
    # Every rank process gets the secrets in its environment (the docker client, for containers).
    ordered = tuple((rank, replace(step, secrets=recipe.secret_keys)) for rank, step in engine.rank_steps(gang))
    model_steps = _model_steps(recipe, cluster, hosts, models, hubs, hub_mount, labels)
    nodes = []
    for rank, host in enumerate(hosts):
        steps: list[Step] = []
        if engine.uses_docker:
            steps += _image_steps(recipe, head=rank == 0)
        steps += model_steps[rank]
        steps += staging_steps(recipe, run_id)
        if recipe.drop_caches:
            steps += _drop_caches_steps()
        steps += [step for step_rank, step in ordered if step_rank == rank]
        nodes.append(NodePlan(host=host, rank=rank, steps=tuple(steps), env=MappingProxyType(gang.env(rank))))
    head = hosts[0].fabric_ip
    return Plan(
        recipe=recipe,
        cluster=cluster,
        run_id=run_id,
        nodes=tuple(nodes),
        head_url=f"http://{f'[{head}]' if ':' in head else head}:{recipe.port}",
        labels=labels,
        start_order=tuple((rank, step.name) for rank, step in ordered),
    )


IMAGE_ID = ("docker", "image", "inspect", "--format", "{{.Id}}")
"""The argv (less the image) that prints an image's id where it is present."""
IMAGE_FROM_HEAD = 'head=$1 image=$2; shift 2; "$@" "$head" docker save "$image" | docker load'
"""Run on a worker: the head's copy of the image over the fabric, loaded here. The head's
address, the image and the ssh command arrive as positional parameters, never as code."""


def _image_steps(recipe: Recipe, *, head: bool) -> list[Step]:
    image = recipe.docker_image or ""
    if recipe.docker_image_dir is None:
        return [Step("image", ("docker", "pull", image), "prepare", image=image)]
    # Built once, on the launching machine; then loaded from here on every node whose id differs.
    steps = [Step("build-image", ("docker", "build", "--tag", image, str(recipe.docker_image_dir)), "local")] if head else []
    steps.append(Step("image", ("docker", "load"), "prepare", image=image, stdin_from=("docker", "save", image)))
    return steps


def image_from_head(cluster: Cluster, image: str) -> tuple[str, ...]:
    """What a worker runs to load the head's copy of `image` (see IMAGE_FROM_HEAD)."""
    return ("sh", "-c", IMAGE_FROM_HEAD, "sh", cluster.head.fabric_ip, image, *fabric_ssh(cluster, cluster.head))


def _model_steps(
    recipe: Recipe, cluster: Cluster, hosts: Sequence[Host], models: Sequence[HubModel],
    hubs: Sequence[str], hub_mount: Mount | None, labels: Mapping[str, str],
) -> list[list[Step]]:
    """Each rank's steps that bring the recipe's hub repos to its node: one download (on the head,
    or here), then copies to the nodes that do not share the hub, then the per-node mirrors."""
    steps: list[list[Step]] = [[] for _ in hosts]
    if not models:
        return steps
    if cluster.download == "here":
        steps[0].append(_download_here(recipe, cluster, models))
        # Into every node's hub, or into the one hub every node sees (through the head).
        for rank in [0] if cluster.shares_hub else range(len(hosts)):
            for model in models:
                steps[rank] += _copy_steps(
                    model, hub_folder(cluster.download_dir, model.repo),
                    _remote_path(hosts[rank].name, hub_folder(hubs[rank], model.repo)),
                    kind="send", ssh=_rsync_ssh(cluster, hosts[rank]),
                )
    else:
        steps[0].append(_download_on_head(recipe, cluster, hubs[0], models, hub_mount, labels))
        if not cluster.shares_hub:
            for rank in range(1, len(hosts)):
                for model in models:
                    steps[rank] += _copy_steps(
                        model, _remote_path(hosts[0].fabric_ip, hub_folder(hubs[0], model.repo)),
                        hub_folder(hubs[rank], model.repo),
                        kind="prepare", ssh=_rsync_ssh(cluster, hosts[0]), after_head=DOWNLOAD_STEP,
                    )
    if cluster.local_cache_dir:
        # The hub is shared: each node mirrors it once the head's steps brought the models there.
        head_done = steps[0][-1].name
        for rank in range(len(hosts)):
            mirror = _mirror_steps(models, hubs[rank], cluster.local_cache_dir)
            if rank:
                mirror[0] = replace(mirror[0], after_head=head_done)
            steps[rank] += mirror
    return steps


def _download_on_head(
    recipe: Recipe, cluster: Cluster, hub: str, models: Sequence[HubModel], mount: Mount | None, labels: Mapping[str, str]
) -> Step:
    """Fetch the models into the head's hub: in the recipe's image (which has huggingface_hub)
    with the hub mounted as the ranks mount it, or for engine "process" with the cluster's `python`.
    With HF_HUB_OFFLINE in [env] it fetches nothing: it proves the hub has them, before any rank."""
    arguments = [model.argument for model in models]
    if mount is None:
        return Step(
            DOWNLOAD_STEP, ("env", f"HF_HOME={hub}", cluster.python, "-c", DOWNLOAD_SCRIPT, *arguments), "prepare",
            secrets=recipe.secret_keys, progress=True,
        )
    argv = ["docker", "run", "--rm"]
    # The gang's labels: an `up` stopped mid-download leaves a container that `down` (or the
    # next `up`) finds and stops with the ranks'.
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    argv += ["--network", "host", "-e", f"HF_HOME={mount.container}"]
    for key, value in recipe.env.items():
        argv += ["-e", key if key in recipe.secret_keys else f"{key}={value}"]
    # A helper, not a rank: it replaces the image's entrypoint whatever the recipe says, since
    # that entrypoint may be a server (vllm/vllm-openai's `vllm serve`, llama.cpp's binaries)
    # that would take `python3 -c ...` as its own arguments. It runs no GPU work (no --gpus),
    # so the NGC wrapper's CUDA setup that ranks keep is not needed here; the seed's own
    # download recipe runs the same way (`docker run --rm --entrypoint python3 ...`).
    argv += ["-v", f"{hub}:{mount.container}", "--entrypoint", "python3", recipe.docker_image or ""]
    argv += ["-c", DOWNLOAD_SCRIPT, *arguments]
    return Step(DOWNLOAD_STEP, tuple(argv), "prepare", secrets=recipe.secret_keys, progress=True)


def _download_here(recipe: Recipe, cluster: Cluster, models: Sequence[HubModel]) -> Step:
    """Fetch the models into this machine's download_dir, with swaplab's own Python (its
    `launch` extra brings huggingface_hub) and the recipe's [env] (HF_HUB_OFFLINE, HF_ENDPOINT...),
    as the head's download would have them; the secrets reach it through its environment only."""
    settings = [f"{key}={value}" for key, value in recipe.env.items() if key not in recipe.secret_keys]
    argv = ("env", *settings, f"HF_HOME={cluster.download_dir}", sys.executable, "-c", DOWNLOAD_SCRIPT,
            *(model.argument for model in models))
    return Step(DOWNLOAD_STEP, argv, "local", secrets=recipe.secret_keys, progress=True)


def _copy_steps(model: HubModel, source: str, target: str, *, kind: str, ssh: str, after_head: str | None = None) -> list[Step]:
    """A hub repo from `source` to `target` (either may be HOST:PATH): first the blobs, named by
    their content's hash, so one already there is never sent again; then the snapshots' links and
    the refs, which point at them (a ref is rewritten when it moved)."""
    blobs = Step(
        f"copy {model.repo}", (*RSYNC, "--ignore-existing", "--exclude=*.incomplete", "-e", ssh,
                               f"{source}/blobs/", f"{target}/blobs/"),
        kind, after_head=after_head, progress=True,
    )
    links = Step(
        f"copy {model.repo} refs", (*RSYNC, "-e", ssh, f"{source}/snapshots", f"{source}/refs", f"{target}/"), kind,
        progress=True,
    )
    return [blobs, links]


def _remote_path(address: str, path: str) -> str:
    """`ADDRESS:PATH` for rsync; a path under ~/ is written relative, which rsync reads from the remote home."""
    if path == "~":
        path = "."
    elif path.startswith("~/"):
        path = path[2:]
    return f"[{address}]:{path}" if ":" in address else f"{address}:{path}"


def _rsync_ssh(cluster: Cluster, host: Host) -> str:
    """rsync's `-e` command that reaches `host` (see fabric_ssh)."""
    return shlex.join(fabric_ssh(cluster, host))


def fabric_ssh(cluster: Cluster, host: Host) -> list[str]:
    """The ssh command (less its destination) that reaches `host` as every other command of `up`
    does: the cluster's ssh options, the host's port and the cluster's user. A worker copying
    from the head runs it towards the head's fabric address, so the head must accept the
    worker's key there."""
    argv = ["ssh"]
    for option in cluster.ssh_options:
        argv += ["-o", option]
    argv += ["-o", "BatchMode=yes"]
    if host.ssh_port is not None:
        argv += ["-p", str(host.ssh_port)]
    if cluster.user:
        argv += ["-l", cluster.user]
    return argv


def own_hub_mount(recipe: Recipe) -> Mount | None:
    """The recipe's own mount of HF_HOME, if it has one."""
    return next((mount for mount in recipe.extra_mounts if mount.env == "HF_HOME"), None)


def hub_of(recipe: Recipe, cluster: Cluster, host: Host) -> str:
    """Where downloads land on `host` (an HF_HOME on the host): the recipe's own HF_HOME mount,
    else the node's cache in the clusters file."""
    own = own_hub_mount(recipe)
    return own.host if own else cluster.hub_of(host)


def hub_folder(root: str, repo: str) -> str:
    """Where a Hugging Face cache rooted at `root` (an HF_HOME) keeps `repo`."""
    return f"{root}/hub/models--{repo.replace('/', '--')}"


def _mirror_steps(models: Sequence[HubModel], source_root: str, mirror_root: str) -> list[Step]:
    steps = []
    for model in models:
        source, mirror = hub_folder(source_root, model.repo), hub_folder(mirror_root, model.repo)
        steps.append(Step(f"mirror {model.repo}", ("rsync", "--archive", "--delete", "--mkpath", f"{source}/", f"{mirror}/"), "prepare"))
        steps.append(Step(f"verify {model.repo}", ("python3", "-c", VERIFY_SCRIPT, source, mirror), "prepare"))
    return steps


def _drop_caches_steps() -> list[Step]:
    # The seed's lesson: weights streamed into a full page cache OOM a unified-memory box.
    return [
        Step("sync", ("sync",), "prepare"),
        Step("drop-caches", ("sudo", "-n", "sysctl", "-w", "vm.drop_caches=3"), "prepare"),
    ]


def expand_home(argv: Sequence[str], home: str) -> tuple[str, ...]:
    """`argv` with a leading `~` or `~/` of each word replaced by `home` (a node's $HOME),
    as a shell would do at the start of a word: what `up` does before quoting for ssh."""
    home = home.rstrip("/")
    return tuple(
        home + word[1:] if word == "~" or word.startswith("~/") else word
        for word in argv
    )


def plan_json(plan: Plan) -> dict[str, Any]:
    """`{"nodes": [{"host", "rank", "steps": [{"name", "argv"}]}]}`: what `plan --json` prints."""
    return {
        "nodes": [
            {
                "host": node.host.name,
                "rank": node.rank,
                "steps": [{"name": step.name, "argv": list(step.argv)} for step in node.steps],
            }
            for node in plan.nodes
        ]
    }


def plan_text(plan: Plan) -> str:
    """The plan for a reader: per node, each step and its exact command, shell-quoted."""
    recipe = plan.recipe
    backend = f" ({recipe.distributed_backend})" if recipe.engine == "vllm" else ""
    lines = [
        f"recipe   {recipe.path}",
        (f"engine   {recipe.engine}{backend}, {len(plan.nodes)} node(s), TP {recipe.tensor_parallel_size}, "
        f"PP {recipe.pipeline_parallel_size}" + (f", DP {recipe.data_parallel_size}" if recipe.data_parallel_size > 1 else "")),
        f"cluster  {plan.cluster.name}",
        f"run      {plan.run_id}",
        f"serves   {plan.head_url}",
        "start    " + ", ".join(f"{name} (rank {rank})" for rank, name in plan.start_order),
    ]
    if any(word.startswith("~") for node in plan.nodes for step in node.steps for word in step.argv):
        lines.append("note     a word starting with ~/ is each node's home, filled in by `up` on that node")
    for node in plan.nodes:
        role = "head" if node.rank == 0 else "worker"
        lines += ["", f"rank {node.rank} ({role}) on {node.host.name}, fabric {node.host.fabric_ip}"]
        for number, step in enumerate(node.steps, 1):
            lines.append(f"  {number}. {step.name} [{step.kind}]{_step_note(step, node.host, plan.cluster, recipe)}")
            lines.append(_indent(format_argv(step.argv), "       "))
        if recipe.engine == "process":
            lines.append("     env:")
            lines += [f"       {key}={value}" for key, value in node.env.items()]
    return "\n".join(lines) + "\n"


def _step_note(step: Step, host: Host, cluster: Cluster, recipe: Recipe) -> str:
    notes = []
    if step.secrets:
        # The reference, never the value: `plan` reads no environment.
        filled = ", ".join(f"{key}={recipe.env[key]}" for key in step.secrets)
        notes.append(f"environment from yours at `up`, through ssh's stdin (no argv): {filled}")
    if step.kind == "local":
        notes.append("on this machine")
    if step.kind == "send":
        notes.append(f"on this machine, into {host.name}")
    if step.after_head:
        notes.append(f"once the head's {step.after_head} is done")
    if step.progress:
        notes.append("progress shown every few seconds")
    if step.stdin_from and not step.image:
        notes.append(f"input: {shlex.join(step.stdin_from)} (here) | ssh {host.name}")
    if step.skip_if:
        notes.append(f"skipped when `{shlex.join(step.skip_if)}` succeeds")
    if step.skip_if_same:
        notes.append(f"skipped when `{shlex.join(step.skip_if_same)}` prints the same here and there")
    if step.image and step.stdin_from:
        notes.append(f"built here: docker save {step.image} (here) | ssh {host.name} docker load, unless the ids match")
    elif step.image:
        notes.append(f"when this machine has {step.image}: docker save (here) | ssh {host.name} docker load, unless the ids match")
        if host != cluster.head:
            notes.append("else, once the head has it, from the head over the fabric unless the ids match:")
            notes.append(f"  {shlex.join(image_from_head(cluster, step.image))}")
        notes.append("else pulled, unless the node has it")
    if step.wait_for_port:
        notes.append(f"next starts once {host.fabric_ip}:{step.wait_for_port} accepts")
    return "".join(f"\n       # {note}" for note in notes)


def format_argv(argv: Sequence[str], width: int = 100) -> str:
    """`argv` shell-quoted; a long one broken before each option, with `\\` continuations."""
    single = shlex.join(argv)
    if len(single) <= width:
        return single
    groups: list[list[str]] = []
    for word in argv:
        is_option = word.startswith("-") and len(word) > 1
        after_lone_option = bool(groups) and len(groups[-1]) == 1 and groups[-1][0].startswith("-")
        in_command = len(groups) == 1 and not groups[0][0].startswith("-")
        if groups and not is_option and (after_lone_option or in_command):
            groups[-1].append(shlex.quote(word))
        else:
            groups.append([shlex.quote(word)])
    return " \\\n  ".join(" ".join(group) for group in groups)


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())

