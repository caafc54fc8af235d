from solution import parse_duration


def expect_value_error(text):
    try:
        result = parse_duration(text)
    except ValueError:
        return
    raise AssertionError(f"parse_duration({text!r}) returned {result!r} instead of raising ValueError")


def test_plain_seconds():
    assert parse_duration("90") == 90
    assert parse_duration("0") == 0
    assert parse_duration("  15 ") == 15


def test_units():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d 4h") == 187200
    assert parse_duration("45s") == 45
    assert parse_duration("1d2h3m4s") == 93784


def test_units_case_and_spacing():
    assert parse_duration("1H 2M 3S") == 3723
    assert parse_duration(" 10m  5s ") == 605


def test_large_amounts_in_one_unit():
    assert parse_duration("90m") == 5400
    assert parse_duration("100h") == 360000


def test_clock_forms():
    assert parse_duration("1:30") == 90
    assert parse_duration("0:05") == 5
    assert parse_duration("1:02:03") == 3723
    assert parse_duration("12:00:00") == 43200


def test_invalid_forms():
    for text in ("", "   ", "abc", "-5", "1x", "h", "5 m s", "1.5h", "1m1h", "1h1h", "1:60", "1:5", "1:00:60", "1::00", ":30", "1h-30m"):
        expect_value_error(text)


def test_returns_int():
    assert isinstance(parse_duration("1h"), int)
