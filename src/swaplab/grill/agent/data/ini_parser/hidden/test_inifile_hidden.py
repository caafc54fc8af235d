from inifile import parse


def test_keys_before_any_section():
    assert parse("name = top\n[s]\nk = v\n") == {"": {"name": "top"}, "s": {"k": "v"}}


def test_quotes_with_both_comment_characters():
    assert parse('[q]\nk = "a;b#c" ; note\n') == {"q": {"k": "a;b#c"}}


def test_unquoted_value_with_equals():
    assert parse("[e]\nurl = http://x/?a=1 # link\n") == {"e": {"url": "http://x/?a=1"}}


def test_later_key_wins_and_sections_merge():
    assert parse("[s]\nk = 1\n[t]\nk = 2\n[s]\nK = 3\n") == {"s": {"k": "3"}, "t": {"k": "2"}}


def test_header_comment_with_hash_and_no_space():
    assert parse("[ db ]# primary\nhost = h\n") == {"db": {"host": "h"}}
