"""engine = "vllm": `vllm serve` in Docker, its ranks joined by vLLM's own multiprocessing
executor (`distributed_backend = "mp"`, the default) or by a Ray cluster (`"ray"`).

mp: every node runs the same `vllm serve` with `--nnodes/--node-rank/--master-addr/
--master-port`; workers add `--headless` (no API server). Ray: each node's container runs
`ray start` (head first, then workers), then `vllm serve --distributed-executor-backend ray`
is exec'd in the head's container.
"""

from __future__ import annotations

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
DEFAULT_ENTRYPOINT = ("vllm", "serve")
MODEL_IS_HUB_REPO = True
READY = (r"Application startup complete",)
FATAL = (r"EngineDeadError", *COMMON_FATAL, r"RayActorError|ActorDiedError")
READY_PATH = "/health"
READY_TIMEOUT = 3600.0
"""The seed boots in ~20 minutes (and sets VLLM_ENGINE_READY_TIMEOUT_S = 3600)."""
RESERVED_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")
MASTER_PORT = 29500
RAY_PORT = 6379


def recipe_flags(recipe: Recipe) -> tuple[LauncherFlag, ...]:
    """TP, PP, the executor backend and the port, the way `vllm serve` takes them."""
    return (
        LauncherFlag(("--tensor-parallel-size", "-tp"), str(recipe.tensor_parallel_size), "tensor_parallel_size"),
        LauncherFlag(("--pipeline-parallel-size", "-pp"), str(recipe.pipeline_parallel_size), "pipeline_parallel_size"),
        LauncherFlag(("--distributed-executor-backend",), recipe.distributed_backend, "distributed_backend"),
        LauncherFlag(("--port",), str(recipe.port), "port"),
    )


def check(recipe: Recipe) -> list[tuple[tuple[str | int, ...], str]]:
    """The model is `vllm serve`'s positional argument, from the `model` key."""
    return [
        (("args", index), "remove --model from args: `model` is passed as vllm serve's first argument")
        for index, argument in enumerate(recipe.args)
        if argument == "--model" or argument.startswith("--model=")
    ]


def node_env(gang: Gang, rank: int) -> dict[str, str]:
    """vLLM picks the address it advertises from VLLM_HOST_IP: the node's fabric address."""
    return {"VLLM_HOST_IP": gang.hosts[rank].fabric_ip}


def rank_steps(gang: Gang) -> list[tuple[int, Step]]:
    """mp: head then headless workers. Ray: ray head, ray workers, then serve on the head."""
    from swaplab.launch.plan import Step

    recipe = gang.recipe
    serve = (
        *server_command(recipe, gang.engine), recipe.model or "", *recipe.args,
        *missing_flags(recipe.args, recipe_flags(recipe)),
    )
    if recipe.distributed_backend == "ray":
        port = recipe.rendezvous_port or RAY_PORT
        steps = [(0, Step("ray-head", gang.docker_run(0, (
            "ray", "start", "--head", "--port", str(port), "--node-ip-address", gang.head.fabric_ip, "--block",
        )), "rank", wait_for_port=port))]
        for rank in gang.ranks[1:]:
            steps.append((rank, Step("ray-worker", gang.docker_run(rank, (
                "ray", "start", "--address", f"{gang.head.fabric_ip}:{port}",
                "--node-ip-address", gang.hosts[rank].fabric_ip, "--block",
            )), "rank")))
        steps.append((0, Step("serve", ("docker", "exec", gang.container_name(0), *serve), "rank")))
        return steps
    if len(gang.hosts) == 1:
        return [(0, Step("serve", gang.docker_run(0, serve), "rank"))]
    port = str(recipe.rendezvous_port or MASTER_PORT)

    def rendezvous(rank: int) -> tuple[str, ...]:
        return (
            "--nnodes", str(len(gang.hosts)), "--node-rank", str(rank),
            "--master-addr", gang.head.fabric_ip, "--master-port", port,
        )

    steps = [(0, Step("serve", gang.docker_run(0, serve + rendezvous(0)), "rank"))]
    for rank in gang.ranks[1:]:
        steps.append((rank, Step("worker", gang.docker_run(rank, serve + rendezvous(rank) + ("--headless",)), "rank")))
    return steps
