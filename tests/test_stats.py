"""The shared statistics, as tables of known answers: percentiles, Student's t, and compare's verdicts."""

from __future__ import annotations

import math
import random
import re
import statistics

import pytest

from swaplab.results.stats import (
    Comparison, compare, distribution, percentile, regularized_incomplete_beta, spread, student_t_cdf,
    student_t_two_sided_p, welch_t_test,
)

# -- one sample ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # position = q/100 * (n-1), interpolated between the neighbouring ranks (worked by hand)
        ([15, 20, 35, 40, 50], {"n": 5, "p50": 35.0, "p90": 46.0, "p99": 49.6, "mean": 32.0}),
        (list(range(1, 11)), {"n": 10, "p50": 5.5, "p90": 9.1, "p99": 9.91, "mean": 5.5}),
        ([50, 15, 40, 20, 35], {"n": 5, "p50": 35.0, "p90": 46.0, "p99": 49.6, "mean": 32.0}),  # any order
        ([7.5], {"n": 1, "p50": 7.5, "p90": 7.5, "p99": 7.5, "mean": 7.5}),
        ([1, 2], {"n": 2, "p50": 1.5, "p90": 1.9, "p99": 1.99, "mean": 1.5}),
        ([], {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None}),
    ],
)
def test_distribution(values, expected):
    got = distribution(values)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == (None if value is None else pytest.approx(value)), key


def test_percentile_agrees_with_the_inclusive_method_of_the_standard_library():
    generator = random.Random(5)
    values = sorted(generator.lognormvariate(3, 1) for _ in range(37))
    cut_points = statistics.quantiles(values, n=100, method="inclusive")  # cut_points[k-1] is the k-th percentile
    for q in (1, 10, 25, 50, 90, 99):
        assert percentile(values, q) == pytest.approx(cut_points[q - 1])
    assert percentile(values, 0) == values[0] and percentile(values, 100) == values[-1]
    with pytest.raises(ValueError):
        percentile(values, 101)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([19, 21, 20], {"mean": 20.0, "min": 19.0, "max": 21.0, "n": 3}),
        ([18, 20, 21], {"mean": 59 / 3, "min": 18.0, "max": 21.0, "n": 3}),
        ([141.9], {"mean": 141.9, "min": 141.9, "max": 141.9, "n": 1}),
        ([], {"mean": None, "min": None, "max": None, "n": 0}),
    ],
)
def test_spread(values, expected):
    got = spread(values)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == (None if value is None else pytest.approx(value)), key


# -- Student's t ----------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "a", "b", "expected"), [
    (0.3, 2.5, 1.0, 0.3**2.5),  # I_x(a, 1) = x^a
    (0.3, 1.0, 4.0, 1 - 0.7**4),  # I_x(1, b) = 1 - (1-x)^b
    (0.5, 7.3, 7.3, 0.5),  # symmetric
    (0.9, 0.5, 0.5, 2 / math.pi * math.asin(math.sqrt(0.9))),  # the arcsine distribution
    (0.0, 2.0, 3.0, 0.0),
    (1.0, 2.0, 3.0, 1.0),
])
def test_regularized_incomplete_beta(x, a, b, expected):
    assert regularized_incomplete_beta(x, a, b) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def cauchy_cdf(t):  # Student's t with 1 degree of freedom
    return 0.5 + math.atan(t) / math.pi


def t2_cdf(t):  # closed form for 2 degrees of freedom
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def t3_cdf(t):  # closed form for 3 degrees of freedom
    u = t / math.sqrt(3)
    return 0.5 + (u / (1 + u * u) + math.atan(u)) / math.pi


@pytest.mark.parametrize("t", [-30.0, -2.5, -0.7, 0.0, 0.1, 1.0, 3.3, 100.0])
def test_t_cdf_matches_the_closed_forms(t):
    assert student_t_cdf(t, 1) == pytest.approx(cauchy_cdf(t), rel=1e-12)
    assert student_t_cdf(t, 2) == pytest.approx(t2_cdf(t), rel=1e-12)
    assert student_t_cdf(t, 3) == pytest.approx(t3_cdf(t), rel=1e-12)


@pytest.mark.parametrize(("t", "df", "p"), [
    # two-sided critical values from the printed t table (3 decimals, so p to about 3e-4)
    (12.706, 1, 0.05),
    (4.303, 2, 0.05),
    (2.776, 4, 0.05),
    (2.228, 10, 0.05),
    (2.042, 30, 0.05),
    (4.032, 5, 0.01),
    (2.845, 20, 0.01),
    (1.812, 10, 0.10),
])
def test_t_two_sided_p_at_table_critical_values(t, df, p):
    assert student_t_two_sided_p(t, df) == pytest.approx(p, abs=3e-4)
    assert student_t_two_sided_p(-t, df) == student_t_two_sided_p(t, df)
    assert student_t_cdf(t, df) == pytest.approx(1 - p / 2, abs=2e-4)


@pytest.mark.parametrize("t", [0.5, 1.959964, 3.0, 6.0])
def test_t_tends_to_the_normal_for_many_degrees_of_freedom(t):
    assert student_t_two_sided_p(t, 1e8) == pytest.approx(math.erfc(t / math.sqrt(2)), rel=1e-6)


def test_t_with_fractional_degrees_of_freedom_lies_between_its_neighbours():
    # Welch's test gives fractional df; the tail shrinks as df grows.
    assert student_t_two_sided_p(2.5, 2) > student_t_two_sided_p(2.5, 2.5) > student_t_two_sided_p(2.5, 3)
    assert student_t_two_sided_p(0.0, 3.448) == 1.0
    assert student_t_two_sided_p(math.inf, 3) == 0.0 and student_t_cdf(-math.inf, 3) == 0.0


