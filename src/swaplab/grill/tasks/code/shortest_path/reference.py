import heapq


def shortest_path(graph, start, goal):
    if start == goal:
        return (0, [start])
    best = {start: 0}
    previous = {}
    queue = [(0, start)]
    done = set()
    while queue:
        cost, node = heapq.heappop(queue)
        if node in done:
            continue
        if node == goal:
            path = [goal]
            while path[-1] != start:
                path.append(previous[path[-1]])
            return (cost, path[::-1])
        done.add(node)
        for neighbour, weight in graph.get(node, {}).items():
            candidate = cost + weight
            if candidate < best.get(neighbour, float("inf")):
                best[neighbour] = candidate
                previous[neighbour] = node
                heapq.heappush(queue, (candidate, neighbour))
    return None
