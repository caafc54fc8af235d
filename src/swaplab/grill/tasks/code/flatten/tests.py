from solution import flatten


def test_example():
    assert flatten([1, [2, [3, (4, 5)]], "ab"]) == [1, 2, 3, (4, 5), "ab"]


def test_empty_lists_vanish():
    assert flatten([]) == []
    assert flatten([[], [[]], [[], [[]]]]) == []


def test_already_flat():
    assert flatten([1, 2, 3]) == [1, 2, 3]


def test_tuples_strings_dicts_sets_are_items():
    value = [(1, [2]), "xyz", {"a": [1]}, {3}]
    assert flatten(value) == [(1, [2]), "xyz", {"a": [1]}, {3}]


def test_deep_nesting():
    nested = [0]
    for number in range(1, 200):
        nested = [nested, number]
    assert flatten(nested) == list(range(200))


def test_input_not_modified():
    value = [1, [2, [3]], [4]]
    flatten(value)
    assert value == [1, [2, [3]], [4]]


def test_none_and_falsy_items_kept():
    assert flatten([None, [0, [False, ""]]]) == [None, 0, False, ""]


def test_returns_a_new_list():
    value = [1, 2]
    result = flatten(value)
    result.append(3)
    assert value == [1, 2]
