def flatten(nested: list) -> list:
    # Near miss: tuples are flattened too.
    flat = []
    for item in nested:
        if isinstance(item, (list, tuple)):
            flat.extend(flatten(list(item)))
        else:
            flat.append(item)
    return flat