def test_welch_t_test_on_the_seed_scores():
    a, b = [19, 21, 20], [18, 20, 21]
    test = welch_t_test(a, b)
    # Worked by hand: variances 1 and 7/3, so se^2 = 1/3 + 7/9 = 10/9.
    assert test.t == pytest.approx((59 / 3 - 20) / math.sqrt(10 / 9))
    assert test.df == pytest.approx((10 / 9) ** 2 / ((1 / 3) ** 2 / 2 + (7 / 9) ** 2 / 2))
    assert test.p_value == pytest.approx(student_t_two_sided_p(test.t, test.df))
    assert 0.76 < test.p_value < 0.78
    assert welch_t_test(b, a).p_value == pytest.approx(test.p_value)  # symmetric
    with pytest.raises(ValueError):
        welch_t_test([1.0], [1.0, 2.0])


# -- compare -----------------------------------------------------------------------------------


def test_the_seeds_grill_scores_are_indistinguishable():
    result = compare([19, 21, 20], [18, 20, 21])  # glm-flash-sglang vs glm-flash-awq, n=3 each
    assert isinstance(result, Comparison)
    assert result.verdict == "indistinguishable" and not result.different
    assert result.reason.startswith("the min-max spreads overlap (19.0-21.0 vs 18.0-21.0)")
    assert result.ratio == pytest.approx(59 / 60)
    assert result.low < result.ratio < result.high
    assert result.p_value > 0.05
    assert result.difference == pytest.approx(-1 / 3)
    assert (result.n_a, result.n_b) == (3, 3)


def sim_reps(tokens_per_second: float, reps: int, seed: int) -> list[float]:
    """Per-rep tok/s of a sim at a fixed rate, with 1% run-to-run noise."""
    generator = random.Random(seed)
    return [tokens_per_second * (1 + generator.gauss(0, 0.01)) for _ in range(reps)]


def test_a_sim_at_60_tokens_per_second_is_separated_from_one_at_50():
    a, b = sim_reps(50, 3, seed=1), sim_reps(60, 3, seed=2)
    result = compare(a, b)
    assert result.verdict == "different"
    assert result.ratio == pytest.approx(1.2, abs=0.03)
    assert result.low <= result.ratio <= result.high
    assert 1.1 < result.low and result.high < 1.3
    assert result.p_value < 0.01
    assert re.fullmatch(r"p < 0\.001; B/A = 1\.\d+ \(95% CI 1\.\d+-1\.\d+\)", result.reason), result.reason
    reverse = compare(b, a)
    assert reverse.verdict == "different" and reverse.ratio == pytest.approx(1 / result.ratio)


def test_two_runs_of_the_same_config_are_indistinguishable():
    result = compare(sim_reps(50, 3, seed=1), sim_reps(50, 3, seed=2))
    assert result.verdict == "indistinguishable"
    assert result.low <= 1.0 <= result.high


def test_the_interval_is_reproducible_from_its_seed():
    a, b = sim_reps(50, 5, seed=3), sim_reps(55, 5, seed=4)
    assert compare(a, b, seed=7) == compare(a, b, seed=7)
    assert compare(a, b, seed=7).low != compare(a, b, seed=8).low
    assert compare(a, b, seed=7, resamples=200).verdict == compare(a, b, seed=7).verdict


def test_a_single_run_is_never_different():
    result = compare([22], [20])  # the seed's n=1 pass that reversed at n=3
    assert result.verdict == "indistinguishable"
    assert result.p_value is None and result.low is None and result.high is None
    assert result.ratio == pytest.approx(20 / 22)
    assert "A and B have a single run (n = 1 vs 1)" in result.reason
    one_side = compare([50.0, 50.5, 49.8], [60.0])
    assert one_side.verdict == "indistinguishable" and one_side.reason.startswith("B has a single run (n = 3 vs 1)")


def test_no_variance():
    same = compare([20, 20, 20], [20, 20, 20])
    assert same.verdict == "indistinguishable" and same.p_value == 1.0
    assert (same.ratio, same.low, same.high) == (1.0, 1.0, 1.0)
    constant = compare([50, 50, 50], [60, 60, 60])
    assert constant.verdict == "different" and constant.p_value == 0.0
    assert (constant.ratio, constant.low, constant.high) == (1.2, 1.2, 1.2)
    assert constant.reason == "neither side varies from run to run; B/A = 1.20 (95% CI 1.20-1.20)"
    one_varies = compare([50, 50, 50], [59, 60, 61])
    assert one_varies.verdict == "different" and 0 < one_varies.p_value < 0.05


def test_spreads_apart_but_too_few_runs_to_tell():
    result = compare([10, 11], [11.5, 14])  # no overlap, yet two runs each can't show it at 95%
    assert result.verdict == "indistinguishable"
    assert result.p_value >= 0.05
    assert "no difference at 95% although the min-max spreads don't overlap (10.0-11.0 vs 11.5-14.0)" in result.reason


def test_a_zero_baseline_has_no_ratio_but_a_difference():
    result = compare([0, 0, 0], [5, 6, 5])  # e.g. a model that scored nothing
    assert result.ratio is None and result.low is None and result.high is None
    assert result.difference == pytest.approx(16 / 3)
    assert result.difference_low <= result.difference <= result.difference_high
    assert result.verdict == "different"
    assert "B - A = 5.3 (95% CI" in result.reason


def test_nothing_to_compare():
    with pytest.raises(ValueError, match="at least one value on each side"):
        compare([], [1.0, 2.0])
