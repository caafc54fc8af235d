VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_to_int(numeral: str) -> int:
    # Near miss: only IV and IX are treated as subtractive.
    if not numeral or any(character not in VALUES for character in numeral):
        raise ValueError(f"not a Roman numeral: {numeral!r}")
    total = 0
    index = 0
    while index < len(numeral):
        pair = numeral[index:index + 2]
        if pair in ("IV", "IX"):
            total += VALUES[pair[1]] - 1
            index += 2
        else:
            total += VALUES[numeral[index]]
            index += 1
    return total
