"""Text helpers for the blog engine."""


def word_count(text):
    """How many whitespace-separated words `text` has."""
    return len(text.split())


def title_case(text):
    """Every word capitalised, the rest of it lower case."""
    return " ".join(word.capitalize() for word in text.split())
