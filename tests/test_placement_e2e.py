"""Device-aware placement end to end: a real router, real `swaplab sim` backends, fake devices."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from procs import PYTHON, SIM, alive, eventually
from routerclient import chat, running
from swaplab.config.loader import load_config_text
from swaplab.errors import BackendStartError
from swaplab.fleet import Fleet, LogHub
from swaplab.fleet.devices import DeviceReading

FAKE_DEVICES = """
healthCheckTimeout: 30
devices:
  0: {name: fake0, vramGiB: 16}
  1: {name: fake1, vramGiB: 16}
"""


def sim(model: str, extra: str = "") -> str:
    return f"{SIM} --port ${{PORT}} --model {model} {extra}"


async def running_and_devices(session: aiohttp.ClientSession, url: str) -> tuple[dict[str, dict], dict[int, dict]]:
    async with session.get(f"{url}/running") as response:
        body = await response.json()
    return (
        {entry["model"]: entry for entry in body["running"]},
        {entry["id"]: entry for entry in body.get("devices", [])},
    )


async def test_single_device_models_share_the_box_and_a_two_device_model_evicts_both(router_factory):
    router = router_factory(f"""{FAKE_DEVICES}
models:
  a: {{cmd: "{sim('a')}", devices: [0]}}
  b: {{cmd: "{sim('b')}", devices: [1]}}
  tp2: {{cmd: "{sim('tp2')}", devices: [0, 1]}}
""")
    async with aiohttp.ClientSession() as session:
        for model in ("a", "b"):
            status, body = await chat(session, router.url, model, max_tokens=2)
            assert status == 200, body
        state, devices = await running_and_devices(session, router.url)
        assert {m: e["state"] for m, e in state.items()} == {"a": "ready", "b": "ready"}  # co-resident
        assert state["a"]["devices"] == {"0": 16.0} and state["b"]["devices"] == {"1": 16.0}
        assert devices[0]["models"] == {"a": 16.0} and devices[1]["models"] == {"b": 16.0}
        assert devices[0]["name"] == "fake0" and devices[0]["vram_gib"] == 16.0
        pids = [state["a"]["pid"], state["b"]["pid"]]

        status, body = await chat(session, router.url, "tp2", max_tokens=2)
        assert status == 200, body
        state, devices = await running_and_devices(session, router.url)
        assert {m: e["state"] for m, e in state.items()} == {"tp2": "ready"}
        assert not alive(pids[0]) and not alive(pids[1])
        assert devices[0]["models"] == {"tp2": 16.0} and devices[1]["claimed_gib"] == 16.0


async def test_claims_share_a_device_and_only_the_least_recently_used_goes(router_factory):
    router = router_factory(f"""{FAKE_DEVICES}
models:
  h1: {{cmd: "{sim('h1')}", devices: [0], vramGiB: 8}}
  h2: {{cmd: "{sim('h2')}", devices: [0], vramGiB: 8}}
  h3: {{cmd: "{sim('h3')}", devices: [0], vramGiB: 8}}
""")
    async with aiohttp.ClientSession() as session:
        for model in ("h2", "h1", "h2"):  # h1 is now the least recently used
            status, body = await chat(session, router.url, model, max_tokens=2)
            assert status == 200, body
        state, _ = await running_and_devices(session, router.url)
        assert {m: e["state"] for m, e in state.items()} == {"h1": "ready", "h2": "ready"}
        h1, h2 = state["h1"]["pid"], state["h2"]["pid"]
        status, body = await chat(session, router.url, "h3", max_tokens=2)
        assert status == 200, body
        state, devices = await running_and_devices(session, router.url)
    assert {m: e["state"] for m, e in state.items()} == {"h2": "ready", "h3": "ready"}
    assert not alive(h1) and state["h2"]["pid"] == h2
    assert devices[0]["claimed_gib"] == 16.0


async def test_a_busy_model_makes_the_newcomer_wait_instead_of_being_killed(router_factory):
    router = router_factory(f"""{FAKE_DEVICES}
models:
  a: {{cmd: "{sim('a', '--tokens-per-second 20')}", devices: [0], vramGiB: 10}}
  c: {{cmd: "{sim('c')}", devices: [0], vramGiB: 10}}
