from intervals import merge


def test_overlapping():
    assert merge([(1, 4), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_empty():
    assert merge([]) == []
