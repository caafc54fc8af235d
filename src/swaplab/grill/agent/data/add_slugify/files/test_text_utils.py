from text_utils import slugify, title_case, word_count


def test_word_count():
    assert word_count("one two  three") == 3


def test_title_case():
    assert title_case("hello WORLD") == "Hello World"


def test_slugify_simple():
    assert slugify("Hello World") == "hello-world"


def test_slugify_punctuation():
    assert slugify("What's new in 2024?") == "what-s-new-in-2024"
