"""The sim's tokenizer: how many tokens a text is, and what output token N reads as.

One token per whitespace-separated word in; every answer out reads " tok0 tok1 tok2 ...".
"""

from __future__ import annotations

# Output token N is TOKEN_PREFIX + str(N).
TOKEN_PREFIX = " tok"


def count_words(text: str) -> int:
    """The sim's token count of `text`: one token per whitespace-separated word."""
    return len(prompt_words(text))


def prompt_words(text: str) -> list[str]:
    """`text` as the sim's tokens: its whitespace-separated words."""
    return text.split()


def token_text(index: int) -> str:
    """The text of output token `index`."""
    return f"{TOKEN_PREFIX}{index}"


def answer_text(count: int) -> str:
    """The whole answer of `count` tokens, as a non-streaming response carries it."""
    return "".join(token_text(index) for index in range(count))
