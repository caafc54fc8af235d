def is_palindrome(text: str) -> bool:
    kept = [character.casefold() for character in text if character.isalnum()]
    return kept == kept[::-1]
