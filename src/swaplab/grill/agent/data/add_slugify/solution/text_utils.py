"""Text helpers for the blog engine."""

import re


def word_count(text):
    """How many whitespace-separated words `text` has."""
    return len(text.split())


def title_case(text):
    """Every word capitalised, the rest of it lower case."""
    return " ".join(word.capitalize() for word in text.split())


def slugify(text):
    """Lower case; every run of characters other than a-z and 0-9 becomes one '-'; no '-' at either end."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
