"""Model distribution for real: `launch up` over the loopback ssh cluster fetches the recipe's
hub repos once, here, and copies them into each node's own Hugging Face cache with rsync over
ssh; a second `up` copies nothing. The same gang has a secret by reference and a pre_serve hook,
so the three reach the ranks together as they would on a real cluster.

The "hub" is a Hugging Face cache folder made here (blobs named by their sha256, snapshots
linking to them, refs naming the commits), read by huggingface_hub's own `snapshot_download`
with HF_HUB_OFFLINE: the download step is the real one, with no network to fetch from.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import sshd as loopback
from sshd import CLUSTER, SWAPLAB, gang_processes, sim_args, surviving
from test_launch_process import (
    GANG_TIMEOUT,
    Collected,
    argv_holding,
    assert_nothing_left,
    files_holding,
)

from swaplab.launch.output import PROGRESS_SECONDS, ProgressLines
from swaplab.launch.plan import make_plan
from swaplab.launch.prepare import image_source, prepare
from swaplab.launch.settings import Target, load_target
from swaplab.launch.spec import Step
from swaplab.launch.supervise import GangFailed

sshd = loopback.sshd
gang = loopback.gang

MODEL, DRAFTER = "tiny-org/tiny-model", "tiny-org/tiny-drafter"

# The rank: reads the model's config through HF_HOME as a server would (refs/main, then the
# snapshot), says whether it got the token (never its value), then becomes the sim.
READING_RANK = """
import os, sys
hub = os.path.join(os.environ["HF_HOME"], "hub", "models--tiny-org--tiny-model")
commit = open(os.path.join(hub, "refs", "main")).read().strip()
config = open(os.path.join(hub, "snapshots", commit, "config.json")).read().strip()
print("rank read config:", config, "from", os.environ["HF_HOME"], flush=True)
print("rank token:", "set" if os.environ.get("HF_TOKEN") else "unset", flush=True)
os.execv(sys.argv[1], sys.argv[1:])
"""


def make_hub_repo(root: Path, repo: str, files: dict[str, bytes], ref: str) -> list[str]:
    """A repo in the Hugging Face cache at `root` (an HF_HOME), as huggingface_hub lays it out;
    returns its blobs' names."""
    folder = root / "hub" / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    (folder / "blobs").mkdir(parents=True)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "refs").mkdir()
    blobs = []
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / digest).write_bytes(data)
        (folder / "snapshots" / commit / name).symlink_to(f"../../blobs/{digest}")
        blobs.append(digest)
    (folder / "refs" / ref).write_text(commit)
    return blobs


def blob_files(node_hub: Path) -> dict[str, tuple[int, int, bytes]]:
    """Each blob under a node's cache: (inode, mtime, content); an rsync that sends a file again
    makes a new inode."""
    return {
        path.name: (path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes())
        for path in sorted(node_hub.glob("hub/models--*/blobs/*"))
    }


def up_scanning_argv(gang, secret: str, tmp_path: Path, name: str) -> tuple[str, list]:
    """`launch up` with the secret in its environment, every process's argv on this machine
    scanned for it while it runs; returns its output and what the scans found."""
    with open(tmp_path / f"{name}.log", "w+") as log:
        up = subprocess.Popen(
            [*SWAPLAB, *gang.arguments("up")], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_TOKEN": secret, **gang.env},
        )
        leaks = []
        deadline = time.monotonic() + GANG_TIMEOUT
        while up.poll() is None and time.monotonic() < deadline:
            leaks += argv_holding(secret)
        code = up.wait(10)
        log.seek(0)
        output = log.read()
    assert code == 0, output
    return output, leaks


