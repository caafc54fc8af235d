import random

from solution import edit_distance


def slow(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        for j in range(len(b) + 1):
            if i == 0 or j == 0:
                table[i][j] = i + j
            else:
                table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[-1][-1]


def test_classic():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("flaw", "lawn") == 2


def test_empty_strings():
    assert edit_distance("", "") == 0
    assert edit_distance("abc", "") == 3
    assert edit_distance("", "abcd") == 4


def test_identical():
    assert edit_distance("same", "same") == 0


def test_single_substitution():
    assert edit_distance("cat", "cut") == 1
    assert edit_distance("a", "b") == 1


def test_symmetric():
    assert edit_distance("intention", "execution") == edit_distance("execution", "intention") == 5


def test_case_matters():
    assert edit_distance("Hello", "hello") == 1


def test_random_against_a_plain_table():
    generator = random.Random(5)
    for _ in range(200):
        a = "".join(generator.choice("abc") for _ in range(generator.randint(0, 8)))
        b = "".join(generator.choice("abc") for _ in range(generator.randint(0, 8)))
        assert edit_distance(a, b) == slow(a, b), (a, b)


def test_long_strings():
    generator = random.Random(11)
    a = "".join(generator.choice("acgt") for _ in range(1000))
    b = list(a)
    for position in generator.sample(range(1000), 25):
        b[position] = "x"
    assert edit_distance(a, "".join(b)) == 25
