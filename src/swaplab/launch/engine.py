"""What an engine is: the `Engine` protocol, the `Gang` it writes its ranks' commands for, and
the flags it passes recipe keys through.

Each module of swaplab.launch.engines implements `Engine` for one inference server; the
registry there finds them. This module knows no engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from swaplab.launch.cluster import Cluster, Host
from swaplab.launch.hooks import CONTAINER_STAGING, copies_of, staged_path, wrapped
from swaplab.launch.spec import ContainerOptions, Mount, Readiness, Recipe, Step

Fault = tuple[tuple[str | int, ...], str]
"""A fault of a recipe: the key path it is at, and the message."""

COMMON_FATAL = (
    r"OutOfMemoryError",
    r"CUDA out of memory",
    r"NCCL error",
    r"ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError",
)
"""Failures every GPU engine can print: fatal on any rank."""

RDMA_OPTIONS = ContainerOptions(devices=("/dev/infiniband",), ulimits=(("memlock", "-1:-1"),), cap_add=("IPC_LOCK",))
"""What a rank's container needs to open the HCAs and pin memory for them, on an RDMA fabric."""


@dataclass(frozen=True)
class LauncherFlag:
    """A flag that carries a recipe key to the engine (`--port 30000` from `port`)."""

    names: tuple[str, ...]
    """Its spellings; the first is the one emitted."""
    value: str
    recipe_key: str | None
    """The recipe key it comes from, named in the fault when `args` disagree; None for a
    launcher default that `args` may override (`--host 0.0.0.0`)."""
    engine_default: str | None = None
    """The value the engine assumes when the flag is absent: then it is not emitted (so
    older servers without the flag still start)."""

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.names[0], self.value)


class Engine(Protocol):
    """What one inference server needs to run as a gang."""

    name: str
    """The recipe's `engine` value; also the name of the engine's module."""
    order: int
    """Where the engine comes when engines are listed for people (lowest first)."""
    uses_docker: bool
    """Whether its ranks run in containers (all but `process`)."""
    default_entrypoint: tuple[str, ...]
    """The server command when the recipe gives no `entrypoint`."""
    replaces_image_entrypoint: bool
    """The default of the recipe's `replace_image_entrypoint`: whether the usual images of this
    engine need the server command as their entrypoint (their own is a server binary that
    would take the command as its arguments) rather than after the image."""
    model_is_hub_repo: bool
    """Whether `model` names a Hugging Face repo (downloaded and mirrored)."""
    readiness: Readiness
    """The defaults the recipe's `[readiness]` adds to."""
    reserved_flags: tuple[str, ...]
    """Flags the launcher sets per rank, which `args` must not carry."""

    def recipe_flags(self, recipe: Recipe) -> tuple[LauncherFlag, ...]:
        """Flags that carry recipe keys (port, TP size...), added unless `args` already carry
        them with the same value."""
        ...

    def check(self, recipe: Recipe) -> list[Fault]:
        """Engine-specific faults of the recipe."""
        ...

    def gpu_factors(self, recipe: Recipe) -> tuple[tuple[str, int], ...]:
        """The recipe keys, with their values, whose product is the GPUs the ranks hold (TP x PP
        x DP); empty when the engine does not size its ranks by them (no layout check then)."""
        ...

    def node_env(self, gang: Gang, rank: int) -> dict[str, str]:
        """Engine variables for one rank."""
        ...

    def rank_steps(self, gang: Gang) -> list[tuple[int, Step]]:
        """Each rank's long-running steps, as (rank, step) in start order."""
        ...


