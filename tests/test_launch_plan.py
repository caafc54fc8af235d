"""`swaplab launch plan`: golden plans of the seed recipe (mp, Ray), SGLang and llama.cpp on a
two-node cluster, and the properties of those plans that matter on real machines.

Golden files live in tests/fixtures/launch/golden/. After an intended change, regenerate them
with `SWAPLAB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_launch_plan.py` and review the diff.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from procs import run_swaplab

from swaplab.errors import SwaplabError
from swaplab.launch.cluster import Cluster, Host, get_cluster
from swaplab.launch.plan import (
    VERIFY_SCRIPT,
    Plan,
    default_run_id,
    expand_home,
    format_argv,
    make_plan,
    plan_json,
    plan_text,
)
from swaplab.launch.recipe import load_recipe
from swaplab.launch.spec import Recipe, drafters

FIXTURES = Path(__file__).parent / "fixtures" / "launch"
GOLDEN = FIXTURES / "golden"
CLUSTERS = FIXTURES / "clusters.toml"
SEED = FIXTURES / "glm53-flash-exl3" / "recipe.toml"
SPECULATIVE = '{"method":"dflash","model":"incoai/GLM-5.3-Flash-DFlash2","num_speculative_tokens":7}'
HEAD_IP, WORKER_IP = "192.168.100.3", "192.168.100.4"


def seed_with_ray(tmp_path: Path) -> Path:
    """The seed switched to Ray: its backend key and its own backend flag both say ray."""
    text = SEED.read_text()
    assert text.count('distributed_backend = "mp"') == 1 and text.count('"--distributed-executor-backend", "mp"') == 1
    text = text.replace('distributed_backend = "mp"', 'distributed_backend = "ray"')
    text = text.replace('"--distributed-executor-backend", "mp"', '"--distributed-executor-backend", "ray"')
    folder = tmp_path / "glm53-flash-exl3-ray"
    folder.mkdir()
    (folder / "recipe.toml").write_text(text)
    return folder / "recipe.toml"


def plan_of(recipe_path: Path, cluster: str = "ds4") -> Plan:
    recipe = load_recipe(recipe_path)
    chosen = get_cluster(CLUSTERS, cluster)
    return make_plan(recipe, chosen, run_id=default_run_id(recipe, chosen))


def rank_argv(plan: Plan, rank: int, name: str | None = None) -> tuple[str, ...]:
    """The argv of a rank step of node `rank` (the only one, or the one called `name`)."""
    steps = [step for step in plan.nodes[rank].steps if step.kind == "rank" and (name is None or step.name == name)]
    assert len(steps) == 1, steps
    return steps[0].argv


def values_of(argv: tuple[str, ...], flag: str) -> list[str]:
    return [argv[index + 1] for index, word in enumerate(argv) if word == flag]


def check_golden(plan: Plan, name: str, *, as_text: bool = False) -> None:
    """Compare `plan --json` (or, `as_text`, the plan as `plan` prints it) with the golden
    file; the recipe's folder reads <recipe-dir>."""
    text = plan_text(plan) if as_text else json.dumps(plan_json(plan), indent=2) + "\n"
    text = text.replace(str(plan.recipe.path.parent), "<recipe-dir>")
    golden = GOLDEN / f"{name}.{'txt' if as_text else 'json'}"
    if os.environ.get("SWAPLAB_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}; run with SWAPLAB_UPDATE_GOLDEN=1 to write it"
    assert text == golden.read_text(), f"plan differs from {golden}; if intended, regenerate with SWAPLAB_UPDATE_GOLDEN=1"


# --- golden plans ----------------------------------------------------------------------------


def test_golden_seed_vllm_mp():
    check_golden(plan_of(SEED), "glm53-flash-exl3-mp")


def test_golden_seed_as_printed_keeps_the_images_entrypoint_and_runs_vllm_serve_after_the_image():
    """The seed as a person reads its plan: no --entrypoint, `IMAGE vllm serve MODEL`, so the
    NGC wrapper of the image runs first and execs `vllm serve`."""
    check_golden(plan_of(SEED), "glm53-flash-exl3-mp", as_text=True)


def test_golden_seed_vllm_ray(tmp_path):
    check_golden(plan_of(seed_with_ray(tmp_path)), "glm53-flash-exl3-ray")


def test_golden_sglang():
    check_golden(plan_of(FIXTURES / "glm-sglang"), "glm-sglang")


def test_golden_sglang_as_printed_shows_the_secrets_reference_only():
    # Its [env] has HF_TOKEN = "${env.HF_TOKEN}": the rank and download steps name the variable
    # (`-e HF_TOKEN`, no value) and the printed plan says where the value will come from.
    check_golden(plan_of(FIXTURES / "glm-sglang"), "glm-sglang", as_text=True)
    plan = plan_of(FIXTURES / "glm-sglang")
    for node in plan.nodes:
        for step in node.steps:
            if step.kind == "rank" or step.name == "download-models":
                assert step.secrets == ("HF_TOKEN",)
                assert "-e" in step.argv and "HF_TOKEN" in values_of(step.argv, "-e")
                assert not any("${env." in word for word in step.argv)


def test_plan_never_reads_a_secret_even_when_it_is_set():
    secret = f"hf_{os.urandom(16).hex()}"
    environment = {"HF_TOKEN": secret}
    text = run_swaplab("launch", "plan", str(FIXTURES / "glm-sglang"), "--cluster", "ds4", "--clusters", str(CLUSTERS), env=environment)
    as_json = run_swaplab(
        "launch", "plan", str(FIXTURES / "glm-sglang"), "--cluster", "ds4", "--clusters", str(CLUSTERS), "--json", env=environment,
    )
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    assert "HF_TOKEN=${env.HF_TOKEN}" in text.stdout
    for result in (text, as_json):
        assert secret not in result.stdout + result.stderr


def test_golden_llamacpp():
    check_golden(plan_of(FIXTURES / "gemma-llamacpp"), "gemma-llamacpp")


def test_plan_json_has_exactly_the_specified_shape():
    document = plan_json(plan_of(SEED))
    assert list(document) == ["nodes"]
    for node in document["nodes"]:
        assert list(node) == ["host", "rank", "steps"]
        for step in node["steps"]:
            assert list(step) == ["name", "argv"] and all(isinstance(word, str) for word in step["argv"])


# --- what matters in the seed's plan ---------------------------------------------------------


def test_the_speculative_config_is_one_argument_of_pure_json_on_every_rank():
    plan = plan_of(SEED)
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        assert values_of(argv, "--speculative-config") == [SPECULATIVE]
        assert values_of(argv, "--default-chat-template-kwargs") == ['{"enable_thinking": false}']


def test_vllm_mp_rendezvous_headless_only_on_the_worker_and_no_duplicate_backend_flag():
    plan = plan_of(SEED)
    head, worker = rank_argv(plan, 0), rank_argv(plan, 1)
    assert "--headless" not in head and worker[-1] == "--headless" and worker.count("--headless") == 1
    for rank, argv in ((0, head), (1, worker)):
        assert values_of(argv, "--node-rank") == [str(rank)]
        assert values_of(argv, "--nnodes") == ["2"]
        assert values_of(argv, "--master-addr") == [HEAD_IP]
        assert values_of(argv, "--master-port") == ["29500"]
        assert values_of(argv, "--distributed-executor-backend") == ["mp"]
        assert values_of(argv, "--tensor-parallel-size") == ["2"]
        assert values_of(argv, "--port") == ["30000"]
    assert plan.start_order == ((0, "serve"), (1, "worker"))
    assert plan.head_url == f"http://{HEAD_IP}:30000"


def test_the_images_entrypoint_stays_and_runs_vllm_serve_named_after_the_image():
    # The seed's image is NGC-based: its wrapper (/opt/nvidia/nvidia_entrypoint.sh) sets up CUDA
    # forward compatibility, then execs the first word after the image as a program.
    plan = plan_of(SEED)
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        assert "--entrypoint" not in argv
        image = argv.index("glm53-flash-exl3:local")
        assert argv[image - 2 : image + 4] == (
            "-v", "~/.cache/glm53-exl3-jit/vllm:/root/.cache/vllm",
            "glm53-flash-exl3:local", "vllm", "serve", "brandonmusic/GLM-5.3-Flash-tr3-4bpw",
        )


def seed_variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """The seed with one line replaced, in a folder of its own (named like the seed's, so its
    slug, container names and labels are the seed's)."""
    text = SEED.read_text()
    assert text.count(old) == 1
    folder = tmp_path / name / SEED.parent.name
    folder.mkdir(parents=True)
    (folder / "recipe.toml").write_text(text.replace(old, new))
    return folder / "recipe.toml"


def test_replace_image_entrypoint_makes_the_first_word_the_entrypoint_and_the_rest_follow_the_image(tmp_path):
    recipe = seed_variant(
        tmp_path, "replaced", 'entrypoint = ["vllm", "serve"]', 'entrypoint = ["vllm", "serve"]\nreplace_image_entrypoint = true',
    )
    plan = plan_of(recipe)
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        image = argv.index("glm53-flash-exl3:local")
        assert argv[image - 2 : image + 3] == (
            "--entrypoint", "vllm", "glm53-flash-exl3:local", "serve", "brandonmusic/GLM-5.3-Flash-tr3-4bpw",
        )
        assert argv.count("--entrypoint") == 1
    # Nothing else moves: under one run id, the same argv once the entrypoint is put back
    # after the image (the recipe's hash, in a label, differs with its text).
    cluster = get_cluster(CLUSTERS, "ds4")
    kept = make_plan(load_recipe(SEED), cluster, run_id="run")
    replaced = list(rank_argv(make_plan(load_recipe(recipe), cluster, run_id="run"), 0))
    at = replaced.index("--entrypoint")
    del replaced[at : at + 2]
    replaced.insert(replaced.index("glm53-flash-exl3:local") + 1, "vllm")
    assert [word for word in replaced if "recipe-hash=" not in word] == [
        word for word in rank_argv(kept, 0) if "recipe-hash=" not in word
    ]


def test_without_an_entrypoint_the_engines_command_follows_the_image_too(tmp_path):
    recipe = seed_variant(tmp_path, "default-command", 'entrypoint = ["vllm", "serve"]\n', "")
    argv = rank_argv(plan_of(recipe), 0)
    image = argv.index("glm53-flash-exl3:local")
    assert "--entrypoint" not in argv and argv[image : image + 3] == ("glm53-flash-exl3:local", "vllm", "serve")


def test_the_download_helper_replaces_the_entrypoint_whatever_the_recipe_says(tmp_path):
    recipe = seed_variant(tmp_path, "online", 'HF_HUB_OFFLINE = "1"\n', "")
    (download,) = [step for step in plan_of(recipe).nodes[0].steps if step.name == "download-models"]
    image = download.argv.index("glm53-flash-exl3:local")
    assert download.argv[image - 2 : image + 2] == ("--entrypoint", "python3", "glm53-flash-exl3:local", "-c")


def test_every_rank_gets_hf_home_from_the_mount_the_nccl_table_and_its_own_fabric_ip():
    plan = plan_of(SEED)
    for rank, fabric_ip in ((0, HEAD_IP), (1, WORKER_IP)):
        env = values_of(rank_argv(plan, rank), "-e")
        assert "HF_HOME=/mnt/nas/ai/huggingface" in env
        assert {"NCCL_SOCKET_IFNAME=enp1s0f1np1", "GLOO_SOCKET_IFNAME=enp1s0f1np1", "NCCL_IB_HCA=rocep1s0f1"} <= set(env)
        assert f"VLLM_HOST_IP={fabric_ip}" in env
        assert {f"SWAPLAB_RANK={rank}", "SWAPLAB_NNODES=2", f"SWAPLAB_HEAD={HEAD_IP}"} <= set(env)
        assert "HF_HUB_OFFLINE=1" in env
        assert plan.nodes[rank].env["VLLM_HOST_IP"] == fabric_ip


def test_every_docker_flag_mount_and_label_of_a_rank():
    plan = plan_of(SEED)
    argv = rank_argv(plan, 1)
    assert argv[:3] == ("docker", "run", "--rm")
    assert values_of(argv, "--gpus") == ["all"]
    assert values_of(argv, "--network") == ["host"]
    assert values_of(argv, "--ipc") == ["host"]
    assert values_of(argv, "--shm-size") == ["32gb"]
    assert values_of(argv, "--name") == [f"swaplab-{plan.run_id}-rank1"]
    assert values_of(argv, "--label") == [
        f"swaplab.run={plan.run_id}", "swaplab.recipe=glm53-flash-exl3",
        f"swaplab.recipe-hash={plan.recipe.digest()}", "swaplab.rank=1",
    ]
    # ~ stays as written: `up` expands it on each node (see expand_home).
    assert values_of(argv, "-v") == [
        "/mnt/nas/ai/huggingface:/mnt/nas/ai/huggingface",
        "~/.cache/glm53-exl3-jit/triton:/root/.triton",
        "~/.cache/glm53-exl3-jit/flashinfer:/root/.cache/flashinfer",
        "~/.cache/glm53-exl3-jit/vllm:/root/.cache/vllm",
    ]


def test_no_loopback_address_anywhere_in_a_real_engines_plan(tmp_path):
    for recipe in (SEED, seed_with_ray(tmp_path), FIXTURES / "glm-sglang", FIXTURES / "gemma-llamacpp"):
        words = " ".join(word for node in plan_json(plan_of(recipe))["nodes"] for step in node["steps"] for word in step["argv"])
        assert "127.0.0." not in words and "localhost" not in words


def test_the_seed_builds_its_overlay_here_and_loads_it_where_the_image_id_differs():
    plan = plan_of(SEED)
    build = plan.nodes[0].steps[0]
    assert (build.name, build.kind) == ("build-image", "local")
    assert build.argv == ("docker", "build", "--tag", "glm53-flash-exl3:local", str(SEED.parent / "glm53-flash-exl3"))
    assert [step.name for step in plan.nodes[1].steps if step.kind == "local"] == []
    for node in plan.nodes:
        # `up` loads it from here (where it was just built) on every node whose id differs.
        (image,) = [step for step in node.steps if step.name == "image"]
        assert image.image == "glm53-flash-exl3:local" and image.kind == "prepare"


def test_offline_the_head_only_proves_the_shared_hub_has_the_models_and_drop_caches_run_just_before_the_rank():
    # HF_HUB_OFFLINE: the download step fetches nothing, it fails early when the hub lacks a repo.
    # The cluster's hub is one NAS (hf_cache_shared), so only the head runs it and nothing is copied.
    for node in plan_of(SEED).nodes:
        names = [step.name for step in node.steps]
        assert ("download-models" in names) == (node.rank == 0)
        assert not any(name.startswith("copy ") for name in names)
        if node.rank == 0:
            (download,) = [step for step in node.steps if step.name == "download-models"]
            assert "HF_HUB_OFFLINE=1" in values_of(download.argv, "-e")
        assert names[-3:] == ["sync", "drop-caches", "serve" if node.rank == 0 else "worker"]
        assert node.steps[-2].argv == ("sudo", "-n", "sysctl", "-w", "vm.drop_caches=3")


def test_online_recipes_download_their_models_and_drop_caches_can_be_turned_off(tmp_path):
    text = SEED.read_text().replace('HF_HUB_OFFLINE = "1"\n', "").replace('TRANSFORMERS_OFFLINE = "1"\n', "")
    text = text.replace('engine = "vllm"', 'engine = "vllm"\ndrop_caches = false\nextra_models = ["incoai/GLM-5.3-Flash-DFlash2"]')
    folder = tmp_path / "online"
    folder.mkdir()
    (folder / "recipe.toml").write_text(text)
    plan = plan_of(folder)
    for node in plan.nodes:
        names = [step.name for step in node.steps]
        assert "sync" not in names and "drop-caches" not in names
        if node.rank:
            assert "download-models" not in names  # one download, into the NAS both nodes see
            continue
        (download,) = [step for step in node.steps if step.name == "download-models"]
        assert download.argv[-2:] == ("brandonmusic/GLM-5.3-Flash-tr3-4bpw", "incoai/GLM-5.3-Flash-DFlash2")
        assert "HF_HOME=/mnt/nas/ai/huggingface" in values_of(download.argv, "-e")
        assert values_of(download.argv, "-v") == ["/mnt/nas/ai/huggingface:/mnt/nas/ai/huggingface"]


def test_a_local_cache_mirrors_and_verifies_each_model_and_ranks_mount_the_mirror(tmp_path):
    text = SEED.read_text().replace('engine = "vllm"', 'engine = "vllm"\nextra_models = ["incoai/GLM-5.3-Flash-DFlash2"]')
    folder = tmp_path / "mirrored"
    folder.mkdir()
    (folder / "recipe.toml").write_text(text)
    plan = plan_of(folder, cluster="ds4-local")
    for node in plan.nodes:
        names = [step.name for step in node.steps]
        assert names[-7:-3] == [
            "mirror brandonmusic/GLM-5.3-Flash-tr3-4bpw", "verify brandonmusic/GLM-5.3-Flash-tr3-4bpw",
            "mirror incoai/GLM-5.3-Flash-DFlash2", "verify incoai/GLM-5.3-Flash-DFlash2",
        ]
        mirror = node.steps[names.index("mirror incoai/GLM-5.3-Flash-DFlash2")]
        assert mirror.argv == (
            "rsync", "--archive", "--delete", "--mkpath",
            "/mnt/nas/ai/huggingface/hub/models--incoai--GLM-5.3-Flash-DFlash2/",
            "~/.cache/huggingface/hub/models--incoai--GLM-5.3-Flash-DFlash2/",
        )
        argv = rank_argv(plan, node.rank)
        # The container still finds HF_HOME where the recipe said; the node-local copy backs it.
        assert "~/.cache/huggingface:/mnt/nas/ai/huggingface" in values_of(argv, "-v")
        assert "HF_HOME=/mnt/nas/ai/huggingface" in values_of(argv, "-e")


def test_the_verify_step_accepts_a_faithful_mirror_and_rejects_a_corrupt_one(tmp_path):
    source, mirror = tmp_path / "hub" / "models--o--m", tmp_path / "local" / "models--o--m"
    contents = [b"weights" * 1000, b"config"]
    for root in (source, mirror):
        (root / "blobs").mkdir(parents=True)
        for content in contents:
            (root / "blobs" / hashlib.sha256(content).hexdigest()).write_bytes(content)
        small = b'{"a": 1}'
        git_sha1 = hashlib.sha1(b"blob %d\0" % len(small) + small).hexdigest()
        (root / "blobs" / git_sha1).write_bytes(small)

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", VERIFY_SCRIPT, str(source), str(mirror)], check=False, capture_output=True, text=True, timeout=60,
        )

    good = verify()
    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith("verified 3 files")
    blob = mirror / "blobs" / hashlib.sha256(contents[0]).hexdigest()
    blob.write_bytes(b"weightz" * 1000)  # same size, other content
    corrupt = verify()
    assert corrupt.returncode == 1 and "content does not match its hash" in corrupt.stderr
    blob.unlink()
    assert "missing" in verify().stderr


