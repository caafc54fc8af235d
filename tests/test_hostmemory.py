"""Which sleepers stop so that another model may sleep: the host memory arithmetic, budget and headroom."""

from __future__ import annotations

from swaplab.config.model import HostMemory
from swaplab.fleet.hostmemory import make_room, over_budget

BUDGET = HostMemory(budget_gib=30)
HEADROOM = HostMemory(headroom_gib=8)


def test_a_declared_budget_stops_the_least_recently_used_sleepers_first():
    sleepers = [("old", 10.0), ("mid", 10.0), ("new", 5.0)]  # least recently used first
    assert make_room(5, sleepers, 0, BUDGET, None) == []  # 25 + 5 fits 30
    assert make_room(6, sleepers, 0, BUDGET, None) == ["old"]
    assert make_room(20, sleepers, 0, BUDGET, None) == ["old", "mid"]
    assert make_room(30, sleepers, 0, BUDGET, None) == ["old", "mid", "new"]


def test_what_cannot_fit_even_alone_is_refused_and_nobody_stops():
    assert make_room(31, [("old", 1.0)], 0, BUDGET, None) is None
    # a model still falling asleep holds its share and cannot be stopped to make room
    assert make_room(15, [("old", 10.0)], 20, BUDGET, None) is None
    assert make_room(10, [("old", 10.0)], 20, BUDGET, None) == ["old"]


def test_without_a_budget_available_ram_must_stay_above_the_headroom():
    sleepers = [("old", 4.0), ("new", 4.0)]
    assert make_room(2, sleepers, 0, HEADROOM, available=12) == []
    assert make_room(6, sleepers, 0, HEADROOM, available=12) == ["old"]  # 12 - 6 < 8; 16 - 6 >= 8
    assert make_room(13, sleepers, 0, HEADROOM, available=12) is None  # 20 - 13 < 8 even with both gone


def test_over_budget_after_a_sleeper_measured_more_than_declared():
    assert over_budget([("old", 10.0), ("new", 25.0)], BUDGET, None) == ["old"]
    assert over_budget([("old", 10.0), ("new", 15.0)], BUDGET, None) == []
    assert over_budget([("old", 3.0), ("new", 3.0)], HEADROOM, available=4) == ["old", "new"]
    assert over_budget([("old", 3.0), ("new", 3.0)], HEADROOM, available=6) == ["old"]
    assert over_budget([], HEADROOM, available=1) == []