def test_up_fetches_once_here_copies_to_each_nodes_cache_and_a_second_up_copies_nothing(gang, tmp_path):
    here = tmp_path / "here-hub"
    model_blobs = make_hub_repo(here, MODEL, {
        "config.json": b'{"architectures": ["TinyForCausalLM"]}\n',
        "model.safetensors": os.urandom(3 << 20),
    }, "main")
    drafter_blobs = make_hub_repo(here, DRAFTER, {"config.json": b'{"drafter": true}\n'}, "v1")
    nodes = {"127.0.0.1": tmp_path / "node-a", "127.0.0.2": tmp_path / "node-b"}
    # Fetched here, once; each loopback "node" keeps its own cache folder ([hosts.NAME]).
    text = gang.clusters.read_text().replace(
        f"[clusters.{CLUSTER}]\n", f'[clusters.{CLUSTER}]\ndownload = "here"\ndownload_dir = "{here}"\n'
    )
    text += "".join(f'\n[hosts."{address}"]\nhf_cache_dir = "{folder}"\n' for address, folder in nodes.items())
    gang.clusters.write_text(text)
    path = gang.recipe([psutil.Process().exe(), "-c", READING_RANK, *sim_args()], model=MODEL, ready=["listening on"])
    recipe = path.read_text().replace("[readiness]", f'extra_models = ["{DRAFTER}@v1"]\n\n[readiness]')
    path.write_text(recipe + """
[env]
HF_HUB_OFFLINE = "1"
HF_TOKEN = "${env.HF_TOKEN}"

[[pre_serve]]
run = 'echo "hub on rank {rank}: $(ls "$HF_HOME/hub" | tr "\\n" " ")"'
""")
    unique = f"hf_{os.urandom(12).hex()}"

    plan = gang.launch("plan")
    assert plan.returncode == 0, plan.stderr
    assert f"{DRAFTER}@v1" in plan.stdout  # the download step's argument, revision pinned
    assert "on this machine, into 127.0.0.2" in plan.stdout

    first, leaks = up_scanning_argv(gang, unique, tmp_path, "first-up")
    assert not leaks, leaks
    assert unique not in first
    # The one download, here: huggingface_hub resolved both repos in this machine's cache.
    assert "download-models (here)" in first
    assert f"[local] {here}/hub/models--tiny-org--tiny-drafter/snapshots/" in first
    # Each node got every blob, named as it was copied, and the links and refs that point at them.
    for rank, (address, folder) in enumerate(nodes.items()):
        for blob in model_blobs:
            assert f"[rank {rank} copy {MODEL}] {blob}" in first
        for blob in drafter_blobs:
            assert f"[rank {rank} copy {DRAFTER}] {blob}" in first
        for repo in (MODEL, DRAFTER):
            source = here / "hub" / f"models--{repo.replace('/', '--')}"
            copy = folder / "hub" / f"models--{repo.replace('/', '--')}"
            assert sorted(p.name for p in (copy / "blobs").iterdir()) == sorted(p.name for p in (source / "blobs").iterdir())
            for link in (source / "snapshots").rglob("*"):
                if link.is_symlink():
                    mirrored = copy / link.relative_to(source)
                    assert mirrored.is_symlink() and mirrored.read_bytes() == link.read_bytes()
            assert sorted(p.name for p in (copy / "refs").iterdir()) == sorted(p.name for p in (source / "refs").iterdir())
    copied = {address: blob_files(folder) for address, folder in nodes.items()}
    assert all(len(files) == 3 for files in copied.values())

    # Each rank read the model through its own node's copy, got the token, and ran the hook.
    logs = gang.launch("logs")
    assert logs.returncode == 0, logs.stderr
    for rank, folder in enumerate(nodes.values()):
        assert f'[rank {rank}] rank read config: {{"architectures": ["TinyForCausalLM"]}} from {folder}' in logs.stdout
        assert f"[rank {rank}] rank token: set" in logs.stdout
        assert f"[rank {rank}] [pre_serve 1] hub on rank {rank}: models--tiny-org--tiny-drafter models--tiny-org--tiny-model" in logs.stdout
    assert unique not in logs.stdout + logs.stderr
    assert not files_holding(gang.state_home, unique)
    assert gang.launch("down").returncode == 0
    assert_nothing_left(gang)

    # Again: everything is there already, so nothing is sent (the files are the very same ones).
    second, leaks = up_scanning_argv(gang, unique, tmp_path, "second-up")
    assert not leaks and unique not in second
    copy_lines = [line for line in second.splitlines() if line.startswith(("[rank 0 copy", "[rank 1 copy"))]
    assert copy_lines, second
    for blob in model_blobs + drafter_blobs:
        assert blob not in second
    assert {address: blob_files(folder) for address, folder in nodes.items()} == copied
    assert gang.launch("down").returncode == 0
    assert_nothing_left(gang)
    assert not surviving(gang_processes(gang.slug))



