def is_palindrome(text: str) -> bool:
    # Near miss: only spaces are left out, not punctuation.
    kept = text.replace(" ", "").lower()
    return kept == kept[::-1]
