"""A router entry backed by a launcher gang: `cmd` is `swaplab launch up --foreground`, `cmdStop`
is `swaplab launch down`, and the two-node loopback gang swaps in and out like a local model."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import sshd as loopback
from procs import SIM, alive, wait_until
from sshd import LoopGang, gang_processes, rank_processes, sim_args, surviving

# The fixtures: the session's OpenSSH server, and one test's gang on its two loopback nodes.
sshd = loopback.sshd
gang = loopback.gang


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def chat(router, model: str) -> tuple[int, dict]:
    return post(f"{router.url}/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}]})


def running(router) -> dict[str, dict]:
    with urllib.request.urlopen(f"{router.url}/running", timeout=30) as response:
        return {entry["model"]: entry for entry in json.load(response)["running"]}


def runs_of(gang: LoopGang) -> list[dict]:
    folder = gang.state_home / "swaplab" / "launch" / gang.slug
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*/run.json"))]


def test_a_gang_entry_swaps_in_and_out_like_a_local_model(router_factory, gang):
    gang.recipe(sim_args())
    router = router_factory(f"""
healthCheckTimeout: 240
models:
  gang:
    cmd: {gang.command("up", "--foreground")}
    cmdStop: {gang.command("down")}
    proxy: {gang.url()}
    unloadTimeout: 60
  local:
    cmd: {SIM} --port ${{PORT}} --model local
""")
    status, body = chat(router, "gang")
    assert status == 200, body
    assert running(router)["gang"]["state"] == "ready"
    supervisor = running(router)["gang"]["pid"]
    # The router's readiness is the head's /health: a sim head answers before rank 1 is up.
    wait_until(lambda: [run["outcome"] for run in runs_of(gang)] == ["ready"], 120, "the gang to be ready")
    assert set(rank_processes(gang.slug)) == {"0", "1"}

    # The local model takes the gang's place: cmdStop (`down`) stopped every rank, and the
    # supervising `up --foreground` ended as a requested stop, not a failure.
    status, body = chat(router, "local")
    assert status == 200, body
    assert set(running(router)) == {"local"}
    assert not alive(supervisor)
    assert not surviving(gang_processes(gang.slug))
    (first,) = runs_of(gang)
    assert first["outcome"] == "stopped" and "swaplab launch down" in first["cause"], first

    # And back: a fresh gang, a new run.
    status, body = chat(router, "gang")
    assert status == 200, body
    assert set(running(router)) == {"gang"}
    wait_until(lambda: len(runs_of(gang)) == 2 and runs_of(gang)[1]["outcome"] == "ready", 60, "the second run to be ready")

    status, body = post(f"{router.url}/unload", {})
    assert status == 200 and body == {"unloaded": ["gang"]}
    assert not surviving(gang_processes(gang.slug))


