from collections import deque


def shortest_path(graph, start, goal):
    # Near miss: breadth-first search finds the path with the fewest edges, not the cheapest.
    if start == goal:
        return (0, [start])
    previous = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for neighbour in graph.get(node, {}):
            if neighbour in previous:
                continue
            previous[neighbour] = node
            if neighbour == goal:
                path = [goal]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                path.reverse()
                cost = sum(graph[a][b] for a, b in zip(path, path[1:]))
                return (cost, path)
            queue.append(neighbour)
    return None
