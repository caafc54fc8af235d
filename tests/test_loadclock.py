"""The load clock as tables: stages timed from a server's output, the history kept per model
and command, the ETA from the recent median per stage, and when a load looks stuck. Pure:
every clock reading is passed in, so nothing here sleeps."""

from __future__ import annotations

import pytest

from swaplab.fleet.loadclock import LoadClock, LoadHistory, LoadWatch, command_identity, expect
from swaplab.results.loads import LoadRecord



def record(seconds: float, stages: tuple[tuple[str, float], ...], finished_at: float, model: str = "m",
           identity: str = "abc") -> LoadRecord:
    return LoadRecord(model, "start", identity, seconds, stages, finished_at)


def test_history_keeps_the_ten_most_recent_per_model_kind_and_command():
    history = LoadHistory(record(float(i), (), float(i)) for i in range(15))
    assert [r.seconds for r in history.recent("m", "start", "abc")] == [float(i) for i in range(5, 15)]
    assert history.recent("m", "start", "other") == [] and history.recent("m", "wake", "abc") == []
    assert command_identity(["a", "b"]) != command_identity(["a b"])


def test_the_expectation_is_the_median_per_stage_with_the_spread():
    loads = [
        record(100, (("starting", 5), ("loading weights", 20), ("capturing CUDA graphs", 75)), 1),
        record(110, (("starting", 5), ("loading weights", 25), ("capturing CUDA graphs", 80)), 2),
        record(300, (("starting", 5), ("loading weights", 200), ("capturing CUDA graphs", 95)), 3),
    ]
    expected = expect(loads)
    assert expected is not None and expected.loads == 3 and expected.usual_seconds == 110
    assert (expected.fastest_seconds, expected.slowest_seconds) == (100, 300)
    assert expected.stage_seconds == {"starting": 5, "loading weights": 25, "capturing CUDA graphs": 80}
    assert expect([]) is None


def watch_with(loads: list[LoadRecord]) -> LoadWatch:
    return LoadWatch("start", 0.0, expect(loads))


USUAL = [record(110, (("starting", 5), ("loading weights", 25), ("capturing CUDA graphs", 80)), 1)]


@pytest.mark.parametrize(("stage", "fraction", "entered", "now", "eta", "percent"), [
    # Half the CUDA graphs captured: 5 + 25 + 40 done of the usual 110, 40 left.
    ("capturing CUDA graphs", 0.5, 30.0, 70.0, 40.0, 64),
    # The weights stage without a fraction: its time so far, at most its usual 25 s.
    ("loading weights", None, 5.0, 15.0, 95.0, 14),
    ("loading weights", None, 5.0, 60.0, 80.0, 27),  # overran its stage: only the later stages remain
    # A stage the history never saw: the usual total less the time spent.
    ("compiling", None, 5.0, 50.0, 60.0, 45),
])
def test_the_eta_follows_the_usual_stages(stage, fraction, entered, now, eta, percent):
    watch = watch_with(USUAL)
    watch.stage, watch.fraction, watch.stage_began, watch.last_output = stage, fraction, entered, now
    view = watch.view(now)
    assert (view["eta_seconds"], view["percent"]) == (eta, percent)
    assert view["usual_seconds"] == 110 and view["history"] == 1 and not view["stuck"]


def test_a_first_load_says_it_has_no_history():
    view = watch_with([]).view(12.0)
    assert view["eta_seconds"] is None and view["percent"] is None and view["history"] == 0
    assert view["stage"] == "starting" and view["elapsed_seconds"] == 12.0


@pytest.mark.parametrize(("stage", "last_output", "now", "stuck"), [
    # Past twice the usual 110 s; the CUDA graphs usually take 80 s: silent for more than 160 s is stuck.
    ("capturing CUDA graphs", 200.0, 225.0, False),
    ("capturing CUDA graphs", 60.0, 225.0, True),
    # The weights usually take 25 s: silent for 45 s is not yet stuck, for 55 s it is.
    ("loading weights", 180.0, 225.0, False),
    ("loading weights", 170.0, 225.0, True),
    # A 5 s stage: at least 10 s of silence all the same (a stage's lines may come seconds apart).
    ("starting", 216.0, 225.0, False),
    ("starting", 214.0, 225.0, True),
    ("starting", 100.0, 150.0, False),  # silent 50 s, but not past twice its usual time
    # A stage the history never saw: measured against the longest usual stage (80 s).
    ("compiling", 100.0, 250.0, False),
    ("compiling", 80.0, 250.0, True),
])
def test_a_load_far_past_its_usual_time_silent_past_its_stage_is_probably_stuck(stage, last_output, now, stuck):
    watch = watch_with(USUAL)
    watch.stage, watch.last_output = stage, last_output
    assert watch.view(now)["stuck"] is stuck


def test_a_first_load_is_probably_stuck_after_two_minutes_without_output():
    watch = watch_with([])
    watch.last_output = 10.0
    assert not watch.view(129.0)["stuck"]
    view = watch.view(131.0)
    assert view["stuck"] and view["silent_seconds"] == 121.0 and view["elapsed_seconds"] == 131.0


def test_lines_move_the_stage_and_the_record_times_each_stage():
    watch = LoadWatch("start", 100.0, None)
    assert not watch.line("nothing this reader knows", 101.0)
    assert watch.line("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00s/it]", 103.0)
    assert (watch.stage, watch.fraction) == ("loading weights", 0.5)
    assert watch.line("Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.00s/it]", 104.0)
    assert watch.enter("restoring context", 110.0)
    assert not watch.enter("restoring context", 111.0)
    clock = LoadClock()
    finished = clock.finish("m", "abc", watch, 112.0, 1_700_000_000.0)
    assert finished.stages == (("starting", 3.0), ("loading weights", 7.0), ("restoring context", 2.0))
    assert finished.seconds == 12.0 and clock.history.recent("m", "start", "abc") == [finished]
    follow = clock.begin("m", "start", "abc", 0.0)
    assert follow.expectation is not None and follow.expectation.usual_seconds == 12.0
