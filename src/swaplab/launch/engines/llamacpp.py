"""engine = "llamacpp": llama.cpp's RPC split. Each worker runs `rpc-server` on its fabric
address; the head runs `llama-server --rpc w1:port,w2:port` and offloads layers to them.

`model` is the GGUF path inside the container (mount it), or a repo passed as `--hf-repo`.
The rpc-server binary sits next to the entrypoint's llama-server (`/app/llama-server` ->
`/app/rpc-server`).
"""

from __future__ import annotations

import posixpath

from swaplab.launch.engine import COMMON_FATAL, Fault, Gang, LauncherFlag, missing_flags
from swaplab.launch.spec import Readiness, Recipe, Step

RPC_PORT = 50052


class Llamacpp:
    """llama.cpp, its layers split across RPC workers."""

    name = "llamacpp"
    order = 2
    uses_docker = True
    default_entrypoint = ("llama-server",)
    # ggml-org's images have a binary (llama-server, llama-cli) or tools.sh as their
    # entrypoint, none of which runs a command given after the image.
    replaces_image_entrypoint = True
    model_is_hub_repo = False
    readiness = Readiness(
        path="/health",
        ready=(r"server is listening",),
        fatal=(*COMMON_FATAL, r"failed to load model", r"error loading model", r"failed to connect to RPC server"),
        timeout=1800.0,
    )
    reserved_flags = ("--rpc",)

    def recipe_flags(self, recipe: Recipe) -> tuple[LauncherFlag, ...]:
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

    def check(self, recipe: Recipe) -> list[Fault]:
        """llama.cpp splits layers across RPC devices: parallel sizes and GPU counts have no meaning here."""
        return [
            ((key,), f"{key} means nothing to llama.cpp, which splits layers across its RPC workers; remove it")
            for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "gpus_per_node")
            if getattr(recipe, key) != 1
        ]

    def gpu_factors(self, recipe: Recipe) -> tuple[tuple[str, int], ...]:
        """None: each node's rpc-server (or the head) offers the GPUs it has."""
        return ()

    def node_env(self, gang: Gang, rank: int) -> dict[str, str]:
        """Where `--hf-repo` downloads go: inside the node's cache mount, so they outlive the container."""
        if gang.hub_mount is None:
            return {}
        return {"LLAMA_CACHE": f"{gang.hub_mount.container}/llama.cpp"}

    def rank_steps(self, gang: Gang) -> list[tuple[int, Step]]:
        """Workers' rpc-servers first (each listening before the next starts), then the head."""
        recipe = gang.recipe
        port = recipe.rendezvous_port or RPC_PORT
        server = gang.server_command
        steps = []
        for rank in gang.ranks[1:]:
            address = gang.hosts[rank].fabric_ip
            command = (rpc_server_command(server), "--host", address, "--port", str(port))
            steps.append((rank, Step("rpc-server", gang.docker_run(rank, command), "rank", wait_for_port=port)))
        head = (*server, *recipe.args, *missing_flags(recipe.args, self.recipe_flags(recipe)))
        if len(gang.hosts) > 1:
            head += ("--rpc", ",".join(f"{host.fabric_ip}:{port}" for host in gang.hosts[1:]))
        steps.append((0, Step("serve", gang.docker_run(0, head), "rank")))
        return steps


def rpc_server_command(server: tuple[str, ...]) -> str:
    """rpc-server, from the same folder as the entrypoint's llama-server when it names one."""
    folder, binary = posixpath.split(server[0])
    return posixpath.join(folder, "rpc-server") if binary == "llama-server" else "rpc-server"


ENGINE = Llamacpp()