# --- other engines ---------------------------------------------------------------------------


def test_vllm_ray_starts_ray_head_then_workers_then_serve_in_the_head_container(tmp_path):
    plan = plan_of(seed_with_ray(tmp_path))
    assert plan.start_order == ((0, "ray-head"), (1, "ray-worker"), (0, "serve"))
    head = rank_argv(plan, 0, "ray-head")
    assert "--entrypoint" not in head
    assert head[head.index("glm53-flash-exl3:local") :] == (
        "glm53-flash-exl3:local", "ray", "start", "--head", "--port", "6379", "--node-ip-address", HEAD_IP, "--block",
    )
    worker = rank_argv(plan, 1, "ray-worker")
    assert values_of(worker, "--address") == [f"{HEAD_IP}:6379"]
    assert values_of(worker, "--node-ip-address") == [WORKER_IP]
    ray_head = next(step for step in plan.nodes[0].steps if step.name == "ray-head")
    assert ray_head.wait_for_port == 6379
    serve = rank_argv(plan, 0, "serve")
    assert serve[:5] == ("docker", "exec", f"swaplab-{plan.run_id}-rank0", "vllm", "serve")
    assert values_of(serve, "--distributed-executor-backend") == ["ray"]
    assert values_of(serve, "--speculative-config") == [SPECULATIVE]
    assert "--nnodes" not in serve and "--headless" not in serve
    assert [step for node, step in plan.rank_steps()] == [ray_head, plan.nodes[1].steps[-1], plan.nodes[0].steps[-1]]


