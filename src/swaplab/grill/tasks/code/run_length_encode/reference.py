def run_length_encode(text: str) -> str:
    parts = []
    index = 0
    while index < len(text):
        end = index
        while end < len(text) and text[end] == text[index]:
            end += 1
        length = end - index
        parts.append(text[index] + (str(length) if length > 1 else ""))
        index = end
    return "".join(parts)
