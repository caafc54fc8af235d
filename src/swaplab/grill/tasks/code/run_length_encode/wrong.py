def run_length_encode(text: str) -> str:
    # Near miss: the last run is never written out.
    parts = []
    previous = None
    count = 0
    for character in text:
        if character == previous:
            count += 1
            continue
        if previous is not None:
            parts.append(previous + (str(count) if count > 1 else ""))
        previous = character
        count = 1
    return "".join(parts)