def test_sglang_ranks_meet_through_dist_init_addr():
    plan = plan_of(FIXTURES / "glm-sglang")
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        assert "--entrypoint" not in argv
        assert argv[argv.index("lmsysorg/sglang:spark") :][:4] == ("lmsysorg/sglang:spark", "python3", "-m", "sglang.launch_server")
        assert values_of(argv, "--dist-init-addr") == [f"{HEAD_IP}:20000"]
        assert values_of(argv, "--nnodes") == ["2"] and values_of(argv, "--node-rank") == [str(rank)]
        assert values_of(argv, "--tp-size") == ["2"] and "--pp-size" not in argv
        assert values_of(argv, "--model-path") == ["zai-org/GLM-4.5-Air-FP8"]
        assert values_of(argv, "--json-model-override-args") == ['{"rope_scaling": null}']
        assert values_of(argv, "--host") == ["0.0.0.0"]
    assert "download-models" in [step.name for step in plan.nodes[0].steps]
    assert "download-models" not in [step.name for step in plan.nodes[1].steps]


def test_llamacpp_workers_serve_rpc_on_their_fabric_ip_and_start_before_the_head():
    plan = plan_of(FIXTURES / "gemma-llamacpp")
    assert plan.start_order == ((1, "rpc-server"), (0, "serve"))
    worker = rank_argv(plan, 1)
    assert worker[worker.index("--entrypoint") + 1 :] == (
        "/app/rpc-server", "ghcr.io/ggml-org/llama.cpp:full-cuda", "--host", WORKER_IP, "--port", "50052",
    )
    head = rank_argv(plan, 0)
    assert head[head.index("--entrypoint") + 1 :][:3] == ("/app/llama-server", "ghcr.io/ggml-org/llama.cpp:full-cuda", "--alias")
    assert values_of(head, "--rpc") == [f"{WORKER_IP}:50052"]
    assert values_of(head, "--model") == ["/models/gemma-3-27b-it-Q4_K_M.gguf"]
    assert "HF_HOME=/mnt/nas/ai/huggingface" not in values_of(head, "-e")


