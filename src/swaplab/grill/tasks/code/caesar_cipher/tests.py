from solution import caesar_cipher


def test_simple_shift():
    assert caesar_cipher("abc", 1) == "bcd"


def test_wraps_around():
    assert caesar_cipher("xyz", 3) == "abc"


def test_keeps_case():
    assert caesar_cipher("Hello, World!", 5) == "Mjqqt, Btwqi!"


def test_negative_shift():
    assert caesar_cipher("abc", -1) == "zab"
    assert caesar_cipher("Mjqqt", -5) == "Hello"


def test_large_shifts():
    assert caesar_cipher("abc", 27) == "bcd"
    assert caesar_cipher("abc", -53) == "zab"
    assert caesar_cipher("Zebra", 26 * 4) == "Zebra"


def test_other_characters_unchanged():
    assert caesar_cipher("1 2-3 ?!", 7) == "1 2-3 ?!"


def test_non_ascii_letters_unchanged():
    assert caesar_cipher("café Ärger", 1) == "dbgé Äshfs"


def test_round_trip():
    text = "The quick brown fox jumps over the lazy dog."
    assert caesar_cipher(caesar_cipher(text, 11), -11) == text
