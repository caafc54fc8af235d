from solution import top_k_words


def test_most_frequent_first():
    text = "the cat and the hat and the bat"
    assert top_k_words(text, 2) == ["the", "and"]


def test_case_insensitive_and_lower_cased():
    assert top_k_words("Apple apple APPLE pear", 1) == ["apple"]


def test_ties_alphabetical():
    assert top_k_words("zebra yak zebra yak ant", 2) == ["yak", "zebra"]
    assert top_k_words("dog cat bird", 3) == ["bird", "cat", "dog"]


def test_punctuation_and_digits_separate_words():
    assert top_k_words("it's it's... well-known 3d 3d", 3) == ["d", "it", "s"]


def test_fewer_words_than_k():
    assert top_k_words("one two", 5) == ["one", "two"]


def test_k_zero_or_negative():
    assert top_k_words("a b c", 0) == []
    assert top_k_words("a b c", -1) == []


def test_no_words():
    assert top_k_words("", 3) == []
    assert top_k_words("123 !!! ---", 3) == []


def test_non_ascii_letters_separate():
    assert top_k_words("café café", 2) == ["caf"]
