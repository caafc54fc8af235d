from stats import mean, median


def test_median_of_two():
    assert median([10, 20]) == 15


def test_median_of_one():
    assert median([7]) == 7


def test_median_of_six_unsorted():
    assert median([6, 1, 5, 2, 4, 3]) == 3.5


def test_median_leaves_its_input_alone():
    values = [3, 1, 2, 4]
    median(values)
    assert values == [3, 1, 2, 4]


def test_mean_still_right():
    assert mean([2, 4]) == 3
