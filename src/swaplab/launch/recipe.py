"""Reading a recipe (`recipe.toml`): one model served by one engine across a number of nodes.

The schema is the seed's (the user's own launcher), plus a few optional keys:
`data_parallel_size`, `gpus_per_node`, `drop_caches`, `extra_models`, `rendezvous_port`,
`replace_image_entrypoint`, `[readiness]`, `[container]` (extra `docker run` options, the
same table a cluster may have) and `[[pre_serve]]` hooks (swaplab.launch.hooks runs them). Every fault of a file is reported in one
pass, each at the `FILE:LINE` of its key; among them, parallel sizes that do not fill the
gang's GPUs exactly (TP x PP x DP against required_nodes x gpus_per_node). The `Recipe` it
makes is swaplab.launch.spec's.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from swaplab.config.reader import (
    KeyPath,
    as_boolean,
    as_number,
    as_port,
    as_positive_integer,
    as_string,
    as_strings,
    describe,
    one_of,
)
from swaplab.launch.cluster import (
    ENV_NAME,
    as_word,
    read_container_table,
    read_env_table,
)
from swaplab.launch.engine import Engine, argument_faults, layout_fault
from swaplab.launch.engines import engine_names, get_engine
from swaplab.launch.spec import (
    ENV_REFERENCE,
    HUB_REPO,
    HUB_REVISION,
    EnvReference,
    FileCopy,
    Mount,
    PreServeHook,
    Readiness,
    Recipe,
)
from swaplab.launch.tomlfile import Checker, TomlDocument, read_toml

SHELL_REFERENCE = re.compile(r"\$\{(?!env\.)([A-Za-z_][A-Za-z0-9_]*)\}")
"""`${NAME}` as a shell writes it: in a recipe's [env] a mistake for `${env.NAME}`."""

IMAGE_REFERENCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
"""What docker's references are made of (name, :tag, @digest): nothing a shell would read."""
DEFAULT_PORT = 30000
RECIPE_KEYS = (
    "engine", "name", "docker_image", "docker_image_dir", "model", "extra_models", "required_nodes",
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "gpus_per_node",
    "distributed_backend", "shm_size", "entrypoint", "replace_image_entrypoint", "args", "port",
    "rendezvous_port", "drop_caches", "env", "extra_mounts", "readiness", "container", "pre_serve",
)
PRE_SERVE_KEYS = ("run", "copy")
COPY_KEYS = ("from", "to")
MOUNT_KEYS = ("host", "container", "env")
READINESS_KEYS = ("path", "ready", "fatal", "timeout")
DISTRIBUTED_BACKENDS = ("mp", "ray")
NO_READINESS = Readiness(path=None, ready=(), fatal=(), timeout=600.0)
"""The readiness defaults of a recipe whose engine is unknown (its faults are reported anyway)."""
LAYOUT_KEYS = {
    "tensor_parallel_size": "a whole number",
    "pipeline_parallel_size": "a whole number",
    "data_parallel_size": "a whole number",
    "required_nodes": "a whole number of nodes",
    "gpus_per_node": "a whole number of GPUs",
}
"""The keys of the layout check: the parallel sizes, and the nodes and GPUs they must fill."""
CONTAINER_ONLY_KEYS = ("docker_image", "docker_image_dir", "shm_size", "replace_image_entrypoint", "extra_mounts", "container")
"""Keys that mean nothing to `engine = "process"`, which runs `args` directly."""


