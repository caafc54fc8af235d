import re

UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
UNITS = re.compile(r"\s*(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s)?\s*", re.IGNORECASE)
CLOCK = re.compile(r"(\d+):([0-5]\d)(?::([0-5]\d))?")


def parse_duration(text: str) -> int:
    # Near miss: a two-part clock is read as hours and minutes.
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    clock = CLOCK.fullmatch(text)
    if clock:
        first, second, third = clock.groups()
        if third is None:
            return int(first) * 3600 + int(second) * 60
        return int(first) * 3600 + int(second) * 60 + int(third)
    units = UNITS.fullmatch(text)
    if text and units and any(units.groups()):
        return sum(int(amount) * seconds for amount, seconds in zip(units.groups(), UNIT_SECONDS.values()) if amount)
    raise ValueError(f"not a duration: {text!r}")