@dataclass(frozen=True)
class Gang:
    """What an engine needs to write its ranks' commands: the recipe, the nodes, the run."""

    recipe: Recipe
    cluster: Cluster
    hosts: tuple[Host, ...]
    """The nodes in rank order, head first."""
    run_id: str
    labels: Mapping[str, str]
    mounts: tuple[Mount, ...]
    """The container mounts, the hub's among them (host side may start with ~/)."""
    base_env: Mapping[str, str]
    """Mount variables, the recipe's [env] and the cluster's [nccl.NAME], in that order (each
    rank adds its host's [hosts.NAME.nccl] over them)."""
    engine: Engine
    hub_mount: Mount | None = None
    """The mount among `mounts` that is the node's Hugging Face cache (HF_HOME)."""
    hub_dirs: tuple[str, ...] = ()
    """Each rank's Hugging Face cache on its node (its own, or its node-local mirror): the host
    side of `hub_mount` for containers, HF_HOME itself for engine "process"; empty: none."""

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def ranks(self) -> range:
        return range(len(self.hosts))

    @property
    def server_command(self) -> tuple[str, ...]:
        """The recipe's `entrypoint` words, or the engine's default server command."""
        return self.recipe.entrypoint or self.engine.default_entrypoint

    def container_name(self, rank: int) -> str:
        return f"swaplab-{self.run_id}-rank{rank}"

    def env(self, rank: int) -> dict[str, str]:
        """Everything rank `rank` gets in its environment, the launcher's variables last."""
        env = dict(self.base_env)
        if self.hub_dirs and not self.engine.uses_docker:
            env.setdefault("HF_HOME", self.hub_dirs[rank])
        env.update(self.cluster.host_nccl.get(self.hosts[rank].name, {}))
        env.update(self.engine.node_env(self, rank))
        env.update(
            SWAPLAB_RUN=self.run_id,
            SWAPLAB_RANK=str(rank),
            SWAPLAB_NNODES=str(len(self.hosts)),
            SWAPLAB_HEAD=self.head.fabric_ip,
        )
        return env

    @property
    def container_options(self) -> ContainerOptions:
        """The ranks' extra `docker run` options: on an RDMA fabric the HCAs, unlimited memlock and
        IPC_LOCK (or, privileged, everything), then the cluster's `[container]`, then the recipe's."""
        said = self.cluster.container.overlaid(self.recipe.container)
        if not self.cluster.uses_rdma:
            return said
        # Privileged sees every device and holds every capability: only the limit is still needed.
        needed = ContainerOptions(ulimits=RDMA_OPTIONS.ulimits) if said.privileged else RDMA_OPTIONS
        return needed.overlaid(said)

    def docker_run(self, rank: int, command: Sequence[str]) -> tuple[str, ...]:
        """The `docker run` of rank `rank` running `command` in the recipe's image.

        The command follows the image, so the image's own entrypoint runs it: NGC's wrapper
        (/opt/nvidia/nvidia_entrypoint.sh) sets up CUDA forward compatibility and the rest of
        its entrypoint.d before it execs the command, and it execs the first word as a file,
        which is why the command names its program (`vllm serve`, not just the model). With
        `replace_image_entrypoint`, the command's first word replaces the image's entrypoint
        (`--entrypoint` takes one word) and the rest follow the image: for images whose
        entrypoint is a server itself (vllm/vllm-openai's `vllm serve`, llama.cpp's).

        With `[[pre_serve]]` hooks the command becomes the hooks' `sh -c` wrapper (swaplab.launch.hooks),
        which ends in `exec COMMAND`: the image's entrypoint still runs first (or, replaced, `sh`
        is the entrypoint), and each staged copy is mounted read-only under /swaplab/pre-serve.
        """
        recipe = self.recipe
        argv = ["docker", "run", "--rm", "--name", self.container_name(rank)]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        argv += ["--label", f"swaplab.rank={rank}"]
        argv += ["--gpus", "all", "--network", "host", "--ipc", "host"]
        if recipe.shm_size:
            argv += ["--shm-size", recipe.shm_size]
        options = self.container_options
        argv += container_flags(options)
        for key, value in self.env(rank).items():
            # A secret's value never enters an argv: `-e NAME` copies it from the docker
            # client's environment, where `up` puts it (see Step.secrets).
            argv += ["-e", key if key in recipe.secret_keys else f"{key}={value}"]
        for mount in self.mounts:
            host = self.hub_dirs[rank] if mount is self.hub_mount and self.hub_dirs else mount.host
            argv += ["-v", f"{host}:{mount.container}"]
        for host, container in options.read_only_mounts:
            argv += ["-v", f"{host}:{container}:ro"]
        for index, _, _ in copies_of(recipe):
            argv += ["-v", f"{staged_path(recipe, self.run_id, index)}:{CONTAINER_STAGING}/{index}:ro"]
        command = wrapped(recipe, command, source=lambda index: f"{CONTAINER_STAGING}/{index}")
        image = recipe.docker_image or ""
        if recipe.replace_image_entrypoint:
            argv += ["--entrypoint", command[0], image, *command[1:]]
        else:
            argv += [image, *command]
        return tuple(argv)