def load_recipe(path: str | Path) -> Recipe:
    """Load the recipe at `path` (a recipe.toml or its folder); raises ConfigError listing
    every fault, each as `FILE:LINE: message`."""
    location = Path(path).expanduser().absolute()
    if location.is_dir():
        location = location / "recipe.toml"
    document = read_toml(location)
    checker = Checker(document)
    top = checker.table(document.data, (), RECIPE_KEYS)
    engine_name = checker.get(top, (), "engine", one_of(engine_names(), "engine"), f"one of {', '.join(engine_names())}", required=True)
    engine = get_engine(engine_name) if engine_name else None
    uses_docker = engine is not None and engine.uses_docker

    if engine_name == "process":
        for key in CONTAINER_ONLY_KEYS:
            if key in top:
                checker.fault((key,), f"{key} means nothing to engine = \"process\" (it runs args directly, no container); remove it")
    docker_image = checker.get(top, (), "docker_image", _as_image, "an image reference such as \"vllm/vllm-openai:v0.11.0\"", required=uses_docker)
    model = checker.get(top, (), "model", as_word, "a Hugging Face repo id or a path", required=uses_docker)
    image_dir = checker.get(top, (), "docker_image_dir", as_string, "a folder (relative to the recipe's folder)")
    backend = checker.get(top, (), "distributed_backend", one_of(DISTRIBUTED_BACKENDS, "backend"), "\"mp\" or \"ray\"", default="mp")
    env = read_env_table(checker, ("env",), top.get("env", {}))
    for key, value in env.items():
        # `"${HF_TOKEN}"` would reach the server as those very characters: nothing expands it.
        for name in SHELL_REFERENCE.findall(value):
            checker.fault(("env", key), f"[env] {key} holds ${{{name}}}, which reaches the server as that literal "
                                        f"text; write ${{env.{name}}} to pass the launching user's {name} (read by "
                                        "`up`, never shown)")
    mounts = _read_mounts(checker, top.get("extra_mounts", []))
    for index, mount in enumerate(mounts):
        if mount.env and mount.env in env:
            checker.fault(("extra_mounts", index, "env"), f"{mount.env} is set by this mount and by [env] too; keep one")
    args = checker.get(top, (), "args", _as_arguments, "an array of strings", default=())
    hooks = _read_pre_serve(checker, document, location.parent, top.get("pre_serve", []), in_container=uses_docker)
    faults_before = len(checker.findings.faults)
    layout = {key: checker.get(top, (), key, as_positive_integer, expected, default=1) for key, expected in LAYOUT_KEYS.items()}
    layout_readable = len(checker.findings.faults) == faults_before
    if engine_name == "process" and not args:
        checker.fault(("args",) if "args" in top else (), "engine = \"process\" runs args: give the command as args = [\"program\", ...]")

    recipe = Recipe(
        path=location,
        engine=engine_name or "process",
        name=checker.get(top, (), "name", as_string, "a string") or "",
        model=model,
        docker_image=docker_image,
        docker_image_dir=(location.parent / image_dir) if image_dir else None,
        required_nodes=layout["required_nodes"],
        tensor_parallel_size=layout["tensor_parallel_size"],
        pipeline_parallel_size=layout["pipeline_parallel_size"],
        data_parallel_size=layout["data_parallel_size"],
        gpus_per_node=layout["gpus_per_node"],
        distributed_backend=backend,
        shm_size=checker.get(top, (), "shm_size", as_word, "a size such as \"32gb\""),
        entrypoint=checker.get(top, (), "entrypoint", _as_command, "a command as an array of words", default=()),
        replace_image_entrypoint=checker.get(
            top, (), "replace_image_entrypoint", as_boolean, "true or false",
            default=engine is not None and engine.replaces_image_entrypoint,
        ),
        args=args,
        port=checker.get(top, (), "port", as_port, "a port number", default=DEFAULT_PORT),
        env=MappingProxyType(env),
        env_references=tuple(
            EnvReference(key, match.group(1), document.line_of(("env", key)))
            for key, value in env.items() for match in ENV_REFERENCE.finditer(value)
        ),
        extra_mounts=mounts,
        container=read_container_table(checker, ("container",), top.get("container", {})),
        readiness=_read_readiness(checker, top.get("readiness", {}), engine),
        drop_caches=checker.get(top, (), "drop_caches", as_boolean, "true or false", default=uses_docker),
        extra_models=checker.get(
            top, (), "extra_models", _as_hub_repos, "an array of Hugging Face repo ids (ORG/NAME, or ORG/NAME@REVISION)", default=()
        ),
        rendezvous_port=checker.get(top, (), "rendezvous_port", as_port, "a port number"),
        pre_serve=hooks,
        content_hash=_content_hash(document, hooks),
    )
    if not recipe.name:
        recipe = replace(recipe, name=recipe.slug)
    if engine is not None:
        if backend == "ray" and engine_name != "vllm":
            checker.fault(("distributed_backend",), f"distributed_backend = \"ray\" is vLLM's; {engine_name} brings its own")
        for key_path, message in argument_faults(recipe, engine) + engine.check(recipe):
            checker.fault(key_path, message)
        # A size that did not read stands at its default: its own fault says enough.
        factors = engine.gpu_factors(recipe)
        fault = layout_fault(recipe, factors) if layout_readable else None
        if fault is not None:
            # At the first of the multiplied keys the recipe writes, else at the node count.
            keys = [key for key, _ in factors] + ["required_nodes", "gpus_per_node"]
            checker.fault((next((key for key in keys if key in top), "required_nodes"),), fault)
    checker.raise_faults()
    return recipe