def test_llamacpp_images_entrypoint_is_replaced_unless_the_recipe_keeps_it(tmp_path):
    # ggml-org's images run llama-server or tools.sh as their entrypoint: a command after the
    # image would be its arguments. A recipe whose image has a wrapper says so.
    text = (FIXTURES / "gemma-llamacpp" / "recipe.toml").read_text()
    folder = tmp_path / "kept"
    folder.mkdir()
    (folder / "recipe.toml").write_text(text.replace('port = 30000\n', 'port = 30000\nreplace_image_entrypoint = false\n'))
    plan = plan_of(folder)
    worker, head = rank_argv(plan, 1), rank_argv(plan, 0)
    assert "--entrypoint" not in worker and "--entrypoint" not in head
    assert worker[worker.index("ghcr.io/ggml-org/llama.cpp:full-cuda") :] == (
        "ghcr.io/ggml-org/llama.cpp:full-cuda", "/app/rpc-server", "--host", WORKER_IP, "--port", "50052",
    )
    assert head[head.index("ghcr.io/ggml-org/llama.cpp:full-cuda") :][:3] == (
        "ghcr.io/ggml-org/llama.cpp:full-cuda", "/app/llama-server", "--alias",
    )


def test_data_parallel_size_reaches_every_rank_the_engines_way(tmp_path):
    vllm = seed_variant(tmp_path, "dp", "tensor_parallel_size = 2\n", "tensor_parallel_size = 1\ndata_parallel_size = 2\n")
    plan = plan_of(vllm)
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        assert values_of(argv, "--data-parallel-size") == ["2"]
        assert values_of(argv, "--tensor-parallel-size") == ["1"]
    assert "engine   vllm (mp), 2 node(s), TP 1, PP 1, DP 2\n" in plan_text(plan)
    assert ", DP" not in plan_text(plan_of(SEED)) and "--data-parallel-size" not in rank_argv(plan_of(SEED), 0)
    text = (FIXTURES / "glm-sglang" / "recipe.toml").read_text()
    folder = tmp_path / "glm-sglang-dp"
    folder.mkdir()
    (folder / "recipe.toml").write_text(text.replace("tensor_parallel_size = 2\n", "data_parallel_size = 2\n"))
    plan = plan_of(folder)
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        assert values_of(argv, "--dp-size") == ["2"] and values_of(argv, "--tp-size") == ["1"]


