"""The launcher's Docker path, for real where a Docker engine answers (skipped elsewhere, with why).

- `doctor` on a container engine reports Docker, its NVIDIA runtime and the GPUs as the node has them;
- `down` stops every container labelled with the recipe, on every node, and leaves none;
- a whole vLLM gang comes up and down when SWAPLAB_TEST_VLLM_RECIPE names a recipe and
  SWAPLAB_TEST_CLUSTERS a clusters file with a cluster `docker` (a GPU box's own test).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sshd as loopback
from procs import http_status
from sshd import CLUSTER

sshd = loopback.sshd


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on this machine"
    try:
        answer = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer within 30 s"
    if answer.returncode != 0:
        return f"no Docker engine answers ({answer.stderr.strip().splitlines()[-1] if answer.stderr.strip() else 'docker version failed'})"
    return None


DOCKER_PROBLEM = _docker_problem()
pytestmark = pytest.mark.skipif(DOCKER_PROBLEM is not None, reason=f"Docker path not testable here: {DOCKER_PROBLEM}")


def docker(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def write_container_recipe(directory: Path, slug: str, image: str) -> Path:
    folder = directory / slug
    folder.mkdir(parents=True)
    path = folder / "recipe.toml"
    path.write_text(f"""\
engine = "vllm"
name = "{slug}"
docker_image = "{image}"
model = "Qwen/Qwen2.5-0.5B-Instruct"
required_nodes = 2
tensor_parallel_size = 2
port = 30000
args = []
""")
    return path


def launch(*argv: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swaplab", "launch", *argv], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, check=False, env={**os.environ, **env},
    )


def test_doctor_reports_docker_and_its_gpu_runtime(tmp_path, sshd):
    clusters = loopback.write_cluster(tmp_path, sshd)
    recipe = write_container_recipe(tmp_path, "doctor-docker", "swaplab-test-absent:latest")
    result = launch("doctor", str(recipe), "--cluster", CLUSTER, "--clusters", str(clusters), env={})
    assert "ok    127.0.0.1        docker   Docker " in result.stdout, result.stdout
    runtimes = docker("info", "--format", "{{json .Runtimes}}").stdout
    expected = "ok    127.0.0.1        gpu      NVIDIA container runtime registered" if "nvidia" in runtimes \
        else "FAIL  127.0.0.1        gpu      Docker has no NVIDIA runtime"
    assert expected in result.stdout
    assert "swaplab-test-absent:latest not there yet" in result.stdout


def test_down_removes_every_labelled_container(tmp_path, sshd):
    images = docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    image = next((name for name in images if not name.endswith(":<none>")), None)
    if image is None:
        pytest.skip("no local image to start a container from (and no network to pull one)")
    slug = f"docker-{os.urandom(3).hex()}"
    clusters = loopback.write_cluster(tmp_path, sshd)
    recipe = write_container_recipe(tmp_path, slug, image)
    started = []
    for rank in (0, 1):
        run = docker(
            "run", "--detach", "--label", f"swaplab.recipe={slug}", "--label", f"swaplab.rank={rank}",
            "--entrypoint", "sleep", image, "3600",
        )
        if run.returncode != 0:
            pytest.skip(f"{image} cannot run `sleep`: {run.stderr.strip()}")
        started.append(run.stdout.strip())
    try:
        result = launch("down", str(recipe), "--cluster", CLUSTER, "--clusters", str(clusters), env={})
        assert result.returncode == 0, result.stderr
        left = docker("ps", "--all", "--quiet", "--filter", f"label=swaplab.recipe={slug}").stdout.split()
        assert left == []
    finally:
        docker("rm", "--force", *started)


@pytest.mark.skipif(
    not os.environ.get("SWAPLAB_TEST_VLLM_RECIPE") or not os.environ.get("SWAPLAB_TEST_CLUSTERS"),
    reason="a real vLLM gang needs GPUs, an image and a model: set SWAPLAB_TEST_VLLM_RECIPE and SWAPLAB_TEST_CLUSTERS",
)
def test_a_vllm_gang_comes_up_serves_and_goes_down(tmp_path):
    recipe, clusters = os.environ["SWAPLAB_TEST_VLLM_RECIPE"], os.environ["SWAPLAB_TEST_CLUSTERS"]
    common = [recipe, "--cluster", "docker", "--clusters", clusters]
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    try:
        up = launch("up", *common, env=env, timeout=3600)
        assert up.returncode == 0, up.stderr[-4000:]
        status = launch("status", *common, env=env)
        assert status.returncode == 0 and "serving" in status.stdout, status.stdout
        head = next(line for line in up.stderr.splitlines() if "ready: " in line).split("ready: ")[1].split()[0]
        assert http_status(f"{head}/v1/models") == 200
    finally:
        down = launch("down", *common, env=env)
    assert down.returncode == 0, down.stderr
    slug = json.loads(next((tmp_path / "state").rglob("run.json")).read_text())["recipe"]
    assert docker("ps", "--all", "--quiet", "--filter", f"label=swaplab.recipe={slug}").stdout.split() == []
