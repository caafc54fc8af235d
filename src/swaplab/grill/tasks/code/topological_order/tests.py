from solution import topological_order


def expect_value_error(dependencies):
    try:
        result = topological_order(dependencies)
    except ValueError:
        return
    raise AssertionError(f"no ValueError for a cycle; returned {result!r}")


def test_chain():
    assert topological_order({"c": ["b"], "b": ["a"]}) == ["a", "b", "c"]


def test_alphabetical_among_ready():
    assert topological_order({"b": [], "a": [], "c": []}) == ["a", "b", "c"]
    assert topological_order({"z": ["y"], "a": ["y"], "m": []}) == ["m", "y", "a", "z"]


def test_items_only_in_lists():
    assert topological_order({"app": ["lib", "log"]}) == ["lib", "log", "app"]


def test_diamond():
    deps = {"d": ["b", "c"], "b": ["a"], "c": ["a"]}
    assert topological_order(deps) == ["a", "b", "c", "d"]


def test_empty():
    assert topological_order({}) == []


def test_duplicate_dependencies():
    assert topological_order({"b": ["a", "a"]}) == ["a", "b"]


def test_cycle_raises():
    expect_value_error({"a": ["b"], "b": ["a"]})
    expect_value_error({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})


def test_self_dependency_raises():
    expect_value_error({"a": ["a"]})


def test_order_respects_every_dependency():
    deps = {f"n{i}": [f"n{j}" for j in range(i) if (i * j) % 3 == 1] for i in range(30)}
    order = topological_order(deps)
    assert sorted(order) == sorted(deps)
    position = {item: index for index, item in enumerate(order)}
    for item, needed in deps.items():
        assert all(position[dependency] < position[item] for dependency in needed)
