"""The placement decision as tables: start, evict whom, wait for whom, or refuse why."""

from __future__ import annotations

import subprocess
import sys

import pytest
from swapcases import CASES as GROUP_CASES

from swaplab.config.model import Config, DeviceConfig, GroupConfig, ModelConfig
from swaplab.fleet.devices import device_env, free_gib, read_devices
from swaplab.fleet.placement import Placement, Resident, claim_faults, claims, place


def model(model_id: str, devices: tuple[int, ...] = (), vram: dict[int, float] | None = None, **extra) -> ModelConfig:
    return ModelConfig(
        id=model_id, cmd=("x",), cmd_stop=None, proxy="http://x", check_endpoint="none",
        devices=devices, vram_gib=vram or {}, **extra,
    )


def on(*devices: int, gib: float | None = None) -> tuple[tuple[int, ...], dict[int, float]]:
    return devices, ({d: gib for d in devices} if gib is not None else {})


def config(models: dict[str, tuple], devices: dict[int, float] | None = None, groups: tuple[GroupConfig, ...] = ()) -> Config:
    """`models`: id -> (devices, vramGiB); `devices`: id -> declared GiB (0 = size not declared)."""
    declared = {0: 16.0, 1: 16.0} if devices is None else devices
    return Config(
        path="<table>",
        models={m: model(m, *spec) for m, spec in models.items()},
        groups={g.id: g for g in groups},
        devices={d: DeviceConfig(id=d, name=f"gpu{d}", vram_gib=gib) for d, gib in declared.items()},
    )


def idle(*models: str) -> list[Resident]:
    """Ready, idle residents, least recently used first."""
    return [Resident(m, "ready", busy=False, last_used=float(i)) for i, m in enumerate(models)]


def busy(model_id: str, last_used: float = 0.0) -> Resident:
    return Resident(model_id, "ready", busy=True, last_used=last_used)


def evict(*models: str) -> Placement:
    return Placement("evict", evict=models)


START = Placement("start")


# -- without devices: exactly llama-swap's groups ---------------------------------------


@pytest.mark.parametrize("cfg, target, running, expected", GROUP_CASES)
def test_without_devices_idle_victims_are_the_group_rules_victims(cfg, target, running, expected):
    assert place(cfg, target, idle(*running)) == (evict(*expected) if expected else START)


@pytest.mark.parametrize("cfg, target, running, expected", [case for case in GROUP_CASES if case[3]])
@pytest.mark.parametrize("held", ["busy", "starting", "stopping"])
def test_without_devices_a_victim_not_idle_means_wait_for_all(cfg, target, running, expected, held):
    residents = idle(*running)
    first = next(i for i, r in enumerate(residents) if r.model_id == expected[0])
    residents[first] = (
        busy(expected[0], first) if held == "busy" else Resident(expected[0], held, last_used=float(first))
    )
    decision = place(cfg, target, residents)
    assert decision.action == "wait" and decision.blocking == tuple(expected)
    assert f"{expected[0]!r} ({held})" in decision.reason


def test_without_devices_residents_are_taken_least_recently_used_first():
    cfg = GROUP_CASES[0][0]  # no groups: one model at a time
    residents = [Resident("a", "ready", last_used=9.0), Resident("b", "ready", last_used=2.0)]
    assert place(cfg, "c", residents) == evict("b", "a")


def test_without_devices_free_memory_is_not_consulted():
    cfg = GROUP_CASES[0][0]
    assert place(cfg, "a", [], free_gib={0: 0.0}) == START


# -- with devices -------------------------------------------------------------------------

TWO_SINGLES = config({"a": on(0), "b": on(1), "tp2": on(0, 1)})
HALVES = config({"a": on(0, gib=8), "b": on(0, gib=8), "c": on(0, gib=8), "big": on(0, gib=10), "whole": on(0)})
SPLIT = config({"x": on(0, gib=2), "y": on(0, gib=8), "z": on(0, gib=4), "t": on(0, gib=10)})
MIXED = config({"a": on(0, gib=8), "b": on(1, gib=4), "c": on(1, gib=8), "t": on(0, 1, gib=8)})
UNSIZED = config({"a": on(0, gib=2), "b": on(0, gib=2), "c": on(1, gib=2)}, devices={0: 0, 1: 24})
ANYWHERE = config({"n": ((), {}), "m": ((), {}), "a": on(1, gib=2)})
PERSISTENT = config(
    {"embed": on(0, gib=4), "llm": on(0, gib=14), "small": on(0, gib=6), "p1": on(1, gib=2), "p2": on(1, gib=2)},
    groups=(
        GroupConfig("always", swap=False, exclusive=False, persistent=True, members=("embed",)),
        GroupConfig("pinned-pair", swap=True, exclusive=True, persistent=True, members=("p1", "p2")),
    ),
)
GROUPED = config(
    {"a": on(0, gib=4), "b": on(1, gib=4), "c": on(1, gib=4), "d": on(0, gib=4)},
    groups=(
        GroupConfig("pair", swap=True, exclusive=True, members=("a", "b")),
        GroupConfig("together", swap=False, exclusive=True, members=("c", "d")),
    ),
)


