"""engine = "llamacpp": llama.cpp's RPC split. Each worker runs `rpc-server` on its fabric
address; the head runs `llama-server --rpc w1:port,w2:port` and offloads layers to them.

`model` is the GGUF path inside the container (mount it), or a repo passed as `--hf-repo`.
The rpc-server binary sits next to the entrypoint's llama-server (`/app/llama-server` ->
`/app/rpc-server`).
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from swaplab.launch.engines import (
    COMMON_FATAL,
    LauncherFlag,
    missing_flags,
    server_command,
)

if TYPE_CHECKING:
    from swaplab.launch.engines import Gang
    from swaplab.launch.plan import Step
    from swaplab.launch.recipe import Recipe

USES_DOCKER = True
DEFAULT_ENTRYPOINT = ("llama-server",)
MODEL_IS_HUB_REPO = False
READY = (r"server is listening",)
FATAL = (*COMMON_FATAL, r"failed to load model", r"error loading model", r"failed to connect to RPC server")
READY_PATH = "/health"
READY_TIMEOUT = 1800.0
RESERVED_FLAGS = ("--rpc",)
RPC_PORT = 50052


def recipe_flags(recipe: Recipe) -> tuple[LauncherFlag, ...]:
    """The model (a path, or a repo for --hf-repo), where to listen, and the port."""
    model = recipe.model or ""
    is_path = model.startswith("/") or model.endswith(".gguf")
    model_flag = ("--model", "-m") if is_path else ("--hf-repo", "-hf")
    return (
        LauncherFlag(model_flag, model, "model"),
        # llama-server listens on 127.0.0.1 unless told; the router reaches the head from elsewhere.
        LauncherFlag(("--host",), "0.0.0.0", None),
        LauncherFlag(("--port",), str(recipe.port), "port"),
    )


def check(recipe: Recipe) -> list[tuple[tuple[str | int, ...], str]]:
    """llama.cpp splits layers across RPC devices: TP/PP sizes have no meaning here."""
    return [
        ((key,), f"{key} means nothing to llama.cpp, which splits layers across its RPC workers; remove it")
        for key in ("tensor_parallel_size", "pipeline_parallel_size")
        if getattr(recipe, key) != 1
    ]


def node_env(gang: Gang, rank: int) -> dict[str, str]:
    """llama.cpp reads no variables of its own here."""
    return {}


def rpc_server_command(server: tuple[str, ...]) -> str:
    """rpc-server, from the same folder as the entrypoint's llama-server when it names one."""
    folder, binary = posixpath.split(server[0])
    return posixpath.join(folder, "rpc-server") if binary == "llama-server" else "rpc-server"


def rank_steps(gang: Gang) -> list[tuple[int, Step]]:
    """Workers' rpc-servers first (each listening before the next starts), then the head."""
    from swaplab.launch.plan import Step

    recipe = gang.recipe
    port = recipe.rendezvous_port or RPC_PORT
    server = server_command(recipe, gang.engine)
    steps = []
    for rank in gang.ranks[1:]:
        address = gang.hosts[rank].fabric_ip
        command = (rpc_server_command(server), "--host", address, "--port", str(port))
        steps.append((rank, Step("rpc-server", gang.docker_run(rank, command), "rank", wait_for_port=port)))
    head = (*server, *recipe.args, *missing_flags(recipe.args, recipe_flags(recipe)))
    if len(gang.hosts) > 1:
        head += ("--rpc", ",".join(f"{host.fabric_ip}:{port}" for host in gang.hosts[1:]))
    steps.append((0, Step("serve", gang.docker_run(0, head), "rank")))
    return steps
