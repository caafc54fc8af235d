"""Temperature conversions and readings."""

import re

READING = re.compile(r"\s*([-+]?\d+(?:\.\d+)?)\s*([cCfF])\s*")


def to_fahrenheit(celsius):
    return round(celsius * 9 / 5 + 32, 1)


def to_celsius(fahrenheit):
    return round((fahrenheit - 32) * 5 / 9, 1)


def parse(text):
    match = READING.fullmatch(text)
    if match is None:
        raise ValueError(f"not a temperature reading: {text!r}")
    return float(match.group(1)), match.group(2).upper()
