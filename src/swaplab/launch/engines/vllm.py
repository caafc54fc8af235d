"""engine = "vllm": `vllm serve` in Docker, its ranks joined by vLLM's own multiprocessing
executor (`distributed_backend = "mp"`, the default) or by a Ray cluster (`"ray"`).

mp: every node runs the same `vllm serve` with `--nnodes/--node-rank/--master-addr/
--master-port`; workers add `--headless` (no API server). Ray: each node's container runs
`ray start` (head first, then workers), then `vllm serve --distributed-executor-backend ray`
is exec'd in the head's container.
"""

from __future__ import annotations

from swaplab.launch.engine import COMMON_FATAL, Fault, Gang, LauncherFlag, missing_flags
from swaplab.launch.spec import Readiness, Recipe, Step

MASTER_PORT = 29500
RAY_PORT = 6379


class Vllm:
    """vLLM, multi-node through its mp executor or Ray."""

    name = "vllm"
    order = 0
    uses_docker = True
    default_entrypoint = ("vllm", "serve")
    # NGC-based images (the seed's) keep their wrapper entrypoint; vllm/vllm-openai's is
    # `vllm serve` itself and needs replace_image_entrypoint = true.
    replaces_image_entrypoint = False
    model_is_hub_repo = True
    # The seed boots in ~20 minutes (and sets VLLM_ENGINE_READY_TIMEOUT_S = 3600).
    readiness = Readiness(
        path="/health",
        ready=(r"Application startup complete",),
        fatal=(r"EngineDeadError", *COMMON_FATAL, r"RayActorError|ActorDiedError"),
        timeout=3600.0,
    )
    reserved_flags = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")

    def recipe_flags(self, recipe: Recipe) -> tuple[LauncherFlag, ...]:
        """TP, PP, DP (only when above 1), the executor backend and the port, the way `vllm serve` takes them."""
        return (
            LauncherFlag(("--tensor-parallel-size", "-tp"), str(recipe.tensor_parallel_size), "tensor_parallel_size"),
            LauncherFlag(("--pipeline-parallel-size", "-pp"), str(recipe.pipeline_parallel_size), "pipeline_parallel_size"),
            LauncherFlag(("--data-parallel-size", "-dp"), str(recipe.data_parallel_size), "data_parallel_size", engine_default="1"),
            LauncherFlag(("--distributed-executor-backend",), recipe.distributed_backend, "distributed_backend"),
            LauncherFlag(("--port",), str(recipe.port), "port"),
        )

    def check(self, recipe: Recipe) -> list[Fault]:
        """The model is `vllm serve`'s positional argument, from the `model` key."""
        return [
            (("args", index), "remove --model from args: `model` is passed as vllm serve's first argument")
            for index, argument in enumerate(recipe.args)
            if argument == "--model" or argument.startswith("--model=")
        ]

    def gpu_factors(self, recipe: Recipe) -> tuple[tuple[str, int], ...]:
        """vLLM's world is TP x PP GPUs per data-parallel replica, DP replicas in all."""
        return (
            ("tensor_parallel_size", recipe.tensor_parallel_size),
            ("pipeline_parallel_size", recipe.pipeline_parallel_size),
            ("data_parallel_size", recipe.data_parallel_size),
        )

    def node_env(self, gang: Gang, rank: int) -> dict[str, str]:
        """vLLM picks the address it advertises from VLLM_HOST_IP: the node's fabric address."""
        return {"VLLM_HOST_IP": gang.hosts[rank].fabric_ip}

    def rank_steps(self, gang: Gang) -> list[tuple[int, Step]]:
        """mp: head then headless workers. Ray: ray head, ray workers, then serve on the head."""
        recipe = gang.recipe
        serve = (
            *gang.server_command, recipe.model or "", *recipe.args,
            *missing_flags(recipe.args, self.recipe_flags(recipe)),
        )
        if recipe.distributed_backend == "ray":
            return _ray_steps(gang, serve)
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


def _ray_steps(gang: Gang, serve: tuple[str, ...]) -> list[tuple[int, Step]]:
    """A Ray head (until its port accepts), the Ray workers, then `serve` exec'd in the head's container."""
    port = gang.recipe.rendezvous_port or RAY_PORT
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


ENGINE = Vllm()