def container_flags(options: ContainerOptions) -> tuple[str, ...]:
    """The `docker run` flags of `options`, but its read-only mounts (they go with the other `-v`)."""
    argv: list[str] = []
    if options.privileged:
        argv.append("--privileged")
    for device in options.devices:
        argv += ["--device", device]
    for name, limits in options.ulimits:
        argv += ["--ulimit", f"{name}={limits}"]
    for capability in options.cap_add:
        argv += ["--cap-add", capability]
    if options.user is not None:
        argv += ["--user", options.user]
    return tuple(argv)


def find_flag(args: Sequence[str], names: Sequence[str]) -> list[tuple[int, str | None]]:
    """Each occurrence of a flag in `args` as (index, value); `--flag=value` and `--flag value`
    both count, and a flag followed by another flag (or nothing) has value None."""
    found: list[tuple[int, str | None]] = []
    for index, argument in enumerate(args):
        for name in names:
            if argument == name:
                following = args[index + 1] if index + 1 < len(args) else None
                found.append((index, None if following is None or following.startswith("-") else following))
            elif argument.startswith(name + "="):
                found.append((index, argument[len(name) + 1 :]))
    return found


def argument_faults(recipe: Recipe, engine: Engine) -> list[Fault]:
    """Faults of `args` against what the launcher sets itself: a reserved flag at all, or a
    recipe-key flag with another value than the key."""
    faults: list[Fault] = []
    for name in engine.reserved_flags:
        for index, _ in find_flag(recipe.args, (name,)):
            faults.append((("args", index), f"remove {name} from args: the launcher sets it for each rank"))
    for flag in engine.recipe_flags(recipe):
        if flag.recipe_key is None:
            continue
        for index, value in find_flag(recipe.args, flag.names):
            if value == flag.value:
                continue
            # As written, less any `=value`: `--tensor-parallel-size=4` is the flag `--tensor-parallel-size`.
            written = recipe.args[index].partition("=")[0]
            key = flag.recipe_key
            if value is None:
                message = f"args give {written} without a value; the launcher passes {key} ({_toml(flag.value)}): drop the flag"
            else:
                message = (
                    f"args set {written} to {value}, but {key} is {_toml(flag.value)} and the launcher passes that: "
                    f"set {key} = {_toml(value)} and drop the flag"
                )
            faults.append((("args", index), message))
    return faults


def _toml(value: str) -> str:
    """A flag's value as its recipe key would be written: numbers bare, words quoted."""
    return value if value.isdigit() else json.dumps(value)


def layout_fault(recipe: Recipe, factors: Sequence[tuple[str, int]]) -> str | None:
    """Why the engine's parallel sizes (`factors`, as `Engine.gpu_factors` gives them) do not
    fill the gang's GPUs exactly, required_nodes x gpus_per_node; None when they do (or when
    the engine has no such sizes)."""
    if not factors:
        return None
    needed = 1
    for _, size in factors:
        needed *= size
    nodes, per_node = recipe.required_nodes, recipe.gpus_per_node
    present = nodes * per_node
    if needed == present:
        return None
    sizes = " x ".join(f"{key} {size}" for key, size in factors)
    message = (
        f"{sizes} = {needed} GPU{'s' if needed != 1 else ''}, but {nodes} node{'s' if nodes != 1 else ''} x "
        f"{per_node} GPU{'s' if per_node != 1 else ''} each = {present}: every GPU of the gang runs one rank, "
        f"so make the sizes' product {present}"
    )
    if needed % per_node == 0:
        message += f" or set required_nodes = {needed // per_node}"
    if per_node == 1:
        message += " (a node counts as 1 GPU; set gpus_per_node for nodes with more)"
    return message


def missing_flags(args: Sequence[str], flags: Sequence[LauncherFlag]) -> tuple[str, ...]:
    """The argv of each flag that `args` do not already carry (the seed's own
    `--distributed-executor-backend mp` is not emitted twice)."""
    added: list[str] = []
    for flag in flags:
        if not find_flag(args, flag.names) and flag.value != flag.engine_default:
            added.extend(flag.argv)
    return tuple(added)