def _content_hash(document: TomlDocument, hooks: tuple[PreServeHook, ...]) -> str:
    """The recipe's values (comments do not count) and the content of every file its hooks copy:
    a changed mod is a changed recipe, with its own run id."""
    digest = hashlib.sha256(json.dumps(document.data, sort_keys=True, default=str).encode())
    for hook in hooks:
        for copy in hook.copies:
            digest.update(b"\0" + hashlib.sha256(copy.source.read_bytes()).digest())
    return digest.hexdigest()[:16]


def normalize_argument(text: str) -> str:
    """One recipe argument as the engine must receive it.

    The seed's launcher went through a shell, so its JSON values are wrapped in single
    quotes, often inside a multi-line string: `\"\"\"\\n'{"method":...}'\"\"\"`. When an
    argument, trimmed of surrounding whitespace and of one pair of enclosing single quotes,
    is a JSON object or array, that JSON text is the argument. Anything else is kept as
    written, quotes and spaces included (no shell runs in between).
    """
    trimmed = text.strip()
    if len(trimmed) >= 2 and trimmed[0] == trimmed[-1] == "'":
        trimmed = trimmed[1:-1].strip()
    if trimmed[:1] in ("{", "["):
        try:
            json.loads(trimmed)
        except ValueError:
            return text
        return trimmed
    return text