def test_the_head_fetches_and_the_worker_copies_from_it_over_the_fabric(gang, tmp_path):
    # download = "head", the default: the head resolves the repo in its own cache (offline: the
    # cache already holds what a download would have fetched), then the worker pulls it from the
    # head's fabric address with rsync over ssh, run on the worker.
    nodes = {"127.0.0.1": tmp_path / "node-a", "127.0.0.2": tmp_path / "node-b"}
    blobs = make_hub_repo(nodes["127.0.0.1"], MODEL, {
        "config.json": b'{"architectures": ["TinyForCausalLM"]}\n',
        "model.safetensors": os.urandom(2 << 20),
    }, "main")
    # The head's Python with huggingface_hub: this test run's (the nodes are this machine).
    text = gang.clusters.read_text().replace(f"[clusters.{CLUSTER}]\n", f'[clusters.{CLUSTER}]\npython = "{sys.executable}"\n')
    gang.clusters.write_text(text + "".join(
        f'\n[hosts."{address}"]\nhf_cache_dir = "{folder}"\n' for address, folder in nodes.items()
    ))
    path = gang.recipe([psutil.Process().exe(), "-c", READING_RANK, *sim_args()], model=MODEL, ready=["listening on"])
    path.write_text(path.read_text() + '\n[env]\nHF_HUB_OFFLINE = "1"\n')

    up = gang.launch("up")
    assert up.returncode == 0, up.stderr
    first = up.stdout + up.stderr
    assert "download-models on 127.0.0.1: env HF_HOME=" in first
    assert f"[rank 0 download-models] {nodes['127.0.0.1']}/hub/models--tiny-org--tiny-model/snapshots/" in first
    assert f"copy {MODEL} on 127.0.0.2: rsync" in first and f"127.0.0.1:{nodes['127.0.0.1']}/hub/" in first
    for blob in blobs:
        assert f"[rank 1 copy {MODEL}] {blob}" in first
        assert f"[rank 0 copy {MODEL}] {blob}" not in first  # the head has it: nothing copies to it
    copied = blob_files(nodes["127.0.0.2"])
    assert {name: content for name, (_, _, content) in copied.items()} == {
        name: content for name, (_, _, content) in blob_files(nodes["127.0.0.1"]).items()
    }
    logs = gang.launch("logs")
    assert f'[rank 1] rank read config: {{"architectures": ["TinyForCausalLM"]}} from {nodes["127.0.0.2"]}' in logs.stdout
    assert gang.launch("down").returncode == 0

    up = gang.launch("up")
    assert up.returncode == 0, up.stderr
    second = up.stdout + up.stderr
    assert f"[rank 1 copy {MODEL}]" in second  # it ran, and sent nothing
    assert not any(blob in second for blob in blobs)
    assert blob_files(nodes["127.0.0.2"]) == copied
    assert gang.launch("down").returncode == 0
    assert_nothing_left(gang)


