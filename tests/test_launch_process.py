"""`swaplab launch` for real: engine = "process" over real SSH to two loopback nodes.

The nodes are 127.0.0.1 and 127.0.0.2, both served by a real OpenSSH server (tests/sshd.py);
the ranks are `swaplab sim` processes (or small Python programs) started through it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import psutil
import sshd as loopback
from procs import SwaplabProcess, alive, http_status, wait_until
from sshd import (
    CLUSTER,
    SWAPLAB,
    gang_processes,
    node_state,
    rank_processes,
    sim_args,
    surviving,
)

from swaplab.launch.output import Observer
from swaplab.launch.plan import make_plan
from swaplab.launch.prepare import prepare
from swaplab.launch.settings import Target, load_target
from swaplab.launch.spec import Step

# The fixtures: the session's OpenSSH server, and one test's gang on its two loopback nodes.
sshd = loopback.sshd
gang = loopback.gang

GANG_TIMEOUT = 240.0


def assert_nothing_left(gang) -> None:
    left = surviving(gang_processes(gang.slug))
    assert not left, f"gang processes still running on the nodes: {[(p.pid, p.cmdline()) for p in left]}"
    for address in ("127.0.0.1", "127.0.0.2"):
        assert http_status(f"{gang.url(address)}/health") is None


@contextmanager
def foreground_up(gang, tmp_path):
    """`launch up --foreground` as a router would run it, once it says ready and both ranks run; closed after."""
    supervisor = SwaplabProcess(gang.arguments("up", "--foreground"), tmp_path / "up.log", env=gang.env)
    try:
        wait_until(lambda: "ready: " in supervisor.output() or supervisor.popen.poll() is not None, GANG_TIMEOUT, "up to be ready")
        assert supervisor.popen.poll() is None, supervisor.output()
        wait_until(lambda: set(rank_processes(gang.slug)) == {"0", "1"}, 60, "both ranks to run")
        yield supervisor
    finally:
        supervisor.close()




VLLM_STARTUP = Path(__file__).parent / "fixtures" / "startup" / "vllm.log"


def test_up_reaches_ready_logs_merge_both_ranks_and_down_leaves_nothing(gang):
    # Each rank prints vLLM's real startup lines first: `up` says every rank's stage as it moves.
    gang.recipe(sim_args("--load-seconds", "1", "--startup-log", str(VLLM_STARTUP), "--startup-seconds", "1"),
                ready=["listening on"])
    up = gang.launch("up")
    assert up.returncode == 0, up.stderr
    assert f"ready: {gang.url()}" in up.stderr
    # (until the head is ready: then `up` is done, whatever a worker still prints)
    for rank in ("rank 0", "rank 1"):
        said = [line for line in up.stderr.splitlines() if f"{rank} on " in line]
        assert any(line.endswith(": loading weights 0%") for line in said), said
    head = [line.split(": ", 2)[-1] for line in up.stderr.splitlines() if "rank 0 on " in line and "starting" not in line]
    assert head[:3] == ["loading weights 0%", "loading weights 33%", "loading weights 67%"], head
    assert head.index("compiling") < head.index("capturing CUDA graphs 34%") < head.index("capturing CUDA graphs 100%"), head
    assert "the head answered a one-token completion" in up.stderr
    # Both ranks serve on their own node address (the {fabric_ip} placeholder), same port.
    # (readiness is the head's: a worker may still be loading, as the sim's rank 1 may be here.)
    assert http_status(f"{gang.url('127.0.0.1')}/v1/models") == 200
    wait_until(lambda: http_status(f"{gang.url('127.0.0.2')}/v1/models") == 200, 60, "rank 1 to serve")

    logs = gang.launch("logs")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert f"[rank 0] sim: model sim-model listening on http://127.0.0.1:{gang.port}" in lines
    assert f"[rank 1] sim: model sim-model listening on http://127.0.0.2:{gang.port}" in lines
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in lines), lines
    only_one = gang.launch("logs", "--rank", "1")
    assert only_one.stdout.splitlines() and all(line.startswith("[rank 1] ") for line in only_one.stdout.splitlines())

    status = gang.launch("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "rank 0  127.0.0.1  running" in status.stdout and "rank 1  127.0.0.2  running" in status.stdout
    assert "serving" in status.stdout

    # A second `up` beside a live gang is refused, and leaves it running.
    again = gang.launch("up")
    assert again.returncode == 2 and "already runs on" in again.stderr and "launch down" in again.stderr
    assert http_status(f"{gang.url()}/v1/models") == 200

    down = gang.launch("down")
    assert down.returncode == 0, down.stderr
    assert_nothing_left(gang)
    status = gang.launch("status")
    assert status.returncode == 1 and "rank 0  127.0.0.1  not running" in status.stdout

    # The logs stay readable here after the gang is gone.
    kept = gang.launch("logs")
    assert f"[rank 1] sim: model sim-model listening on http://127.0.0.2:{gang.port}" in kept.stdout.splitlines()


def test_killing_one_rank_stops_the_gang_and_foreground_up_exits_nonzero(gang, tmp_path):
    gang.recipe(sim_args())
    with foreground_up(gang, tmp_path) as supervisor:
        wait_until(lambda: http_status(f"{gang.url('127.0.0.2')}/v1/models") == 200, 60, "rank 1 to serve")
        ranks = rank_processes(gang.slug)
        ranks["1"].send_signal(signal.SIGKILL)
        code = supervisor.wait(GANG_TIMEOUT)
        output = supervisor.output()
    assert code == 1, output
    assert "the gang failed: rank 1 on 127.0.0.2 exited with code 137" in output
    assert f"sim: model sim-model listening on http://127.0.0.2:{gang.port}" in output.split("the gang failed:")[1]
    assert not alive(ranks["0"].pid)
    assert_nothing_left(gang)


FATAL_RANK = """
import os, sys, time
print("rank", os.environ["SWAPLAB_RANK"], "of", os.environ["SWAPLAB_NNODES"], "loading", flush=True)
if os.environ["SWAPLAB_RANK"] == "1":
    print("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue", flush=True)
