"""What a launch is made of, as plain data: a recipe (with its mounts and readiness) and a step.

A leaf: the recipe reader, the engines, the plan and the gang's lifecycle all share these
types, and this module imports none of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from swaplab.errors import SwaplabError

STEP_KINDS = ("local", "prepare", "send", "rank", "check")
HUB_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A Hugging Face repo id, ORG/NAME."""
HUB_REVISION = re.compile(r"^[\w./-]+$")
"""A branch, tag or commit of a hub repo, as `--revision` takes it."""
DRAFT_CONFIG_FLAGS = ("--speculative-config", "--speculative_config")
"""vLLM's speculative decoding settings, a JSON object whose `model` (and `revision`) name the drafter."""
DRAFT_PATH_FLAGS = ("--speculative-draft-model-path", "--speculative-draft")
DRAFT_REVISION_FLAGS = ("--speculative-draft-model-revision",)
"""SGLang's drafter, by flag."""
ENV_REFERENCE = re.compile(r"\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}")
"""`${env.NAME}` in an [env] value: the launching user's NAME, read by `up` (never by `plan`)."""


class MissingVariable(SwaplabError):
    """An [env] value reads a variable the launching user's environment does not have."""


@dataclass(frozen=True)
class HubModel:
    """A Hugging Face repo the gang reads, at a revision (None: the repo's default branch)."""

    repo: str
    revision: str | None = None

    @property
    def argument(self) -> str:
        """`REPO` or `REPO@REVISION`: how the download step is given it (a repo id has no `@`)."""
        return f"{self.repo}@{self.revision}" if self.revision else self.repo

    @classmethod
    def parse(cls, text: str) -> HubModel:
        repo, _, revision = text.partition("@")
        return cls(repo, revision or None)


