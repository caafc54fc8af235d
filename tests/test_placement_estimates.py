"""Placement with claims estimated from the model files (issue 24): a table over the pure
decision, then end to end with the real llama.cpp server and the shipped models on a
declared device (llama.cpp runs on the CPU here; the declared device is what is counted)."""

from __future__ import annotations

import dataclasses
import shlex
import sys

import aiohttp
import pytest
from procs import Router
from routerclient import chat, running

from swaplab.builtin.models import GEMMA3, SMOLLM2, model_path
from swaplab.config.loader import load_config_text
from swaplab.config.model import ClaimEstimate, Config, DeviceConfig, ModelConfig
from swaplab.fleet import Fleet, LogHub
from swaplab.fleet.devices import DeviceReading
from swaplab.fleet.placement import Placement, Resident, claims, place

PYTHON = shlex.quote(sys.executable)


def entry(model_id: str, vram: dict[int, float] | None = None) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("llama-server", "-m", f"{model_id}.gguf"), cmd_stop=None,
                       proxy="http://x", check_endpoint="none", devices=(0,), vram_gib=vram or {})


def table_config(estimated: dict[str, float], declared: dict[str, float] | None = None) -> Config:
    declared = declared or {}
    models = {m: entry(m) for m in estimated} | {m: entry(m, {0: gib}) for m, gib in declared.items()}
    return Config(
        path="<table>", models=models, devices={0: DeviceConfig(0, "gpu0", 8.0)},
        estimates={m: ClaimEstimate({0: gib}, f"estimated {m}: kv 4.00 GiB") for m, gib in (estimated | declared).items()},
    )


def idle(*models: str) -> list[Resident]:
    return [Resident(m, "ready", last_used=float(i)) for i, m in enumerate(models)]


@pytest.mark.parametrize(("case", "config", "target", "residents", "expected"), [
    ("two estimates that fit run together", table_config({"a": 3.0, "b": 4.5}), "b", idle("a"), Placement("start")),
    ("a third that does not fit evicts the least recently used idle one",
     table_config({"a": 3.0, "b": 3.0, "c": 4.0}), "c", idle("a", "b"), Placement("evict", evict=("a",))),
    ("a busy one is waited for", table_config({"a": 5.0, "c": 4.0}), "c", [Resident("a", "ready", busy=True)],
     Placement("wait", blocking=("a",), reason="model 'c' waits for 'a' (busy) before it can start")),
    ("an estimate larger than the device is refused with its arithmetic", table_config({"big": 9.25}), "big", [],
     Placement("refuse", reason="model 'big' needs 9.25 GiB on device 0 (gpu0), which has 8 GiB (estimated big: kv 4.00 GiB)")),
    # A declared claim wins over its estimate: 'd' declares 2 GiB, its estimate (the table's
    # 6 GiB) is ignored, so it fits beside 'a'.
    ("a declared claim wins", dataclasses.replace(table_config({"a": 5.0}, {"d": 2.0}),
                                                  estimates={"a": ClaimEstimate({0: 5.0}, ""), "d": ClaimEstimate({0: 6.0}, "")}),
     "d", idle("a"), Placement("start")),
    # No estimate (its file is absent): the whole device, alone, as before.
    ("no estimate: the whole device", dataclasses.replace(table_config({"a": 1.0, "b": 1.0}),
                                                          estimates={"a": ClaimEstimate(None, "no such file")}),
     "b", idle("a"), Placement("evict", evict=("a",))),
])
def test_placement_with_estimated_claims(case, config, target, residents, expected):
    assert place(config, target, residents) == expected, case


def entry_yaml(name: str, path: str, ctx: int) -> str:
    return (f"  {name}:\n    cmd: {PYTHON} -m swaplab.builtin.llamacpp -m {path} --port ${{PORT}} -c {ctx} "
            f"-np 1 -t 1 --no-warmup\n")


