from intervals import merge


def test_touching():
    assert merge([(1, 3), (3, 5), (5, 7)]) == [(1, 7)]


def test_unsorted_and_nested():
    assert merge([(5, 6), (1, 10), (2, 3), (12, 12)]) == [(1, 10), (12, 12)]


def test_gap_of_one_stays_apart():
    assert merge([(1, 2), (3, 4)]) == [(1, 2), (3, 4)]


def test_input_untouched():
    given = [(3, 4), (1, 2)]
    merge(given)
    assert given == [(3, 4), (1, 2)]