def flag_values(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """The values of a flag in `args`, `--flag value` and `--flag=value` alike, in order."""
    values = []
    for index, argument in enumerate(args):
        for name in names:
            if argument == name and index + 1 < len(args):
                values.append(args[index + 1])
            elif argument.startswith(name + "="):
                values.append(argument[len(name) + 1 :])
    return values


def drafters(args: Sequence[str]) -> tuple[HubModel, ...]:
    """The hub repos named as drafters inside `args`: vLLM's `--speculative-config` JSON
    (`model`, `revision`) and SGLang's `--speculative-draft-model-path` (and its revision flag).
    Paths and anything that is not ORG/NAME are read where they are, not fetched."""
    found = []
    for text in flag_values(args, DRAFT_CONFIG_FLAGS):
        try:
            config = json.loads(text)
        except ValueError:
            continue
        if isinstance(config, dict) and isinstance(config.get("model"), str) and HUB_REPO.match(config["model"]):
            revision = config.get("revision")
            found.append(HubModel(config["model"], revision if isinstance(revision, str) and revision else None))
    revisions = flag_values(args, DRAFT_REVISION_FLAGS)
    for path in flag_values(args, DRAFT_PATH_FLAGS):
        if HUB_REPO.match(path):
            found.append(HubModel(path, revisions[0] if revisions else None))
    return tuple(found)


@dataclass(frozen=True)
class EnvReference:
    """A `${env.NAME}` in the recipe's [env]: which key holds it, and at which line."""

    key: str
    variable: str
    line: int


@dataclass(frozen=True)
class Mount:
    """A `-v host:container` mount; `env` names a variable set to the container path."""

    host: str
    """May start with `~/`: expanded on each node to that node's home."""
    container: str
    env: str | None = None


@dataclass(frozen=True)
class ContainerOptions:
    """A `[container]` table (a recipe's or a cluster's): extra `docker run` options of every rank."""

    devices: tuple[str, ...] = ()
    """Host device paths (`--device`)."""
    ulimits: tuple[tuple[str, str], ...] = ()
    """(name, "soft:hard") pairs (`--ulimit name=soft:hard`)."""
    cap_add: tuple[str, ...] = ()
    user: str | None = None
    privileged: bool | None = None
    """None: not said (a cluster's setting, else off)."""
    read_only_mounts: tuple[tuple[str, str], ...] = ()
    """(host, container) pairs (`-v host:container:ro`)."""

    def overlaid(self, other: ContainerOptions) -> ContainerOptions:
        """These options with `other`'s added on top: lists joined without repeats, and `other`'s
        ulimit, user, privileged and mount at a container path winning (the recipe over the cluster)."""
        by_container = {container: host for host, container in self.read_only_mounts}
        by_container.update({container: host for host, container in other.read_only_mounts})
        return ContainerOptions(
            devices=tuple(dict.fromkeys(self.devices + other.devices)),
            ulimits=tuple({**dict(self.ulimits), **dict(other.ulimits)}.items()),
            cap_add=tuple(dict.fromkeys(self.cap_add + other.cap_add)),
            user=other.user if other.user is not None else self.user,
            privileged=other.privileged if other.privileged is not None else self.privileged,
            read_only_mounts=tuple((host, container) for container, host in by_container.items()),
        )


@dataclass(frozen=True)
class FileCopy:
    """A `copy = [{from, to}]` entry of a `[[pre_serve]]` hook: a file of the launching machine put in place before the hooks run."""

    source: Path
    """On the launching machine (the recipe's `from`, relative to the recipe's folder)."""
    target: str
    """In the container (absolute); for engine "process", on the node (relative: to where the rank runs)."""


@dataclass(frozen=True)
class PreServeHook:
    """A `[[pre_serve]]` entry: files to copy in, and a command run before the server, in the rank's place."""

    number: int
    """1, 2, ... in recipe order: the `[pre_serve N]` prefix of its output."""
    line: int
    """The recipe line of its `[[pre_serve]]`."""
    run: tuple[str, ...] = ()
    """The command's argv; for a shell line, ("sh", "-c", LINE). Empty: only copies."""
    copies: tuple[FileCopy, ...] = ()


@dataclass(frozen=True)
class Readiness:
    """How the head shows it serves: log regexes and an HTTP path, engine defaults plus the recipe's."""

    path: str | None
    ready: tuple[str, ...]
    fatal: tuple[str, ...]
    timeout: float
    """Seconds from the last rank's start to ready."""


@dataclass(frozen=True)
class Recipe:
    """A validated recipe (swaplab.launch.recipe reads one); `args` are exactly the arguments the engine receives."""

    path: Path
    engine: str
    name: str
    model: str | None
    docker_image: str | None
    docker_image_dir: Path | None
    required_nodes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    gpus_per_node: int
    """The GPUs each node gives the gang (the clusters file has no GPU count; 1 unless the recipe
    says): the engine's parallel sizes must multiply to required_nodes x this."""
    distributed_backend: str
    shm_size: str | None
    entrypoint: tuple[str, ...]
    replace_image_entrypoint: bool
    """Run the server command as the container's entrypoint (`--entrypoint FIRST IMAGE REST...`)
    instead of after the image, where the image's own entrypoint (NGC's wrapper) runs it."""
    args: tuple[str, ...]
    port: int
    env: Mapping[str, str]
    extra_mounts: tuple[Mount, ...]
    readiness: Readiness
    drop_caches: bool = True
    """Drop the page cache on every node before the ranks start (default: on for container engines)."""
    extra_models: tuple[str, ...] = ()
    """Other hub repos the engine reads, `ORG/NAME` or `ORG/NAME@REVISION`: fetched and copied
    like `model` (drafters named in `args` are found without being listed here)."""
    rendezvous_port: int | None = None
    """Where ranks meet (vLLM --master-port, SGLang --dist-init-addr, Ray GCS, llama.cpp RPC); None: the engine's default."""
    env_references: tuple[EnvReference, ...] = ()
    """Every `${env.NAME}` of [env], in file order: those keys are secrets, filled in by `up`."""
    container: ContainerOptions = field(default_factory=ContainerOptions)
    """The recipe's `[container]`: added to, and over, the cluster's."""
    pre_serve: tuple[PreServeHook, ...] = ()
    """`[[pre_serve]]` hooks: their copies, then their commands, in each rank's place before the server."""
    content_hash: str = field(default="", repr=False)

    @property
    def slug(self) -> str:
        """A short name for labels, container names and state folders: the recipe's folder
        name for `.../NAME/recipe.toml`, else the file's stem."""
        stem = self.path.parent.name if self.path.name == "recipe.toml" else self.path.stem
        return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-") or "recipe"

    def digest(self) -> str:
        """The recipe's hash (of its values, so comments do not change it), carried in labels."""
        return self.content_hash

    @property
    def secret_keys(self) -> tuple[str, ...]:
        """The [env] keys whose value reads the launching user's environment (`${env.NAME}`), in [env] order."""
        return tuple(dict.fromkeys(reference.key for reference in self.env_references))

    def resolve_secrets(self, environ: Mapping[str, str]) -> dict[str, str]:
        """Each secret key's value, its `${env.NAME}` read from `environ`; MissingVariable
        naming every variable that is not set, at its FILE:LINE."""
        missing = [reference for reference in self.env_references if reference.variable not in environ]
        if missing:
            raise MissingVariable("\n".join(
                f"{self.path}:{reference.line}: [env] {reference.key} reads ${{env.{reference.variable}}}, but "
                f"{reference.variable} is not set in this environment: export it before `swaplab launch up`"
                for reference in missing
            ))
        return {
            key: ENV_REFERENCE.sub(lambda match: environ[match.group(1)], self.env[key])
            for key in self.secret_keys
        }

    @property
    def hub_models(self) -> tuple[HubModel, ...]:
        """The Hugging Face repos the engine loads, each once at its pinned revision: `model`
        (when it names one; `--revision` in args pins it), the drafters named in `args`, and
        `extra_models`."""
        models: list[HubModel] = []
        if self.model and HUB_REPO.match(self.model):
            revisions = flag_values(self.args, ("--revision",))
            models.append(HubModel(self.model, revisions[0] if revisions else None))
        models += drafters(self.args)
        models += (HubModel.parse(text) for text in self.extra_models)
        first: dict[str, HubModel] = {}
        for model in models:
            first.setdefault(model.repo, model)
        return tuple(first.values())

    @property
    def offline(self) -> bool:
        """`HF_HUB_OFFLINE` set the way huggingface_hub reads it: no download step then."""
        return self.env.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class Step:
    """One command on one node (or, for kind "local", on the launching machine)."""

    name: str
    argv: tuple[str, ...]
    kind: str
    """"local" (on the launching machine, once, before any node's steps), "prepare" (on the
    node, must exit 0 before the ranks), "send" (on the launching machine, in the node's turn:
    a copy into the node), "rank" (a long-running rank process) or "check" (a probe, informational)."""
    stdin_from: tuple[str, ...] = ()
    """A local argv whose output is this step's input (`docker save IMAGE | ssh node docker load`)."""
    skip_if: tuple[str, ...] = ()
    """An argv run on the node first: exit 0 means the step's work is already done."""
    skip_if_same: tuple[str, ...] = ()
    """An argv run locally and on the node: the same non-empty output means the step is done
    (the node already has the image with the local image's id)."""
    wait_for_port: int | None = None
    """For a rank step: the next rank step in start order waits until the node's fabric_ip
    accepts connections on this port (Ray's GCS, a llama.cpp rpc-server)."""
    secrets: tuple[str, ...] = ()
    """Variables whose values `up` puts into this step's environment without any argv (over
    ssh's stdin): the recipe's `${env.NAME}` keys. The argv names them at most (`-e NAME`)."""
    after_head: str | None = None
    """The name of a head (rank 0) step this one waits for: a worker copies the models from the
    head once the head has them."""
    image: str | None = None
    """For the step that brings the recipe's image to a node: the image. `up` copies it from this
    machine when it has it (`docker save | ssh NODE docker load`), else a worker copies it from
    the head over the fabric, else the node runs the argv (`docker pull`); in each case only
    where the node's image id differs. With `stdin_from` (an image built here), only from here."""
    progress: bool = False
    """The step prints progress lines ending in a carriage return (rsync's `--info=progress2`):
    `up` shows them at most every few seconds, and always the last."""