""")
    async with aiohttp.ClientSession() as session:
        body = {"model": "a", "stream": True, "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert (await response.content.readline()).startswith(b"data:")  # a is generating: 2 s of tokens
            a_pid = (await running(session, router.url))["a"]["pid"]
            newcomer = asyncio.ensure_future(chat(session, router.url, "c", max_tokens=2))

            async def c_waits():
                state = await running(session, router.url)
                return state.get("c", {}).get("waiting") and state

            state = await eventually(c_waits, 10, "c to be queued behind a")
            assert state["c"]["state"] == "stopped" and state["c"]["queued"] == 1
            assert state["c"]["waiting"] == "model 'c' waits for 'a' (busy) before it can start"
            assert state["a"]["state"] == "ready" and state["a"]["in_flight"] == 1
            assert not newcomer.done()
            rest = await response.read()
        assert rest.rstrip().endswith(b"data: [DONE]")  # a's stream completed untouched
        status, reply = await newcomer
        assert status == 200, reply
        state = await running(session, router.url)
    assert state["c"]["state"] == "ready" and "a" not in state and not alive(a_pid)


ENV_SCRIPT = """
import os, sys
from aiohttp import web
# Reports the device variables it was started with.
names = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
app = web.Application()
app.router.add_get("/health", lambda r: web.Response(text="ok"))
app.router.add_get("/env", lambda r: web.json_response({n: os.environ.get(n) for n in names}))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def test_cuda_visible_devices_is_the_claim_unless_env_sets_it(router_factory, tmp_path: Path):
    script = tmp_path / "env_server.py"
    script.write_text(ENV_SCRIPT)
    server = f"{PYTHON} {script} ${{PORT}}"
    router = router_factory(f"""{FAKE_DEVICES}
models:
  one: {{cmd: "{server}", devices: [1], vramGiB: 4}}
  pair: {{cmd: "{server}", devices: [1, 0], vramGiB: 4}}
  pinned: {{cmd: "{server}", devices: [0], vramGiB: 4, env: ["CUDA_VISIBLE_DEVICES=7"]}}
""")
    seen = {}
    async with aiohttp.ClientSession() as session:
        for model in ("one", "pair", "pinned"):
            async with session.get(f"{router.url}/upstream/{model}/env") as response:
                assert response.status == 200
                seen[model] = await response.json()
        state = await running(session, router.url)
    assert seen["one"] == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert seen["pair"] == {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert seen["pinned"]["CUDA_VISIBLE_DEVICES"] == "7"
    assert {m for m, e in state.items() if e["state"] == "ready"} == {"one", "pair", "pinned"}  # 12 of 16 GiB


class FixedReadings:
    """NVML as a machine whose device 1 is mostly taken by a process outside the router."""

    def read(self) -> dict[int, DeviceReading]:
        return {
            0: DeviceReading(0, "Fake GPU", total_gib=16.0, used_gib=1.0, free_gib=15.0),
            1: DeviceReading(1, "Fake GPU", total_gib=16.0, used_gib=12.8, free_gib=3.2),
        }

    def close(self) -> None:
        pass


async def test_the_fleet_refuses_a_start_that_free_memory_cannot_hold(tmp_path: Path):
    config = load_config_text(f"""{FAKE_DEVICES}
models:
  fits: {{cmd: "{sim('fits')}", devices: [0], vramGiB: 8.5}}
  crowded: {{cmd: "{sim('crowded')}", devices: [1], vramGiB: 8.5}}
""")
    fleet = Fleet(config, state_dir=tmp_path / "state", logs=LogHub(), device_probe=FixedReadings())
    await fleet.open()
    try:
        try:
            async with fleet.lease("crowded"):
                raise AssertionError("crowded was started on a device with 3.2 GiB free")
        except BackendStartError as error:
            assert str(error) == (
                "model 'crowded' needs 8.5 GiB on device 1 (fake1), which has 3.2 GiB free "
                "(other processes hold the rest)"
            )
        assert fleet.state_of("crowded") == "stopped"
        async with fleet.lease("fits") as lease:
            assert lease.backend.pid and alive(lease.backend.pid)
        devices = {entry["id"]: entry for entry in fleet.devices_status()}
        assert devices[0] == {
            "id": 0, "name": "fake0", "vram_gib": 16.0, "claimed_gib": 8.5, "models": {"fits": 8.5}, "asleep": {},
            "nvml_name": "Fake GPU", "total_gib": 16.0, "used_gib": 1.0, "free_gib": 15.0,
        }
        assert devices[1]["claimed_gib"] == 0 and devices[1]["free_gib"] == 3.2
        assert json.loads(json.dumps(fleet.status()))[0]["devices"] == {"0": 8.5}
    finally:
        await fleet.close()
