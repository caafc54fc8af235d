VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_to_int(numeral: str) -> int:
    if not numeral or any(character not in VALUES for character in numeral):
        raise ValueError(f"not a Roman numeral: {numeral!r}")
    total = 0
    for index, character in enumerate(numeral):
        value = VALUES[character]
        following = VALUES[numeral[index + 1]] if index + 1 < len(numeral) else 0
        total += -value if value < following else value
    return total