@pytest.mark.parametrize(
    "cfg, target, residents, expected",
    [
        # fits
        (TWO_SINGLES, "a", [], START),
        (TWO_SINGLES, "b", idle("a"), START),  # different devices: co-resident
        (HALVES, "b", idle("a"), START),  # 8 + 8 on a 16 GiB device
        (HALVES, "a", idle("a"), START),  # itself among the residents: ignored
        # collides on one device
        (HALVES, "big", idle("a"), evict("a")),  # 8 + 10 > 16
        (HALVES, "whole", idle("a"), evict("a")),  # no vramGiB: the whole device
        (HALVES, "a", idle("whole"), evict("whole")),
        # TP=2 over two single-device models: both go, least recently used first
        (TWO_SINGLES, "tp2", idle("b", "a"), evict("b", "a")),
        (TWO_SINGLES, "a", idle("tp2"), evict("tp2")),
        # least recently used first, and only as many as needed
        (HALVES, "c", idle("a", "b"), evict("a")),
        (HALVES, "c", idle("b", "a"), evict("b")),
        (HALVES, "whole", idle("b", "a"), evict("b", "a")),
        # x (2, oldest), y (8), z (4) hold 14 of 16; t needs 10: stopping x is not enough,
        # stopping y is, and x can then stay
        (SPLIT, "t", idle("x", "y", "z"), evict("y")),
        # a model on another device is never touched; on device 1 only the oldest goes
        (MIXED, "t", idle("b", "a", "c"), evict("b")),
        (MIXED, "t", idle("c", "a", "b"), evict("c")),
        # a device of undeclared size holds one model at a time
        (UNSIZED, "b", idle("a"), evict("a")),
        (UNSIZED, "c", idle("a"), START),
        # a model without devices claims every device, whole
        (ANYWHERE, "n", idle("a"), evict("a")),
        (ANYWHERE, "a", idle("n"), evict("n")),
        (ANYWHERE, "m", idle("n"), evict("n")),
        # busy models are never evicted: an idle one that suffices goes instead ...
        (HALVES, "c", [busy("a", 0), Resident("b", "ready", last_used=5)], evict("b")),
        # ... persistent models are never evicted; the other one goes
        (PERSISTENT, "small", idle("embed", "llm"), evict("llm")),
        # an explicit group's swap still holds between its members, on any device
        (GROUPED, "b", idle("a"), evict("a")),
        (PERSISTENT, "p2", idle("p1"), evict("p1")),  # even in a persistent group
        # exclusivity gives way to the claims: c's group is exclusive, yet a stays
        (GROUPED, "c", idle("a"), START),
        (GROUPED, "a", idle("c", "d"), START),  # 4 + 4 on device 0
    ],
)
def test_placement_on_devices(cfg, target, residents, expected):
    assert place(cfg, target, residents) == expected


def test_a_busy_colliding_model_means_wait_and_nothing_is_stopped_meanwhile():
    decision = place(HALVES, "whole", [busy("a", 0), Resident("b", "ready", last_used=5)])
    assert decision.action == "wait" and decision.evict == ()
    assert decision.blocking == ("a", "b")  # both must go; b stays up until a is done
    assert decision.reason == "model 'whole' waits for 'a' (busy) before it can start"


def test_a_model_already_stopping_is_waited_for_rather_than_another_evicted():
    # a is on its way out (evicted for c a moment ago): b, which may stay, is not stopped too.
    decision = place(HALVES, "c", [Resident("a", "stopping", last_used=0), Resident("b", "ready", last_used=1)])
    assert decision == Placement(
        "wait", blocking=("a",), reason="model 'c' waits for 'a' (stopping) before it can start"
    )


@pytest.mark.parametrize("state", ["starting", "stopping"])
def test_a_colliding_model_in_transition_means_wait(state):
    decision = place(TWO_SINGLES, "tp2", [Resident("a", state, last_used=0), Resident("b", "ready", last_used=1)])
    assert decision.action == "wait" and decision.blocking == ("a", "b")
    assert f"'a' ({state})" in decision.reason


def test_a_busy_model_elsewhere_does_not_hold_up_a_start():
    assert place(TWO_SINGLES, "b", [busy("a")]) == START


def test_a_persistent_model_in_the_way_is_a_refusal_that_names_it():
    decision = place(PERSISTENT, "llm", idle("small", "embed"))
    assert decision.action == "refuse"
    assert decision.reason == (
        "model 'llm' cannot start: on device 0 (gpu0) it needs 14 GiB, where persistent 'embed' holds 4 GiB; "
        "a persistent model is never stopped to make room: unload 'embed' (POST /unload?model=...) "
        "or lower the claims"
    )


def test_a_persistent_model_already_stopping_is_waited_for():
    decision = place(PERSISTENT, "llm", [Resident("embed", "stopping")])  # unloaded by hand
    assert decision.action == "wait" and decision.blocking == ("embed",)