PRINTING_RANK = """
import os, sys
print("rank env:", os.environ["HF_HOME"], os.environ["WHERE"], flush=True)
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_a_process_ranks_env_starting_with_home_is_its_nodes_home(gang):
    # The default cache, ~/.cache/huggingface, reaches a process rank as a real path, as ~/ in a command does.
    path = gang.recipe([psutil.Process().exe(), "-c", PRINTING_RANK, *sim_args()], ready=["listening on"])
    path.write_text(path.read_text() + '\n[env]\nHF_HOME = "~/.cache/huggingface"\nWHERE = "~/elsewhere"\n')
    up = gang.launch("up")
    assert up.returncode == 0, up.stderr
    logs = gang.launch("logs").stdout
    for rank in (0, 1):
        assert f"[rank {rank}] rank env: {Path.home()}/.cache/huggingface {Path.home()}/elsewhere" in logs, logs
    assert gang.launch("down").returncode == 0
    assert_nothing_left(gang)

# --- a worker's copy waits for the head's download; a failure stops every node ----------------


def steps_plan(gang, head: list[Step], worker: list[Step]):
    gang.recipe(sim_args())
    recipe, cluster = load_target(Target(recipe=gang.recipe_path, cluster=CLUSTER, clusters=gang.clusters))
    plan = make_plan(recipe, cluster, run_id="steps")
    return replace(plan, nodes=(replace(plan.nodes[0], steps=tuple(head)), replace(plan.nodes[1], steps=tuple(worker))))


def shell(name: str, script: str, *arguments: str, after_head: str | None = None) -> Step:
    return Step(name, ("sh", "-c", script, "sh", *arguments), "prepare", after_head=after_head)


def test_a_workers_step_after_the_head_starts_only_once_the_heads_step_is_done(gang, tmp_path):
    # The head cannot fetch before the worker's first step ran; the worker's second step needs
    # what the head fetched. Without the wait it runs at once, while the head still looks for the
    # worker's file (it looks twice a second: the wait is what the test proves, not this pace).
    hello, fetched = tmp_path / "worker-said-hello", tmp_path / "head-fetched"
    plan = steps_plan(gang, head=[
        shell("wait-for-worker", 'while [ ! -e "$1" ]; do sleep 0.5; done', str(hello)),
        shell("download-models", 'echo fetched > "$1"', str(fetched)),
    ], worker=[
        shell("hello", 'touch "$1"', str(hello)),
        shell("copy", 'cat "$1"', str(fetched), after_head="download-models"),
    ])
    observer = Collected()
    asyncio.run(prepare(plan, observer))
    assert "[rank 1 copy] fetched" in observer.lines, observer.lines


@pytest.mark.timeout(120)
def test_a_failing_head_step_ends_the_workers_waiting_steps_and_up_reports_it(gang, tmp_path):
    plan = steps_plan(gang, head=[
        shell("download-models", 'echo "no such repo" >&2; exit 3'),
    ], worker=[
        shell("copy", "echo copied", after_head="download-models"),
    ])
    observer = Collected()
    with pytest.raises(GangFailed) as failure:
        asyncio.run(prepare(plan, observer))
    assert "download-models failed on 127.0.0.1 with code 3" in str(failure.value)
    assert "no such repo" in str(failure.value)
    assert not any("copied" in line for line in observer.lines)


# --- progress lines ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_updates_are_thinned_out_but_lines_and_the_last_update_always_show():
    shown: list[str] = []
    clock = Clock()
    lines = ProgressLines(shown.append, clock=clock)
    lines.feed(b"blobs/a\n  10%\r  20%\r")
    clock.now += PROGRESS_SECONDS / 2
    lines.feed(b"  30%\r")
    clock.now += PROGRESS_SECONDS
    lines.feed(b"  40%\r  50%\r")
    # "\r\n" cut between two reads is a line end, not an update.
    lines.feed(b"blobs/b\r")
    lines.feed(b"\nsent 10 bytes\n  90%\r")
    lines.close()
    # (an update is read once the next byte shows it was not half of "\r\n": 30%, not 40%)
    assert shown == ["blobs/a", "10%", "30%", "blobs/b", "sent 10 bytes", "90%"]


# --- doctor: what the copies need ------------------------------------------------------------


def test_doctor_checks_what_copying_the_models_needs(gang, tmp_path):
    nodes = {"127.0.0.1": tmp_path / "node-a", "127.0.0.2": tmp_path / "node-b"}
    # download = "head" (the default), each node its own cache: the worker copies from the head.
    # First with a head Python that does not exist: the one failure, with its fix.
    original = gang.clusters.read_text()
    header = f"[clusters.{CLUSTER}]\n"
    hosts = "".join(f'\n[hosts."{address}"]\nhf_cache_dir = "{folder}"\n' for address, folder in nodes.items())
    gang.clusters.write_text(original.replace(header, header + f'python = "{tmp_path}/no-python"\n') + hosts)
    gang.recipe(sim_args(), model=MODEL)
    doctor = gang.launch("doctor")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    failed = [line for line in doctor.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and f"{tmp_path}/no-python cannot import huggingface_hub" in failed[0], doctor.stdout
    assert "set python in the clusters file to a Python that has it" in doctor.stdout
    gang.clusters.write_text(original.replace(header, header + f'python = "{sys.executable}"\n') + hosts)
    doctor = gang.launch("doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    assert any("127.0.0.2" in line and "reaches the head at 127.0.0.1 over ssh" in line for line in lines), doctor.stdout
    assert sum("rsync /usr/bin/rsync" in line for line in lines) == 2, doctor.stdout
    assert any("127.0.0.2" in line and "not in its cache yet (`up` copies it from the head)" in line for line in lines), doctor.stdout
    assert f"{sys.executable} has huggingface_hub (the download runs there)" in doctor.stdout

    # Here instead: huggingface_hub is needed on this machine, and every node receives.
    text = gang.clusters.read_text().replace(f"[clusters.{CLUSTER}]\n", f'[clusters.{CLUSTER}]\ndownload = "here"\n')
    gang.clusters.write_text(text)
    doctor = gang.launch("doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "huggingface_hub here" in doctor.stdout
    assert "reaches the head" not in doctor.stdout
    assert doctor.stdout.count("(`up` sends it from here)") == 2, doctor.stdout


# --- the image: from here, from the head, or from the registry ---------------------------------


@pytest.mark.parametrize(("here", "there", "head", "built", "source"), [
    ("sha256:a", "sha256:a", None, False, "none"),        # the node has this machine's image
    ("sha256:a", "sha256:b", None, False, "here"),        # a stale copy is replaced from here
    ("sha256:a", None, None, True, "here"),               # a built overlay goes out from here
    (None, None, None, True, "missing"),                  # ...and never from anywhere else
    (None, "sha256:h", "sha256:h", False, "none"),        # a worker with the head's image
    (None, "sha256:b", "sha256:h", False, "head"),        # a worker with another: the head's, over the fabric
    (None, None, "sha256:h", False, "head"),
    (None, "sha256:h", None, False, "none"),              # the head itself, which has it
    (None, None, None, False, "registry"),                # nobody has it: pulled
])
def test_each_node_takes_the_image_from_the_nearest_place_that_has_it(here, there, head, built, source):
    assert image_source(here=here, there=there, head=head, built=built)[0] == source