def test_the_plan_command_refuses_sizes_that_do_not_fill_the_nodes_at_the_recipes_line(tmp_path):
    recipe = seed_variant(tmp_path, "tp1", "tensor_parallel_size = 2\n", "tensor_parallel_size = 1\n")
    done = run_swaplab("launch", "plan", str(recipe), "--cluster", "ds4", "--clusters", str(CLUSTERS))
    assert done.returncode == 2 and done.stdout == ""
    line = recipe.read_text().splitlines().index("tensor_parallel_size = 1") + 1
    assert done.stderr.splitlines() == [
        (f"{recipe}:{line}: tensor_parallel_size 1 x pipeline_parallel_size 1 x data_parallel_size 1 = 1 GPU, "
        "but 2 nodes x 1 GPU each = 2: every GPU of the gang runs one rank, so make the sizes' product 2 "
        "or set required_nodes = 1 (a node counts as 1 GPU; set gpus_per_node for nodes with more)"),
    ]


# --- process engine and the cluster's limits -------------------------------------------------

LOOPBACK = Cluster(
    name="loop", user=None, hf_cache_dir="/srv/hub",
    hosts=(Host("127.0.0.1", "127.0.0.1", 2222), Host("127.0.0.2", "127.0.0.2", 2222)),
    nccl={"NCCL_DEBUG": "INFO"},
)


def process_recipe(tmp_path: Path) -> Recipe:
    folder = tmp_path / "sim-gang"
    folder.mkdir(exist_ok=True)
    (folder / "recipe.toml").write_text("""\
engine = "process"
required_nodes = 2
model = "/srv/models/tiny.gguf"
port = 31000
args = ["swaplab", "sim", "--host", "{fabric_ip}", "--port", "{port}", "--model", "{model}",
        "--name", "rank{rank}-of-{head}", '{"keep": "{braces}"}']
[env]
SIM_MODE = "gang"
[readiness]
path = "/v1/models"
ready = ["Uvicorn running"]
""")
    return load_recipe(folder)


def test_process_ranks_run_args_with_per_node_placeholders_and_the_gang_env(tmp_path):
    recipe = process_recipe(tmp_path)
    plan = make_plan(recipe, LOOPBACK, run_id="sim-1")
    assert plan.head_url == "http://127.0.0.1:31000"
    for node in plan.nodes:
        (step,) = node.steps
        assert (step.name, step.kind) == ("rank", "rank")
        assert step.argv == (
            "swaplab", "sim", "--host", node.host.fabric_ip, "--port", "31000", "--model", "/srv/models/tiny.gguf",
            "--name", f"rank{node.rank}-of-127.0.0.1", '{"keep": "{braces}"}',
        )
        assert dict(node.env) == {
            "SIM_MODE": "gang", "NCCL_DEBUG": "INFO", "SWAPLAB_RUN": "sim-1",
            "SWAPLAB_RANK": str(node.rank), "SWAPLAB_NNODES": "2", "SWAPLAB_HEAD": "127.0.0.1",
        }
    assert plan.labels == {"swaplab.run": "sim-1", "swaplab.recipe": "sim-gang", "swaplab.recipe-hash": recipe.digest()}
    assert recipe.readiness.path == "/v1/models" and recipe.readiness.ready == ("Uvicorn running",)


def test_loopback_fabric_ips_are_refused_for_engines_that_meet_over_a_fabric():
    with pytest.raises(SwaplabError, match="loopback fabric_ip 127.0.0.1.*loopback is for engine = \"process\" only"):
        make_plan(load_recipe(SEED), LOOPBACK, run_id="x")


def test_a_cluster_with_too_few_hosts_is_refused_and_extra_hosts_stay_idle(tmp_path):
    single = replace(LOOPBACK, hosts=LOOPBACK.hosts[:1])
    with pytest.raises(SwaplabError, match="needs 2 nodes; cluster 'loop' has 1: add hosts to it or lower required_nodes"):
        make_plan(process_recipe(tmp_path), single, run_id="x")
    three = replace(LOOPBACK, hosts=LOOPBACK.hosts + (Host("127.0.0.3", "127.0.0.3"),))
    plan = make_plan(process_recipe(tmp_path), three, run_id="x")
    assert [node.host.name for node in plan.nodes] == ["127.0.0.1", "127.0.0.2"]


def test_the_run_id_is_the_slug_and_a_hash_of_recipe_and_cluster():
    recipe = load_recipe(SEED)
    ds4, local = get_cluster(CLUSTERS, "ds4"), get_cluster(CLUSTERS, "ds4-local")
    run_id = default_run_id(recipe, ds4)
    assert run_id.startswith("glm53-flash-exl3-") and len(run_id) == len("glm53-flash-exl3-") + 8
    assert default_run_id(recipe, ds4) == run_id != default_run_id(recipe, local)


def test_expand_home_replaces_a_leading_tilde_only():
    assert expand_home(("-v", "~/.cache/x:/root/x", "~", "a~/b", "~user/x"), "/home/gio/") == (
        "-v", "/home/gio/.cache/x:/root/x", "/home/gio", "a~/b", "~user/x",
    )


def test_format_argv_keeps_short_commands_on_one_line_and_breaks_long_ones_before_options():
    assert format_argv(("docker", "load")) == "docker load"
    text = format_argv(("docker", "run", "--rm", "--name", "n", "-e", "A=1 2", "image", "serve", "--flag") + ("x",) * 40)
    assert text.splitlines()[:4] == ["docker run \\", "  --rm \\", "  --name n \\", "  -e 'A=1 2' \\"]


# --- the command -----------------------------------------------------------------------------


