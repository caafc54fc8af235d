def edit_distance(a: str, b: str) -> int:
    # Near miss: substitutions are forgotten, so a changed character costs two edits.
    previous = list(range(len(b) + 1))
    for row, left in enumerate(a, start=1):
        current = [row]
        for column, right in enumerate(b, start=1):
            if left == right:
                current.append(previous[column - 1])
            else:
                current.append(min(previous[column], current[column - 1]) + 1)
        previous = current
    return previous[-1]
