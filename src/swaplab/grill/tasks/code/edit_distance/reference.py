def edit_distance(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for row, left in enumerate(a, start=1):
        current = [row]
        for column, right in enumerate(b, start=1):
            current.append(min(
                previous[column] + 1,  # delete
                current[column - 1] + 1,  # insert
                previous[column - 1] + (left != right),  # substitute (or keep)
            ))
        previous = current
    return previous[-1]
