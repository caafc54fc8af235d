import string


def caesar_cipher(text: str, shift: int) -> str:
    shift %= 26
    lower, upper = string.ascii_lowercase, string.ascii_uppercase
    table = str.maketrans(lower + upper, lower[shift:] + lower[:shift] + upper[shift:] + upper[:shift])
    return text.translate(table)