def _as_arguments(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError()
    arguments = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            arguments.append(normalize_argument(item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            arguments.append(str(item))
        else:
            raise TypeError(f"element {index} is {describe(item)}; write it as a string")
    return tuple(arguments)


def _as_image(value: Any) -> str:
    text = as_word(value)
    if not IMAGE_REFERENCE.match(text):
        raise ValueError("letters, digits and . _ - / : @ only")
    return text


def _as_command(value: Any) -> tuple[str, ...]:
    words = as_strings(value)
    if not words or not all(words):
        raise ValueError("give at least one non-empty word")
    return words


def _as_hub_repos(value: Any) -> tuple[str, ...]:
    repos = as_strings(value)
    for text in repos:
        repo, at, revision = text.partition("@")
        if not HUB_REPO.match(repo):
            raise ValueError(f"{text!r} is not ORG/NAME or ORG/NAME@REVISION")
        if at and not HUB_REVISION.match(revision):
            raise ValueError(f"{text!r} has no revision after its @ (a branch, tag or commit)")
    return repos


def _read_mounts(checker: Checker, value: Any) -> tuple[Mount, ...]:
    mounts = []
    for where, item in checker.array_of_tables(value, "extra_mounts"):
        table = checker.table(item, where, MOUNT_KEYS)
        host = checker.get(table, where, "host", _as_host_path, "an absolute path or one starting with ~/", required=True)
        container = checker.get(table, where, "container", _as_container_path, "an absolute path in the container", required=True)
        env = checker.get(table, where, "env", _as_env_name, "an environment variable name")
        if host and container:
            mounts.append(Mount(host=host, container=container, env=env))
    return tuple(mounts)


def _read_pre_serve(checker: Checker, document: TomlDocument, folder: Path, value: Any, *, in_container: bool) -> tuple[PreServeHook, ...]:
    hooks = []
    for where, item in checker.array_of_tables(value, "pre_serve"):
        table = checker.table(item, where, PRE_SERVE_KEYS)
        run = checker.get(table, where, "run", _as_hook_command, "a shell line (a string) or a command (an array of words)", default=())
        raw_copies = table.get("copy", [])
        copies = []
        if not isinstance(raw_copies, list):
            checker.fault((*where, "copy"), f"copy must be an array of {{from, to}} tables, not {describe(raw_copies)}")
            raw_copies = []
        for position, entry in enumerate(raw_copies):
            at: KeyPath = (*where, "copy", position)
            copy_table = checker.table(entry, at, COPY_KEYS)
            source = checker.get(copy_table, at, "from", as_string, "a file path, relative to the recipe's folder", required=True)
            target = checker.get(
                copy_table, at, "to", _as_container_path if in_container else _as_node_path,
                "an absolute path in the container" if in_container else "a path on the node", required=True,
            )
            path = (folder / Path(source).expanduser()).absolute() if source is not None else None
            if path is not None and not path.is_file():
                checker.fault((*at, "from"), f"{path} is not a file here: copy takes a file of this machine, relative to the recipe's folder")
            elif path is not None and target is not None:
                copies.append(FileCopy(source=path, target=target))
        if isinstance(item, dict) and "run" not in table and "copy" not in table:
            checker.fault(where, "a [[pre_serve]] hook needs run (a shell line or a command) or copy")
        hooks.append(PreServeHook(number=len(hooks) + 1, line=document.line_of(where), run=run, copies=tuple(copies)))
    return tuple(hooks)


def _as_hook_command(value: Any) -> tuple[str, ...]:
    # A shell line is the recipe author's own text, run by `sh -c` in the rank's place.
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("the shell line is empty")
        return ("sh", "-c", value)
    return _as_command(value)


def _as_node_path(value: Any) -> str:
    text = as_string(value)
    if not text:
        raise ValueError("the path is empty")
    return text


def _as_host_path(value: Any) -> str:
    text = as_string(value)
    if not (text.startswith(("/", "~/")) or text == "~"):
        raise ValueError("relative paths would depend on where ssh lands")
    if ":" in text:
        raise ValueError("docker -v cannot take a ':' in a path")
    return text


def _as_container_path(value: Any) -> str:
    text = as_string(value)
    if not text.startswith("/") or ":" in text:
        raise ValueError("an absolute path without ':'")
    return text


def _as_env_name(value: Any) -> str:
    text = as_string(value)
    if not ENV_NAME.match(text):
        raise ValueError("letters, digits and _ only")
    return text


def _as_patterns(value: Any) -> tuple[str, ...]:
    patterns = as_strings(value)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{pattern!r} is not a regular expression ({error})") from None
    return patterns


def _read_readiness(checker: Checker, value: Any, engine: Engine | None) -> Readiness:
    where: KeyPath = ("readiness",)
    table = checker.table(value, where, READINESS_KEYS)
    defaults = engine.readiness if engine is not None else NO_READINESS
    path = checker.get(table, where, "path", _as_http_path, "an HTTP path such as \"/health\"")
    ready = checker.get(table, where, "ready", _as_patterns, "an array of regular expressions", default=())
    fatal = checker.get(table, where, "fatal", _as_patterns, "an array of regular expressions", default=())
    timeout = checker.get(table, where, "timeout", _as_seconds, "a number of seconds above 0")
    return Readiness(
        path=path or defaults.path,
        ready=_union(defaults.ready, ready),
        fatal=_union(defaults.fatal, fatal),
        timeout=timeout or defaults.timeout,
    )


def _as_http_path(value: Any) -> str:
    text = as_string(value)
    if not text.startswith("/"):
        raise ValueError("it starts with /")
    return text


def _as_seconds(value: Any) -> float:
    seconds = as_number(value)
    if seconds <= 0:
        raise ValueError("it must be above 0")
    return seconds


def _union(first: tuple[str, ...], second: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(first + second))