time.sleep(3600)  # up and never ready: only the fatal marker can end this gang
"""


def test_a_fatal_marker_on_any_rank_fails_fast_with_its_last_lines(gang):
    # Never ready and a readiness timeout longer than the test's own: only the marker can end `up` in time.
    gang.recipe([psutil.Process().exe(), "-c", FATAL_RANK], ready=["never printed"], fatal=["EngineDeadError"], timeout=3600)
    up = gang.launch("up", timeout=GANG_TIMEOUT)
    assert up.returncode == 1, up.stderr
    assert "rank 1 on 127.0.0.2 printed the fatal marker 'EngineDeadError'" in up.stderr
    assert "EngineCore encountered an issue" in up.stderr.split("fatal marker")[1]
    assert "[rank 0] rank 0 of 2 loading" in up.stdout
    assert_nothing_left(gang)


def test_doctor_checks_the_model_file_on_every_node(gang, tmp_path):
    weights = tmp_path / "weights.gguf"
    weights.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    gang.recipe(sim_args(), model=str(weights))
    present = gang.launch("doctor")
    assert present.returncode == 0, present.stdout + present.stderr
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
    for address in ("127.0.0.1", "127.0.0.2"):
        assert f"ok    {address}" in present.stdout
    assert present.stdout.count(f"sha256 {digest}") == 2
    assert f"port {gang.port} free" in present.stdout

    weights.unlink()
    missing = gang.launch("doctor")
    assert missing.returncode == 1
    assert f"FAIL  127.0.0.2        model    {weights}: missing at {weights}" in missing.stdout
    assert f"fix: copy the model to {weights} on 127.0.0.2" in missing.stdout


def test_doctor_reports_an_unreachable_node_with_a_hint(gang, tmp_path, sshd):
    gang.recipe(sim_args())
    text = gang.clusters.read_text().replace(f"ssh_port = {sshd.port}", "ssh_port = 1", 1)
    gang.clusters.write_text(text)
    result = gang.launch("doctor")
    assert result.returncode == 1
    assert "FAIL  127.0.0.1        ssh      cannot reach 127.0.0.1 over ssh" in result.stdout
    assert "fix: make `ssh 127.0.0.1 true` work without a prompt" in result.stdout


def test_a_signal_to_foreground_up_stops_the_whole_gang(gang, tmp_path):
    # What a router without cmdStop does to a model's process: SIGTERM, and it must leave nothing.
    gang.recipe(sim_args())
    with foreground_up(gang, tmp_path) as supervisor:
        supervisor.popen.send_signal(signal.SIGTERM)
        code = supervisor.wait(GANG_TIMEOUT)
        output = supervisor.output()
    assert code == 0, output
    assert_nothing_left(gang)


def test_a_gang_whose_supervisor_was_killed_is_cleaned_up_by_the_next_up(gang, tmp_path):
    # SIGKILL can't be caught: the detached ranks outlive their supervisor, and the next `up`
    # (what a router does when the model is asked for again) must stop them before starting anew.
    gang.recipe(sim_args())
    with foreground_up(gang, tmp_path) as supervisor:
        orphans = {rank: process.pid for rank, process in rank_processes(gang.slug).items()}
        supervisor.popen.send_signal(signal.SIGKILL)
        supervisor.wait(GANG_TIMEOUT)
    up = gang.launch("up", timeout=GANG_TIMEOUT)
    assert up.returncode == 0, up.stderr
    assert not any(alive(pid) for pid in orphans.values())
    fresh = {rank: process.pid for rank, process in rank_processes(gang.slug).items()}
    assert set(fresh) == {"0", "1"} and not set(fresh.values()) & set(orphans.values())
    assert gang.launch("down").returncode == 0
    assert_nothing_left(gang)


# Writes what the rank got as HF_TOKEN to $1-RANK, then becomes the sim ($2...).
SECRET_RANK = """
import os, sys
with open(f"{sys.argv[1]}-{os.environ['SWAPLAB_RANK']}", "w") as seen:
    seen.write(os.environ.get("HF_TOKEN", "<unset>"))
