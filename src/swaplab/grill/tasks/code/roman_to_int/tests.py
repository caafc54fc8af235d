from solution import roman_to_int


def expect_value_error(text):
    try:
        roman_to_int(text)
    except ValueError:
        return
    raise AssertionError(f"roman_to_int({text!r}) did not raise ValueError")


def test_single_letters():
    assert [roman_to_int(letter) for letter in "IVXLCDM"] == [1, 5, 10, 50, 100, 500, 1000]


def test_additive():
    assert roman_to_int("III") == 3
    assert roman_to_int("LVIII") == 58
    assert roman_to_int("MMXXIII") == 2023


def test_subtractive_small():
    assert roman_to_int("IV") == 4
    assert roman_to_int("IX") == 9


def test_subtractive_tens_and_hundreds():
    assert roman_to_int("XL") == 40
    assert roman_to_int("XC") == 90
    assert roman_to_int("CD") == 400
    assert roman_to_int("CM") == 900


def test_mixed():
    assert roman_to_int("MCMXCIV") == 1994
    assert roman_to_int("MMMCMXCIX") == 3999
    assert roman_to_int("CDXLIV") == 444


def test_invalid_characters():
    expect_value_error("")
    expect_value_error("ABC")
    expect_value_error("xiv")
    expect_value_error("X I")
