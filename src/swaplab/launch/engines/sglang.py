"""engine = "sglang": `python3 -m sglang.launch_server` in Docker on every node, the same
command with `--dist-init-addr HEAD:PORT --nnodes N --node-rank R`; rank 0 serves HTTP."""

from __future__ import annotations

from swaplab.launch.engine import (
    COMMON_FATAL,
    Fault,
    Gang,
    LauncherFlag,
    find_flag,
    missing_flags,
)
from swaplab.launch.spec import Readiness, Recipe, Step

DIST_INIT_PORT = 20000


class Sglang:
    """SGLang, multi-node through its own `--dist-init-addr` rendezvous."""

    name = "sglang"
    order = 1
    uses_docker = True
    default_entrypoint = ("python3", "-m", "sglang.launch_server")
    replaces_image_entrypoint = False
    model_is_hub_repo = True
    readiness = Readiness(
        path="/health",
        ready=(r"The server is fired up and ready to roll",),
        fatal=(*COMMON_FATAL, r"Received sigquit from a child process", r"Scheduler hit an exception"),
        timeout=1800.0,
    )
    reserved_flags = ("--nnodes", "--node-rank", "--dist-init-addr")

    def recipe_flags(self, recipe: Recipe) -> tuple[LauncherFlag, ...]:
        """Model, TP, PP and DP (each only when above 1: older servers lack the flag) and where to listen."""
        # `--tp`, `--pp` and `--dp` are argparse's abbreviations of the -size flags, which SGLang takes.
        return (
            LauncherFlag(("--model-path", "--model"), recipe.model or "", "model"),
            LauncherFlag(("--tp-size", "--tp", "--tensor-parallel-size"), str(recipe.tensor_parallel_size), "tensor_parallel_size"),
            LauncherFlag(
                ("--pp-size", "--pp", "--pipeline-parallel-size"), str(recipe.pipeline_parallel_size), "pipeline_parallel_size",
                engine_default="1",
            ),
            LauncherFlag(
                ("--dp-size", "--dp", "--data-parallel-size"), str(recipe.data_parallel_size), "data_parallel_size",
                engine_default="1",
            ),
            # SGLang listens on 127.0.0.1 unless told; the router reaches the head from elsewhere.
            LauncherFlag(("--host",), "0.0.0.0", None),
            LauncherFlag(("--port",), str(recipe.port), "port"),
        )

    def check(self, recipe: Recipe) -> list[Fault]:
        """Nothing beyond the flags the launcher owns."""
        return []

    def gpu_factors(self, recipe: Recipe) -> tuple[tuple[str, int], ...]:
        """TP x PP GPUs, times DP replicas; under `--enable-dp-attention` the DP attention groups
        split the TP GPUs instead of adding their own."""
        factors = (
            ("tensor_parallel_size", recipe.tensor_parallel_size),
            ("pipeline_parallel_size", recipe.pipeline_parallel_size),
        )
        if find_flag(recipe.args, ("--enable-dp-attention",)):
            return factors
        return (*factors, ("data_parallel_size", recipe.data_parallel_size))

    def node_env(self, gang: Gang, rank: int) -> dict[str, str]:
        """SGLang needs no variables of its own; NCCL's come from the cluster's [nccl] table."""
        return {}

    def rank_steps(self, gang: Gang) -> list[tuple[int, Step]]:
        """Every node runs the server with its rank; the head (rank 0) first."""
        recipe = gang.recipe
        command = (*gang.server_command, *recipe.args, *missing_flags(recipe.args, self.recipe_flags(recipe)))
        if len(gang.hosts) > 1:
            address = f"{gang.head.fabric_ip}:{recipe.rendezvous_port or DIST_INIT_PORT}"
            command += ("--dist-init-addr", address, "--nnodes", str(len(gang.hosts)))
        steps = []
        for rank in gang.ranks:
            rank_flags = ("--node-rank", str(rank)) if len(gang.hosts) > 1 else ()
            steps.append((rank, Step("serve" if rank == 0 else "worker", gang.docker_run(rank, command + rank_flags), "rank")))
        return steps


ENGINE = Sglang()
