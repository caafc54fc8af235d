from bisect import bisect_right


def weighted_interval_scheduling(jobs: list[tuple[int, int, int]]) -> int:
    ordered = sorted(jobs, key=lambda job: job[1])
    ends = [end for _, end, _ in ordered]
    best = [0] * (len(ordered) + 1)  # best[i]: the best using the first i jobs by end
    for index, (start, _, weight) in enumerate(ordered):
        compatible = bisect_right(ends, start, 0, index)  # jobs ending at or before start
        best[index + 1] = max(best[index], best[compatible] + weight)
    return best[-1]