os.execv(sys.argv[2], sys.argv[2:])
"""


def secret_recipe(gang, seen: Path) -> Path:
    path = gang.recipe([psutil.Process().exe(), "-c", SECRET_RANK, str(seen), *sim_args()], ready=["listening on"])
    with path.open("a") as recipe:
        recipe.write('\n[env]\nHF_TOKEN = "${env.HF_TOKEN}"\n')
    return path


def argv_holding(secret: str) -> list[tuple[int, list[str]]]:
    """Every process on this machine (both nodes, ssh on either side) whose argv holds `secret`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(secret in word for word in cmdline):
            found.append((process.pid, cmdline))
    return found


def files_holding(folder: Path, secret: str) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and secret.encode() in path.read_bytes()]


def test_a_secret_by_reference_reaches_every_rank_and_nothing_else(gang, tmp_path, monkeypatch):
    # Shell-special characters too: it must arrive byte for byte, through no shell's parsing.
    # Every scan looks for its unique part, which survives any quoting of the whole.
    unique = f"hf_{os.urandom(12).hex()}"
    secret = f"{unique} $'\"`x"
    monkeypatch.setenv("HF_TOKEN", secret)
    seen = tmp_path / "seen"
    secret_recipe(gang, seen)

    plan = gang.launch("plan")
    assert plan.returncode == 0, plan.stderr
    assert "HF_TOKEN=${env.HF_TOKEN}" in plan.stdout and unique not in plan.stdout + plan.stderr

    # `up`, with every process's argv on the machine scanned while it starts the gang and once it is up.
    with open(tmp_path / "up.log", "w+") as log:
        up = subprocess.Popen(
            [*SWAPLAB, *gang.arguments("up")], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **gang.env},
        )
        leaks, scans = [], 0
        deadline = time.monotonic() + GANG_TIMEOUT
        while up.poll() is None and time.monotonic() < deadline:
            leaks += argv_holding(unique)
            scans += 1
        assert up.wait(10) == 0, log.read()
        log.seek(0)
        output = log.read()
    assert scans > 10 and not leaks, leaks
    assert "ready: " in output and unique not in output

    # Each rank (the server itself) got the value in its environment.
    assert {rank: Path(f"{seen}-{rank}").read_text() for rank in ("0", "1")} == {"0": secret, "1": secret}
    ranks = rank_processes(gang.slug)
    assert set(ranks) == {"0", "1"} and all(process.environ().get("HF_TOKEN") == secret for process in ranks.values())
    assert not argv_holding(unique)
    # No file on the nodes keeps it (the env file is gone once the rank started), nor any state or log here.
    assert not list(node_state(gang.slug).rglob("secrets.env"))
    assert not files_holding(node_state(gang.slug), unique)
    assert not files_holding(gang.state_home, unique)

    logs = gang.launch("logs")
    assert logs.returncode == 0 and "listening on" in logs.stdout
    assert unique not in logs.stdout + logs.stderr
    status = gang.launch("status")
    assert status.returncode == 0 and unique not in status.stdout + status.stderr
    assert gang.launch("down").returncode == 0
    assert_nothing_left(gang)
    assert not files_holding(gang.state_home, unique)


def test_a_missing_secret_variable_fails_up_before_anything_starts(gang, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    path = secret_recipe(gang, tmp_path / "seen")
    line = next(number for number, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("HF_TOKEN"))
    up = gang.launch("up")
    assert up.returncode == 2, up.stderr
    assert f"{path}:{line}: [env] HF_TOKEN reads ${{env.HF_TOKEN}}, but HF_TOKEN is not set" in up.stderr
    assert not gang_processes(gang.slug)
    assert not node_state(gang.slug).exists()
    assert not list(gang.state_home.rglob("run.json")), "no run was created"


SHOW_SECRET = "import os; print('got', os.environ['HF_TOKEN'] == open(os.environ['SWAPLAB_EXPECTED']).read())"


class Collected(Observer):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)

    def output(self, line: str) -> None:
        self.lines.append(line)


