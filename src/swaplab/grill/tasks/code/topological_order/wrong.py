import heapq


def topological_order(dependencies: dict[str, list[str]]) -> list[str]:
    # Near miss: a cycle is not reported; the items in it are silently left out.
    items = set(dependencies)
    for needed in dependencies.values():
        items.update(needed)
    waiting = {item: set(dependencies.get(item, ())) for item in items}
    dependents: dict[str, list[str]] = {item: [] for item in items}
    for item, needed in waiting.items():
        for dependency in needed:
            dependents[dependency].append(item)
    ready = [item for item, needed in waiting.items() if not needed]
    heapq.heapify(ready)
    order = []
    while ready:
        item = heapq.heappop(ready)
        order.append(item)
        for dependent in dependents[item]:
            waiting[dependent].discard(item)
            if not waiting[dependent]:
                heapq.heappush(ready, dependent)
    return order
