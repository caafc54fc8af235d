from intervals import merge


def test_overlapping():
    assert merge([(1, 4), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_empty():
    assert merge([]) == []


def test_touching_intervals_merge():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_unsorted_input():
    assert merge([(8, 9), (1, 4), (2, 6)]) == [(1, 6), (8, 9)]
