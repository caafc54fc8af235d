from bisect import bisect_left


def weighted_interval_scheduling(jobs: list[tuple[int, int, int]]) -> int:
    # Near miss: a job ending exactly when another starts is treated as a conflict.
    ordered = sorted(jobs, key=lambda job: job[1])
    ends = [end for _, end, _ in ordered]
    best = [0] * (len(ordered) + 1)
    for index, (start, _, weight) in enumerate(ordered):
        compatible = bisect_left(ends, start, 0, index)
        best[index + 1] = max(best[index], best[compatible] + weight)
    return best[-1]
