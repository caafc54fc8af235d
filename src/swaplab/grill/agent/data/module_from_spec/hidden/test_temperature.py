import temperature


def raises_value_error(text):
    try:
        temperature.parse(text)
    except ValueError:
        return True
    return False


def test_to_fahrenheit():
    assert temperature.to_fahrenheit(100) == 212.0
    assert temperature.to_fahrenheit(-40) == -40.0
    assert temperature.to_fahrenheit(21.3) == 70.3


def test_to_celsius():
    assert temperature.to_celsius(212) == 100.0
    assert temperature.to_celsius(70) == 21.1


def test_parse_readings():
    assert temperature.parse("21.5C") == (21.5, "C")
    assert temperature.parse("-4 F") == (-4.0, "F")
    assert temperature.parse(" 70f ") == (70.0, "F")


def test_parse_refuses_what_is_not_a_reading():
    for text in ("21.5", "21.5K", "C", "", "twenty C"):
        assert raises_value_error(text), text