def test_the_plan_command_prints_json_and_text_per_node():
    done = run_swaplab("launch", "plan", str(SEED.parent), "--cluster", "ds4", "--clusters", str(CLUSTERS), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == plan_json(plan_of(SEED))
    done = run_swaplab("launch", "plan", str(SEED.parent), "--cluster", "ds4", "--clusters", str(CLUSTERS))
    assert done.returncode == 0, done.stderr
    assert done.stdout == plan_text(plan_of(SEED))
    assert "rank 0 (head) on dgx3, fabric 192.168.100.3" in done.stdout
    assert "rank 1 (worker) on dgx4, fabric 192.168.100.4" in done.stdout
    assert f"--speculative-config '{SPECULATIVE}'" in done.stdout


def test_the_plan_command_reports_faults_of_both_files_at_once(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('engine = "vllm"\ncolour = 1\n')
    clusters = tmp_path / "clusters.toml"
    clusters.write_text('[clusters.c]\nhosts = [{ name = "a", fabric_ip = "nope" }]\n')
    done = run_swaplab("launch", "plan", str(recipe), "--cluster", "c", "--clusters", str(clusters))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert f"{clusters}:2: clusters.c.hosts[0].fabric_ip must be the IP address the ranks meet on, not a string 'nope': write the node's fabric IP address itself, not a name" in lines
    assert any(line.startswith(f"{recipe}:2: unknown key 'colour'") for line in lines)
    assert any(line.startswith(f"{recipe}:1: missing required key 'docker_image'") for line in lines)


def test_the_plan_command_refuses_a_loopback_cluster_for_vllm(tmp_path):
    clusters = tmp_path / "clusters.toml"
    clusters.write_text('[clusters.c]\nhosts = [{ name = "a", fabric_ip = "127.0.0.1" }, { name = "b", fabric_ip = "127.0.0.2" }]\n')
    done = run_swaplab("launch", "plan", str(SEED), "--cluster", "c", "--clusters", str(clusters))
    assert done.returncode == 2
    assert done.stderr.startswith("swaplab: host a of cluster 'c' has the loopback fabric_ip 127.0.0.1")


# --- RDMA and extra container options -------------------------------------------------------


def docker_options(argv: tuple[str, ...], image: str) -> tuple[str, ...]:
    """The `docker run` words before the image (the server's own flags follow it)."""
    return argv[: argv.index(image)]


def test_golden_container_options_on_the_roce_cluster():
    check_golden(plan_of(FIXTURES / "qwen-container"), "qwen-container")


def test_golden_container_options_on_a_privileged_cluster():
    check_golden(plan_of(FIXTURES / "qwen-container", "ds4-privileged"), "qwen-container-privileged", as_text=True)


def test_the_seeds_roce_cluster_gives_every_rank_the_hcas_memlock_and_ipc_lock_and_keeps_the_ngc_wrapper():
    plan = plan_of(SEED)
    image = plan.recipe.docker_image
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        options = docker_options(argv, image)
        assert values_of(options, "--device") == ["/dev/infiniband"]
        assert values_of(options, "--ulimit") == ["memlock=-1:-1"]
        assert values_of(options, "--cap-add") == ["IPC_LOCK"]
        assert "--privileged" not in options and "--entrypoint" not in options
        assert argv[argv.index(image) + 1 : argv.index(image) + 3] == ("vllm", "serve")


def test_explicit_options_that_repeat_the_rdma_defaults_come_out_once_and_the_recipe_adds_its_own():
    plan = plan_of(FIXTURES / "qwen-container")
    argv = rank_argv(plan, 0)
    options = docker_options(argv, plan.recipe.docker_image)
    assert values_of(options, "--device") == ["/dev/infiniband", "/dev/gdrdrv"]
    assert values_of(options, "--ulimit") == ["memlock=-1:-1", "nofile=65536:65536", "stack=67108864:67108864"]
    assert values_of(options, "--cap-add") == ["IPC_LOCK", "SYS_NICE"]
    assert values_of(options, "--user") == ["1000:1000"]
    assert values_of(options, "-v")[-2:] == ["/etc/ssl/certs:/etc/ssl/certs:ro", "/opt/licenses:/licenses:ro"]


def test_a_privileged_cluster_replaces_devices_and_capabilities_and_the_recipe_overrides_its_limits(tmp_path):
    plan = plan_of(FIXTURES / "gemma-llamacpp", "ds4-privileged")
    options = docker_options(rank_argv(plan, 0), plan.recipe.docker_image)
    assert "--privileged" in options and "--device" not in options
    assert values_of(options, "--ulimit") == ["memlock=-1:-1", "nofile=1048576:1048576"]
    assert values_of(options, "--cap-add") == ["SYS_PTRACE"]

    recipe = write_recipe(tmp_path, FIXTURES / "qwen-container", replace_text=(
        'user = "1000:1000"', 'user = "1000:1000"\nprivileged = false\n'
    ))
    own = plan_of(recipe, "ds4-privileged")
    options = docker_options(rank_argv(own, 1), own.recipe.docker_image)
    assert "--privileged" not in options
    assert values_of(options, "--device") == ["/dev/infiniband", "/dev/gdrdrv"]
    assert values_of(options, "--ulimit") == ["memlock=-1:-1", "nofile=65536:65536", "stack=67108864:67108864"]
    assert values_of(options, "--cap-add") == ["IPC_LOCK", "SYS_PTRACE", "SYS_NICE"]


def write_recipe(tmp_path: Path, source: Path, *, replace_text: tuple[str, str]) -> Path:
    text = (source / "recipe.toml").read_text()
    assert replace_text[0] in text
    folder = tmp_path / source.name
    folder.mkdir()
    (folder / "recipe.toml").write_text(text.replace(*replace_text))
    return folder / "recipe.toml"


@pytest.mark.parametrize("nccl, rdma", [
    ('NCCL_IB_HCA = "rocep1s0f1"', True),
    ('NCCL_IB_HCA = "rocep1s0f1"\nNCCL_IB_DISABLE = "1"', False),
    ('NCCL_IB_HCA = "rocep1s0f1"\nNCCL_NET = "Socket"', False),
    ('NCCL_SOCKET_IFNAME = "enp1s0f1np1"', False),
])
def test_rdma_follows_the_nccl_settings_of_the_cluster_or_any_host(tmp_path, nccl, rdma):
    base = (
        '[clusters.c]\nhosts = [{ name = "a", fabric_ip = "10.0.0.1" }, { name = "b", fabric_ip = "10.0.0.2" }]\n'
    )
    for text in (f"{base}[nccl.c]\n{nccl}\n", f"{base}[hosts.b.nccl]\n{nccl}\n"):
        clusters = tmp_path / "clusters.toml"
        clusters.write_text(text)
        cluster = get_cluster(clusters, "c")
        assert cluster.uses_rdma is rdma
        recipe = load_recipe(SEED)
        argv = make_plan(recipe, cluster, run_id="r").nodes[0].steps[-1].argv
        assert ("--device" in docker_options(argv, recipe.docker_image)) is rdma
    # Said outright, either way, whatever the settings.
    for said in (True, False):
        clusters.write_text(f"{base}rdma = {str(said).lower()}\n[nccl.c]\n{nccl}\n")
        assert get_cluster(clusters, "c").uses_rdma is said


def test_a_hosts_own_nccl_settings_win_over_the_clusters_for_its_rank_only(tmp_path):
    clusters = tmp_path / "clusters.toml"
    clusters.write_text(CLUSTERS.read_text() + '\n[hosts.dgx4.nccl]\nNCCL_IB_HCA = "roceP2p1s0f1"\nNCCL_IB_GID_INDEX = "3"\n')
    recipe = load_recipe(SEED)
    cluster = get_cluster(clusters, "ds4")
    plan = make_plan(recipe, cluster, run_id="r")
    assert plan.nodes[0].env["NCCL_IB_HCA"] == "rocep1s0f1" and "NCCL_IB_GID_INDEX" not in plan.nodes[0].env
    assert plan.nodes[1].env["NCCL_IB_HCA"] == "roceP2p1s0f1" and plan.nodes[1].env["NCCL_IB_GID_INDEX"] == "3"
    assert plan.nodes[1].env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    worker = rank_argv(plan, 1)
    assert "NCCL_IB_HCA=roceP2p1s0f1" in values_of(worker, "-e") and "NCCL_IB_HCA=rocep1s0f1" not in values_of(worker, "-e")


# --- [[pre_serve]] hooks ---------------------------------------------------------------------

PRE_SERVE = FIXTURES / "qwen-pre-serve"


def test_golden_pre_serve_hooks():
    check_golden(plan_of(PRE_SERVE), "qwen-pre-serve")


def test_pre_serve_wraps_the_server_command_after_the_image_and_mounts_each_staged_file_read_only():
    plan = plan_of(PRE_SERVE)
    run_id = plan.run_id
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        image = argv.index("nvcr.io/nvidia/vllm:25.11-py3")
        # The image's entrypoint (NGC's wrapper) still runs first, and runs the hooks' sh.
        assert "--entrypoint" not in argv
        assert argv[image + 1:image + 2] == ("sh",) and argv[image + 2] == "-c"
        script = argv[image + 3]
        assert script.endswith('exec "$@"\n')
        assert ("hook 1 'recipe.toml line 11' sh -c 'cd /usr/local/lib/python3.12/dist-packages && patch -p1 < "
                "/workspace/mods/fix-rope.patch'\n") in script
        assert "hook 2 'recipe.toml line 15' pip install --no-deps flashinfer-cubin==0.5.2\n" in script
        assert argv[image + 4:image + 10] == (
            "pre_serve", "1", "/swaplab/pre-serve/0", "/workspace/mods/fix-rope.patch", "vllm", "serve",
        )
        assert argv[image + 10] == "Qwen/Qwen3-8B"
        assert f"~/.local/state/swaplab/launch/qwen-pre-serve/pre-serve/{run_id}/0:/swaplab/pre-serve/0:ro" in values_of(argv, "-v")
        stage = next(step for step in plan.nodes[rank].steps if step.name.startswith("stage pre_serve"))
        assert stage.kind == "prepare" and stage.argv[-1] == f"~/.local/state/swaplab/launch/qwen-pre-serve/pre-serve/{run_id}/0"
        assert stage.stdin_from == ("cat", "--", str(PRE_SERVE / "mods" / "fix-rope.patch"))


def test_pre_serve_with_a_replaced_entrypoint_makes_sh_the_entrypoint(tmp_path):
    folder = tmp_path / "qwen-pre-serve"
    shutil.copytree(PRE_SERVE, folder)
    text = (folder / "recipe.toml").read_text().replace("drop_caches = false", "drop_caches = false\nreplace_image_entrypoint = true")
    (folder / "recipe.toml").write_text(text)
    argv = rank_argv(plan_of(folder / "recipe.toml"), 0)
    image = argv.index("nvcr.io/nvidia/vllm:25.11-py3")
    assert argv[image - 2:image] == ("--entrypoint", "sh") and argv[image + 1] == "-c"
    assert argv[image + 3:image + 9] == ("pre_serve", "1", "/swaplab/pre-serve/0", "/workspace/mods/fix-rope.patch", "vllm", "serve")


# --- models: fetched once, copied to the nodes ------------------------------------------------

TP4 = FIXTURES / "qwen-sglang-tp4"
QWEN = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"
QWEN_REVISION = "e156cb4b9a7b6bc2d0e5a5c8e3e2d1b0c9a8f7e6"


def test_golden_sglang_tp4_fetches_once_on_the_head_and_copies_to_three_workers():
    check_golden(plan_of(TP4, cluster="ds4x4"), "qwen-sglang-tp4", as_text=True)


def test_the_head_fetches_pinned_revisions_and_the_drafter_named_only_by_its_flag():
    plan = plan_of(TP4, cluster="ds4x4")
    (download,) = [step for step in plan.nodes[0].steps if step.name == "download-models"]
    assert download.argv[-2:] == (f"{QWEN}@{QWEN_REVISION}", "lmsys/Qwen3-235B-A22B-EAGLE3@v1.0")
    assert values_of(download.argv, "-v") == ["~/.cache/huggingface:/root/.cache/huggingface"]
    assert download.secrets == ("HF_TOKEN",)
    # Labelled as the gang's containers are, so `down` stops one an interrupted `up` left running.
    assert values_of(download.argv, "--label") == [f"{key}={value}" for key, value in plan.labels.items()]
    assert not any(step.name.startswith("copy ") for step in plan.nodes[0].steps)
    for node in plan.nodes[1:]:
        names = [step.name for step in node.steps]
        assert "download-models" not in names
        assert names[1:5] == [f"copy {QWEN}", f"copy {QWEN} refs", "copy lmsys/Qwen3-235B-A22B-EAGLE3",
                              "copy lmsys/Qwen3-235B-A22B-EAGLE3 refs"]
        blobs, links = node.steps[1], node.steps[2]
        # Pulled by the worker from the head's fabric address, only once the head has them.
        assert blobs.kind == "prepare" and blobs.after_head == "download-models"
        folder = "hub/models--Qwen--Qwen3-235B-A22B-Instruct-2507-FP8"
        assert blobs.argv == (
            "rsync", "--archive", "--mkpath", "--info=name1,progress2,stats1", "--ignore-existing",
            "--exclude=*.incomplete", "-e", "ssh -o BatchMode=yes -l giovanni",
            f"192.168.100.11:.cache/huggingface/{folder}/blobs/", f"~/.cache/huggingface/{folder}/blobs/",
        )
        assert links.argv[-3:] == (
            f"192.168.100.11:.cache/huggingface/{folder}/snapshots", f"192.168.100.11:.cache/huggingface/{folder}/refs",
            f"~/.cache/huggingface/{folder}/",
        )
        # Every rank reads its own node's copy.
        assert "~/.cache/huggingface:/root/.cache/huggingface" in values_of(rank_argv(plan, node.rank), "-v")


def test_a_hosts_own_cache_folder_is_where_its_copy_goes_and_what_its_rank_mounts():
    # glm-sglang mounts its own HF_HOME, which wins over every cache folder of the cluster.
    plan = plan_of(FIXTURES / "glm-sglang", cluster="ds4-own-disks")
    assert values_of(rank_argv(plan, 1), "-v") == ["/mnt/nas/ai/huggingface:/root/.cache/huggingface"]
    plan = plan_of(FIXTURES / "qwen-container", cluster="ds4-own-disks")
    worker = plan.nodes[1]
    copies = [step for step in worker.steps if step.name.startswith("copy ")]
    assert copies and all(step.argv[-1].startswith("/data/huggingface/hub/") for step in copies)
    assert all(step.argv[-2].startswith("192.168.100.3:.cache/huggingface/hub/") for step in copies)
    assert "/data/huggingface:/root/.cache/huggingface" in values_of(rank_argv(plan, 1), "-v")
    assert "~/.cache/huggingface:/root/.cache/huggingface" in values_of(rank_argv(plan, 0), "-v")


def clusters_variant(tmp_path: Path, name: str, extra: str) -> Path:
    """The fixture clusters file with lines added to [clusters.NAME]."""
    text = CLUSTERS.read_text()
    header = f"[clusters.{name}]\n"
    assert text.count(header) == 1
    path = tmp_path / "clusters.toml"
    path.write_text(text.replace(header, header + extra))
    return path


def test_download_here_fetches_on_this_machine_then_sends_to_every_node(tmp_path):
    clusters = clusters_variant(tmp_path, "ds4x4", 'download = "here"\ndownload_dir = "/srv/hub"\n')
    recipe = load_recipe(TP4)
    cluster = get_cluster(clusters, "ds4x4")
    plan = make_plan(recipe, cluster, run_id="r")
    (download,) = [step for node in plan.nodes for step in node.steps if step.name == "download-models"]
    assert download.kind == "local" and download.secrets == ("HF_TOKEN",)
    assert download.argv[:4] == ("env", "HF_HOME=/srv/hub", sys.executable, "-c")
    assert download.argv[-2:] == (f"{QWEN}@{QWEN_REVISION}", "lmsys/Qwen3-235B-A22B-EAGLE3@v1.0")
    assert not any("HF_TOKEN" in word for word in download.argv)  # the secret travels in the environment
    for node in plan.nodes:
        copies = [step for step in node.steps if step.name.startswith("copy ")]
        assert [step.kind for step in copies] == ["send"] * 4
        assert copies[0].argv[-2:] == (
            "/srv/hub/hub/models--Qwen--Qwen3-235B-A22B-Instruct-2507-FP8/blobs/",
            f"{node.host.name}:.cache/huggingface/hub/models--Qwen--Qwen3-235B-A22B-Instruct-2507-FP8/blobs/",
        )
    assert "# on this machine, into spark3" in plan_text(plan)


def test_a_shared_hub_gets_one_download_and_no_copies_but_the_heads(tmp_path):
    clusters = clusters_variant(tmp_path, "ds4x4", 'download = "here"\nhf_cache_dir = "/mnt/nas/hf"\nhf_cache_shared = true\n')
    plan = make_plan(load_recipe(TP4), get_cluster(clusters, "ds4x4"), run_id="r")
    assert [step.name for step in plan.nodes[0].steps if step.kind == "send"] == [
        f"copy {QWEN}", f"copy {QWEN} refs", "copy lmsys/Qwen3-235B-A22B-EAGLE3", "copy lmsys/Qwen3-235B-A22B-EAGLE3 refs",
    ]
    for node in plan.nodes[1:]:
        assert not any(step.name.startswith(("copy ", "download")) for step in node.steps)
        assert "/mnt/nas/hf:/root/.cache/huggingface" in values_of(rank_argv(plan, node.rank), "-v")


def test_golden_llamacpp_rpc_gets_a_cache_mount_for_its_downloads():
    plan = plan_of(FIXTURES / "gemma-llamacpp")
    check_golden(plan, "gemma-llamacpp", as_text=True)
    for rank in (0, 1):
        argv = rank_argv(plan, rank)
        assert "/mnt/nas/ai/huggingface:/root/.cache/huggingface" in values_of(argv, "-v")
        assert {"HF_HOME=/root/.cache/huggingface", "LLAMA_CACHE=/root/.cache/huggingface/llama.cpp"} <= set(values_of(argv, "-e"))
    # Its model is a GGUF path: llama-server reads it, nothing is fetched for it.
    assert not any(step.name == "download-models" for node in plan.nodes for step in node.steps)


@pytest.mark.parametrize(("args", "found"), [
    (["--speculative-config", '{"method": "eagle3", "model": "org/drafter", "revision": "abc"}'], [("org/drafter", "abc")]),
    (["--speculative_config={\"model\": \"org/drafter\"}"], [("org/drafter", None)]),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'], []),
    (["--speculative-config", '{"model": "/models/drafter"}'], []),
    (["--speculative-draft-model-path", "org/eagle", "--speculative-draft-model-revision", "v2"], [("org/eagle", "v2")]),
    (["--speculative-draft-model-path", "/local/eagle"], []),
])
def test_drafters_are_found_inside_json_and_flag_arguments(args, found):
    assert [(model.repo, model.revision) for model in drafters(args)] == found


def test_a_changed_mod_is_a_changed_recipe_with_its_own_run_id(tmp_path):
    folder = tmp_path / "qwen-pre-serve"
    shutil.copytree(FIXTURES / "qwen-pre-serve", folder)
    before = load_recipe(folder)
    mod = next(path for path in (folder / "mods").iterdir() if path.is_file())
    mod.write_text(mod.read_text() + "\n# one more line\n")
    after = load_recipe(folder)
    assert after.digest() != before.digest()
    cluster = get_cluster(CLUSTERS, "ds4")
    assert default_run_id(after, cluster) != default_run_id(before, cluster)
