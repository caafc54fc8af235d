from solution import run_length_encode


def test_example():
    assert run_length_encode("aaabccdddd") == "a3bc2d4"


def test_empty():
    assert run_length_encode("") == ""


def test_single_character():
    assert run_length_encode("x") == "x"


def test_no_runs():
    assert run_length_encode("abc") == "abc"


def test_run_at_the_end():
    assert run_length_encode("abbb") == "ab3"


def test_long_run_has_two_digits():
    assert run_length_encode("z" * 12) == "z12"
    assert run_length_encode("q" * 100 + "r") == "q100r"


def test_case_matters():
    assert run_length_encode("aAaa") == "aAa2"


def test_spaces_and_punctuation():
    assert run_length_encode("  !!!?") == " 2!3?"


def test_unicode_letters():
    assert run_length_encode("éééàß") == "é3àß"


def test_returns_a_string():
    assert isinstance(run_length_encode("aa"), str)
