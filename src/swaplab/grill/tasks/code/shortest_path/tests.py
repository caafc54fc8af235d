import math
import random

from solution import shortest_path


def check(graph, start, goal, expected_cost):
    result = shortest_path(graph, start, goal)
    assert result is not None, f"no path found from {start} to {goal}"
    cost, path = result
    assert math.isclose(cost, expected_cost), f"cost {cost}, expected {expected_cost}"
    assert path[0] == start and path[-1] == goal, path
    walked = sum(graph[a][b] for a, b in zip(path, path[1:]))
    assert math.isclose(walked, expected_cost), f"path {path} costs {walked}"


def reference_costs(graph, start):
    costs = {start: 0}
    changed = True
    while changed:
        changed = False
        for node, edges in graph.items():
            if node not in costs:
                continue
            for neighbour, weight in edges.items():
                if costs[node] + weight < costs.get(neighbour, math.inf):
                    costs[neighbour] = costs[node] + weight
                    changed = True
    return costs


def test_cheaper_path_with_more_edges():
    graph = {"A": {"B": 10, "C": 1}, "C": {"D": 1}, "D": {"B": 1}}
    check(graph, "A", "B", 3)


def test_direct_edge():
    check({"A": {"B": 2.5}}, "A", "B", 2.5)


def test_start_is_goal():
    assert shortest_path({"A": {"B": 1}}, "A", "A") == (0, ["A"])
    assert shortest_path({}, "X", "X") == (0, ["X"])


def test_unreachable():
    assert shortest_path({"A": {"B": 1}, "C": {"A": 1}}, "A", "C") is None
    assert shortest_path({"A": {"B": 1}}, "Z", "B") is None


def test_edges_are_directed():
    assert shortest_path({"A": {"B": 1}}, "B", "A") is None


def test_zero_weight_edges_and_cycles():
    graph = {"A": {"B": 0, "C": 5}, "B": {"A": 0, "C": 4}, "C": {"A": 1}}
    check(graph, "A", "C", 4)


def test_random_graphs():
    generator = random.Random(99)
    for _ in range(40):
        nodes = [f"n{index}" for index in range(generator.randint(2, 12))]
        graph = {}
        for node in nodes:
            targets = generator.sample(nodes, generator.randint(0, len(nodes) - 1))
            graph[node] = {target: generator.randint(0, 20) for target in targets if target != node}
        costs = reference_costs(graph, nodes[0])
        for goal in nodes[1:]:
            if goal in costs:
                check(graph, nodes[0], goal, costs[goal])
            else:
                assert shortest_path(graph, nodes[0], goal) is None