@pytest.mark.llamacpp
async def test_estimated_claims_on_a_declared_device_with_the_real_llama_cpp(tmp_path):
    smol, gemma = model_path(SMOLLM2), model_path(GEMMA3)
    text = (
        "healthCheckTimeout: 120\ndevices:\n  0: {name: small, vramGiB: 0.9}\nmodels:\n"
        + entry_yaml("smol", smol, 8192) + entry_yaml("gemma", gemma, 32768)
        + entry_yaml("smol-long", smol, 16384) + entry_yaml("smol-huge", smol, 65536)
    )
    config = load_config_text(text)
    want = {m: claims(config, m)[0] for m in config.models}
    # Estimated from the files: 0.29 + 0.39 GiB fit 0.9 together, 0.47 + 0.39 too; all three do not.
    assert want["smol"] + want["gemma"] <= 0.9 < want["smol"] + want["gemma"] + want["smol-long"]
    assert want["smol-long"] + want["gemma"] <= 0.9 and want["smol-huge"] > 0.9
    config_file = tmp_path / "config.yaml"
    config_file.write_text(text)
    router = Router(config_file, tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            for model in ("smol", "gemma"):
                status, body = await chat(session, router.url, model, max_tokens=2)
                assert status == 200, body
            state = await running(session, router.url)
            assert {m: e["state"] for m, e in state.items()} == {"smol": "ready", "gemma": "ready"}  # co-resident
            assert state["smol"]["devices"]["0"] == pytest.approx(want["smol"])
            assert state["smol"]["claim_estimate"].startswith(f"estimated from {smol} at context 8192")

            status, body = await chat(session, router.url, "smol-long", max_tokens=2)
            assert status == 200, body
            state = {m: e["state"] for m, e in (await running(session, router.url)).items()}
            assert state == {"gemma": "ready", "smol-long": "ready"}  # smol, least recently used, evicted

            status, body = await chat(session, router.url, "smol-huge", max_tokens=2)
            assert status == 503, body  # as every refused start: model_unavailable, with the reason
            message = str(body)
            assert "needs" in message and "GiB on device 0 (small), which has 0.9 GiB" in message
            assert "estimated from" in message and "kv" in message and "q8_0" in message
            state = {m: e["state"] for m, e in (await running(session, router.url)).items()}
            assert state == {"gemma": "ready", "smol-long": "ready"}  # nothing stopped for a start that cannot fit
    finally:
        router.close()


class MeasuringProbe:
    """NVML as a machine whose driver says the model's process took 0.42 GiB on device 0."""

    def __init__(self) -> None:
        self.asked: list[set[int]] = []

    def read(self) -> dict[int, DeviceReading]:
        return {0: DeviceReading(0, "Fake GPU", total_gib=0.9, used_gib=0.0, free_gib=0.9)}

    def process_memory(self, pids) -> dict[int, float]:
        self.asked.append(set(pids))
        return {0: 0.42}

    def close(self) -> None:
        pass


@pytest.mark.llamacpp
async def test_a_measured_claim_replaces_the_estimate_until_the_entry_changes(tmp_path):
    text = "healthCheckTimeout: 120\ndevices:\n  0: {name: small, vramGiB: 0.9}\nmodels:\n" + entry_yaml(
        "smol", model_path(SMOLLM2), 8192)
    config = load_config_text(text)
    estimated = claims(config, "smol")[0]
    probe = MeasuringProbe()
    fleet = Fleet(config, state_dir=tmp_path / "state", logs=LogHub(), device_probe=probe)
    await fleet.open()
    try:
        async with fleet.lease("smol") as lease:
            assert lease.backend.pid in probe.asked[0]
        assert claims(fleet.config, "smol") == {0: 0.42} != {0: estimated}
        detail = fleet.status()[0]["claim_estimate"]
        assert detail.startswith("measured after its start: 0.42 GiB on device 0 (estimated ")
        # The same entry reloaded keeps the measurement; a changed one is estimated afresh.
        await fleet.reconfigure(load_config_text(text), changed=())
        assert claims(fleet.config, "smol") == {0: 0.42}
        changed = text.replace("-c 8192", "-c 4096")
        await fleet.reconfigure(load_config_text(changed), changed=("smol",))
        assert claims(fleet.config, "smol")[0] == pytest.approx(claims(load_config_text(changed), "smol")[0])
        assert claims(fleet.config, "smol")[0] != 0.42
    finally:
        await fleet.close()


def test_vllm_and_sglang_entries_claim_their_share_and_check_it_against_their_floor(tmp_path):
    folder = tmp_path / "qwen3"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,'
        ' "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960}')
    (folder / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 16381470720}}')
    config = load_config_text(f"""
devices:
  0: {{vramGiB: 24}}
  1: {{vramGiB: 24}}
models:
  tp2: {{cmd: "vllm serve {folder} -tp 2 --max-model-len 32768 --gpu-memory-utilization 0.5 --port ${{PORT}}",
         useModelName: "{folder}"}}
  short: {{cmd: "vllm serve {folder} --max-model-len 40960 --gpu-memory-utilization 0.6 --port ${{PORT}}", devices: [1],
          useModelName: "{folder}"}}
  sglang: {{cmd: "python -m sglang.launch_server --model-path {folder} --tp 2 --port ${{PORT}}"}}
""")
    assert claims(config, "tp2") == {0: 12.0, 1: 12.0}  # half of each GPU, on its two ranks
    assert ("its floor: weights 7.63 + KV at 32768 tokens 2.25 + reserved 2.00 = 11.88 GiB per rank"
            in config.estimates["tp2"].detail)
    assert claims(config, "short") == {1: pytest.approx(14.4)}
    assert "short of its floor" in config.estimates["short"].detail and "will not start" in config.estimates["short"].detail
    assert claims(config, "sglang") == {0: 24.0, 1: 24.0}  # its default share depends on the GPU: whole devices
    # tp2 and short share device 1: 12 + 14.4 > 24, so one evicts the other.
    assert place(config, "short", idle("tp2")) == Placement("evict", evict=("tp2",))