def test_a_persistent_model_not_running_blocks_nothing():
    assert place(PERSISTENT, "llm", idle("small")) == evict("small")


@pytest.mark.parametrize(
    "cfg, target, reason",
    [
        (
            config({"huge": on(0, gib=24)}),
            "huge",
            "model 'huge' needs 24 GiB on device 0 (gpu0), which has 16 GiB",
        ),
        (
            config({"stray": on(3, gib=2)}),
            "stray",
            "model 'stray' claims device 3, which is not declared under devices (declared: 0, 1)",
        ),
    ],
)
def test_a_claim_that_can_never_be_met_is_refused(cfg, target, reason):
    assert claim_faults(cfg, target) == [reason]
    assert place(cfg, target, []) == Placement("refuse", reason=reason)


def test_claims():
    assert claims(HALVES, "a") == {0: 8.0}
    assert claims(HALVES, "whole") == {0: 16.0}
    assert claims(ANYWHERE, "n") == {0: 16.0, 1: 16.0}
    assert claims(UNSIZED, "a") == {0: 2.0}
    assert claims(config({"u": on(0)}, devices={0: 0}), "u") == {0: None}
    assert claims(GROUP_CASES[0][0], "a") == {}  # no devices declared: no claims
    # a model a reload removed, still stopping: what it holds is unknown, so everything
    assert claims(HALVES, "gone") == {0: 16.0, 1: 16.0}
    assert place(HALVES, "a", [Resident("gone", "stopping")]).action == "wait"


# -- NVML's free memory ------------------------------------------------------------------


def test_a_start_that_free_memory_cannot_hold_is_refused_not_left_to_oom():
    cfg = config({"x": on(1, gib=8.5)})
    decision = place(cfg, "x", [], free_gib={0: 15.0, 1: 3.2})
    assert decision == Placement(
        "refuse",
        reason="model 'x' needs 8.5 GiB on device 1 (gpu1), which has 3.2 GiB free (other processes hold the rest)",
        short_devices=(1,),
    )
    assert place(cfg, "x", [], free_gib={1: 8.5}) == START
    assert place(cfg, "x", [], free_gib={0: 0.0}) == START  # no reading for device 1: nothing to check


def test_free_memory_counts_what_the_planned_evictions_give_back():
    cfg = config({"a": on(0, gib=8), "x": on(0, gib=10)})
    assert place(cfg, "x", idle("a"), free_gib={0: 2.5}) == evict("a")  # 2.5 + 8 >= 10
    decision = place(cfg, "x", idle("a"), free_gib={0: 1.0})
    assert decision.action == "refuse"
    assert decision.reason == (
        "model 'x' needs 10 GiB on device 0 (gpu0), which has 9.0 GiB free even after stopping 'a' "
        "(other processes hold the rest)"
    )


def test_a_whole_device_claim_is_not_checked_against_free_memory():
    # No device ever reports its nominal size free; a whole-device claim takes what is there.
    assert place(HALVES, "whole", [], free_gib={0: 0.5}) == START


def test_a_shortfall_where_memory_is_still_coming_back_means_wait():
    cfg = config({"a": on(0, gib=4), "x": on(0, gib=8)})
    settling = place(cfg, "x", [], free_gib={0: 3.0}, settling=[0])
    assert settling.action == "wait" and settling.short_devices == (0,)
    # a model stopping on that device, which the claims alone would let stay
    stopping = place(cfg, "x", [Resident("a", "stopping")], free_gib={0: 3.0})
    assert stopping.action == "wait" and stopping.short_devices == (0,)
    assert place(cfg, "x", [], free_gib={0: 3.0}, settling=[1]).action == "refuse"


# -- the spawn environment ----------------------------------------------------------------


def test_cuda_visible_devices_comes_from_the_claim_unless_env_sets_it():
    assert device_env(model("m", (1, 0)), {}) == {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert device_env(model("m", (1,)), {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert device_env(model("m", (1,), env=(("CUDA_VISIBLE_DEVICES", "3"),)), {}) == {}
    assert device_env(model("m"), {}) == {}


# -- NVML itself -----------------------------------------------------------------------------


def _has_gpu() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_nvml_reading_is_none_without_a_gpu_and_real_with_one():
    readings = read_devices()
    if not _has_gpu():
        assert readings is None
        assert free_gib(readings) is None
        return
    assert readings, "nvidia-smi sees a GPU but NVML read nothing (is nvidia-ml-py installed?)"
    for index, reading in readings.items():
        assert reading.index == index and reading.name
        assert 0 < reading.total_gib and abs(reading.used_gib + reading.free_gib - reading.total_gib) < 0.5


def test_without_nvidia_ml_py_the_probe_says_none_silently():
    # A fresh interpreter in which `import pynvml` fails, as where the gpu extra is absent.
    script = (
        "import sys, logging; sys.modules['pynvml'] = None\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from swaplab.fleet.devices import DeviceProbe\n"
        "probe = DeviceProbe()\n"
        "print(probe.read(), probe.read())\n"
        "probe.close()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None None" and result.stderr == ""

