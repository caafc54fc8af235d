import random
import time
from itertools import combinations

from solution import weighted_interval_scheduling


def brute_force(jobs):
    best = 0
    for size in range(len(jobs) + 1):
        for chosen in combinations(jobs, size):
            ordered = sorted(chosen, key=lambda job: job[0])
            if all(first[1] <= second[0] for first, second in zip(ordered, ordered[1:])):
                best = max(best, sum(job[2] for job in chosen))
    return best


def test_no_jobs():
    assert weighted_interval_scheduling([]) == 0


def test_single_job():
    assert weighted_interval_scheduling([(1, 4, 7)]) == 7


def test_classic_example():
    jobs = [(1, 2, 50), (3, 5, 20), (6, 19, 100), (2, 100, 200)]
    assert weighted_interval_scheduling(jobs) == 250


def test_touching_jobs_are_compatible():
    assert weighted_interval_scheduling([(1, 3, 5), (3, 6, 5), (6, 9, 5)]) == 15


def test_heavy_job_beats_many_light_ones():
    jobs = [(0, 10, 100), (0, 1, 10), (1, 2, 10), (2, 3, 10)]
    assert weighted_interval_scheduling(jobs) == 100


def test_many_light_jobs_beat_a_heavy_one():
    jobs = [(0, 10, 25), (0, 1, 10), (1, 2, 10), (2, 3, 10)]
    assert weighted_interval_scheduling(jobs) == 30


def test_unsorted_input_and_zero_weights():
    jobs = [(5, 7, 0), (4, 6, 3), (1, 5, 4), (0, 1, 2), (6, 8, 3)]
    assert weighted_interval_scheduling(jobs) == brute_force(jobs)


def test_matches_brute_force_on_random_cases():
    generator = random.Random(20240601)
    for _ in range(150):
        jobs = []
        for _ in range(generator.randint(1, 9)):
            start = generator.randint(0, 12)
            jobs.append((start, start + generator.randint(1, 5), generator.randint(0, 20)))
        assert weighted_interval_scheduling(jobs) == brute_force(jobs), jobs


def test_twenty_thousand_jobs_quickly():
    generator = random.Random(7)
    jobs = []
    for _ in range(20_000):
        start = generator.randint(0, 1_000_000)
        jobs.append((start, start + generator.randint(1, 500), generator.randint(1, 1000)))
    began = time.process_time()
    result = weighted_interval_scheduling(jobs)
    assert time.process_time() - began < 3, "too slow for 20 000 jobs"
    assert isinstance(result, int) and result > 0
