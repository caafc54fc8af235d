import copy

from solution import deep_merge


def defaults():
    return {
        "name": "svc",
        "server": {"host": "127.0.0.1", "port": 8080, "tls": {"enabled": False, "ciphers": ["a", "b"]}},
        "timeout": 30,
        "tags": ["x"],
    }


def test_merges_nested_sections():
    merged = deep_merge(defaults(), {"server": {"port": 9000, "tls": {"enabled": True}}})
    assert merged == {
        "name": "svc",
        "server": {"host": "127.0.0.1", "port": 9000, "tls": {"enabled": True, "ciphers": ["a", "b"]}},
        "timeout": 30,
        "tags": ["x"],
    }


def test_base_not_modified_at_any_depth():
    base = defaults()
    deep_merge(base, {"server": {"tls": {"enabled": True}}, "new": 1})
    assert base == defaults()


def test_later_merges_do_not_see_earlier_overrides():
    base = defaults()
    first = deep_merge(base, {"server": {"port": 1}})
    second = deep_merge(base, {"name": "other"})
    assert first["server"]["port"] == 1
    assert second["server"]["port"] == 8080


def test_override_not_modified():
    override = {"server": {"tls": {"ciphers": ["z"]}}, "extra": {"k": [1]}}
    snapshot = copy.deepcopy(override)
    deep_merge(defaults(), override)
    assert override == snapshot


def test_result_independent_of_inputs():
    base = defaults()
    override = {"extra": {"k": [1]}}
    merged = deep_merge(base, override)
    merged["server"]["tls"]["ciphers"].append("c")
    merged["extra"]["k"].append(2)
    merged["tags"].append("y")
    assert base == defaults()
    assert override == {"extra": {"k": [1]}}


def test_section_over_plain_value():
    merged = deep_merge(defaults(), {"timeout": {"read": 5}})
    assert merged["timeout"] == {"read": 5}


def test_plain_value_over_section():
    merged = deep_merge(defaults(), {"server": None})
    assert merged["server"] is None


def test_lists_replaced():
    assert deep_merge(defaults(), {"tags": ["y"]})["tags"] == ["y"]


def test_empty_sides():
    assert deep_merge({}, {}) == {}
    assert deep_merge(defaults(), {}) == defaults()
    assert deep_merge({}, {"a": {"b": 1}}) == {"a": {"b": 1}}
