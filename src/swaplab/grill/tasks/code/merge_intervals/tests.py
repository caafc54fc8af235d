from solution import merge_intervals


def test_overlapping():
    assert merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]


def test_touching_merge():
    assert merge_intervals([(1, 3), (3, 5)]) == [(1, 5)]


def test_unsorted_input():
    assert merge_intervals([(8, 10), (1, 4), (2, 3), (0, 0)]) == [(0, 0), (1, 4), (8, 10)]


def test_contained():
    assert merge_intervals([(1, 10), (2, 3), (4, 5)]) == [(1, 10)]


def test_empty_and_single():
    assert merge_intervals([]) == []
    assert merge_intervals([(5, 5)]) == [(5, 5)]


def test_negative_and_chain():
    assert merge_intervals([(-5, -1), (-1, 0), (0, 2), (4, 4), (4, 6)]) == [(-5, 2), (4, 6)]


def test_adjacent_integers_not_merged():
    assert merge_intervals([(1, 2), (3, 4)]) == [(1, 2), (3, 4)]


def test_input_not_modified_and_tuples_returned():
    value = [(3, 4), (1, 2)]
    result = merge_intervals(value)
    assert value == [(3, 4), (1, 2)]
    assert all(isinstance(item, tuple) for item in result)