def test_a_prepare_step_that_names_a_secret_gets_it_in_its_environment_only(gang, tmp_path):
    # What the download-models step of a container engine relies on (`docker run -e HF_TOKEN`
    # copies it from the docker client's environment): here the step is a program on each node.
    unique = f"hf_{os.urandom(12).hex()}"
    secret = f"{unique} $'\"`x"
    expected = tmp_path / "expected"
    expected.write_text(secret)
    recipe, cluster = load_target(Target(recipe=secret_recipe(gang, tmp_path / "seen"), cluster=CLUSTER, clusters=gang.clusters))
    plan = make_plan(recipe, cluster, run_id="secret-prepare")
    # sshd gives each session a fresh environment: where to find the expected value travels the same way.
    step = Step("show", (psutil.Process().exe(), "-c", SHOW_SECRET), "prepare", secrets=("HF_TOKEN", "SWAPLAB_EXPECTED"))
    plan = replace(plan, nodes=tuple(replace(node, steps=(step,)) for node in plan.nodes))
    observer = Collected()
    asyncio.run(prepare(plan, observer, {"HF_TOKEN": secret, "SWAPLAB_EXPECTED": str(expected)}))
    assert observer.lines.count("[rank 0 show] got True") == 1 and observer.lines.count("[rank 1 show] got True") == 1, observer.lines
    assert not any(unique in line for line in observer.lines)


# --- [[pre_serve]] hooks ---------------------------------------------------------------------

# The server reads what the hook wrote and what was copied, then becomes the sim: it starts
# only after both are in place, or it fails (and `up` with it).
READING_RANK = """
import os, sys
folder, rank = sys.argv[1], os.environ["SWAPLAB_RANK"]
print("server read:", open(os.path.join(folder, "hook-" + rank + ".txt")).read().strip(), flush=True)
print("server read copy:", open(os.path.join(folder, "copied-" + rank + ".txt")).read().strip(), flush=True)
os.execv(sys.argv[2], sys.argv[2:])
"""


def hooked_recipe(gang, folder: Path, hooks: str) -> Path:
    folder.mkdir()
    path = gang.recipe([psutil.Process().exe(), "-c", READING_RANK, str(folder), *sim_args()], ready=["listening on"])
    (path.parent / "mod.txt").write_text("the mod's content\n")
    with path.open("a") as recipe:
        recipe.write(hooks)
    return path


def test_pre_serve_hooks_copy_then_run_before_the_server_and_show_in_the_logs(gang, tmp_path):
    folder = tmp_path / "ranks"
    hooked_recipe(gang, folder, f"""
[[pre_serve]]
copy = [{{ from = "mod.txt", to = "{folder}/copied-{{rank}}.txt" }}]
run = "echo hook on rank {{rank}}; echo written by the hook of rank {{rank}} > {folder}/hook-{{rank}}.txt"

[[pre_serve]]
run = ["echo", "second hook", "as argv"]
""")
    up = gang.launch("up")
    assert up.returncode == 0, up.stderr
    for rank in (0, 1):
        assert (folder / f"copied-{rank}.txt").read_text() == "the mod's content\n"
    logs = gang.launch("logs")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        expected = [
            f"[rank {rank}] [pre_serve 1] hook on rank {rank}",
            f"[rank {rank}] [pre_serve 2] second hook as argv",
            f"[rank {rank}] server read: written by the hook of rank {rank}",
            f"[rank {rank}] server read copy: the mod's content",
        ]
        assert mine[:4] == expected, mine
    assert gang.launch("down").returncode == 0
    assert_nothing_left(gang)


def test_a_failing_pre_serve_hook_stops_up_with_its_output_and_names_the_hook(gang, tmp_path):
    path = hooked_recipe(gang, tmp_path / "ranks", """
[[pre_serve]]
run = "echo about to fail on rank {rank}; exit 3"
""")
    line = next(number for number, text in enumerate(path.read_text().splitlines(), 1) if text == "[[pre_serve]]")
    up = gang.launch("up", timeout=GANG_TIMEOUT)
    assert up.returncode == 1, up.stderr
    failure = up.stderr.split("the gang failed:")[1]
    assert "exited with code 3" in failure
    assert f"pre_serve hook 1 (recipe.toml line {line}) exited with code 3; the server was not started" in failure
    assert "[pre_serve 1] about to fail on rank" in failure
    assert "] server read" not in up.stdout + up.stderr, "the server never started"
    assert_nothing_left(gang)
