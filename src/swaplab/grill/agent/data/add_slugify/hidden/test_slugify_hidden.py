from text_utils import slugify, word_count


def test_runs_collapse_to_one_dash():
    assert slugify("a  --  b") == "a-b"


def test_no_dash_at_the_ends():
    assert slugify("  --Rust & Go!-- ") == "rust-go"


def test_non_ascii_letters_are_separators():
    assert slugify("Café Crème") == "caf-cr-me"


def test_digits_stay():
    assert slugify("Top 10 Tips") == "top-10-tips"


def test_nothing_left():
    assert slugify("!!!") == ""


def test_old_functions_still_work():
    assert word_count("") == 0
