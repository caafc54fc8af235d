def caesar_cipher(text: str, shift: int) -> str:
    # Near miss: every letter is shifted, accented ones included.
    shifted = []
    for character in text:
        if character.isalpha():
            base = ord("a") if character.islower() else ord("A")
            shifted.append(chr(base + (ord(character) - base + shift) % 26))
        else:
            shifted.append(character)
    return "".join(shifted)
