def text_justify(words: list[str], width: int) -> list[str]:
    lines: list[list[str]] = []
    current: list[str] = []
    length = 0  # letters in `current`
    for word in words:
        if current and length + len(current) + len(word) > width:
            lines.append(current)
            current, length = [], 0
        current.append(word)
        length += len(word)
    if current:
        lines.append(current)
    justified = []
    for number, line in enumerate(lines):
        if number == len(lines) - 1 or len(line) == 1:
            justified.append(" ".join(line).ljust(width))
            continue
        gaps = len(line) - 1
        spaces = width - sum(len(word) for word in line)
        wide, extra = divmod(spaces, gaps)
        text = ""
        for index, word in enumerate(line[:-1]):
            text += word + " " * (wide + (1 if index < extra else 0))
        justified.append(text + line[-1])
    return justified
