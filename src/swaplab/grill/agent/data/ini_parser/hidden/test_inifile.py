from inifile import ParseError, parse


def test_sections_and_keys():
    text = "[server]\nHost = example.org\nport=8080\n\n[client]\nretries = 3\n"
    assert parse(text) == {"server": {"host": "example.org", "port": "8080"}, "client": {"retries": "3"}}


def test_comments():
    text = "; leading comment\n[a]\n# another\nx = 1 ; trailing\ny = 2 # trailing too\n"
    assert parse(text) == {"a": {"x": "1", "y": "2"}}


def test_quoted_values_keep_their_text():
    text = '[paths]\npattern = "*.log ; rotated"\nempty = ""\nspaced = "  a b  "\n'
    assert parse(text) == {"paths": {"pattern": "*.log ; rotated", "empty": "", "spaced": "  a b  "}}


def test_quoted_value_with_a_comment_after_it():
    assert parse('[a]\nk = "v#1" # the first\n') == {"a": {"k": "v#1"}}


def test_bad_line():
    try:
        parse("[a]\nnot a setting\n")
    except ParseError as error:
        assert "line 2" in str(error)
    else:
        raise AssertionError("no ParseError")


def test_section_header_with_a_comment():
    assert parse("[server] ; the main one\nport = 1\n") == {"server": {"port": "1"}}
