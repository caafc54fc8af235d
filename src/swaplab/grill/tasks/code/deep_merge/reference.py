import copy


def deep_merge(base: dict, override: dict) -> dict:
    """Return base updated with override; nested dicts are merged key by key."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result
