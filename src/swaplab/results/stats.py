"""The statistics every bench and grill figure is reported with: pure functions, stdlib only.

A figure is a mean with its min-max spread over repetitions (`spread`); a latency is a
distribution (`distribution`); two configurations are compared with `compare`, which
says "indistinguishable" unless the data really separate them (the seed's n=1 scores
that reversed at n=3 are why).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

PERCENTILES = (50, 90, 99)
CONFIDENCE = 0.95
SIGNIFICANCE = 1 - CONFIDENCE  # a p-value below this is a difference


# -- one sample ------------------------------------------------------------------------


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of already sorted values, linearly interpolated between ranks.

    The same definition as numpy's default and `statistics.quantiles(method="inclusive")`.
    """
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    position = q / 100 * (len(ordered) - 1)
    below = math.floor(position)
    above = math.ceil(position)
    low, high = ordered[below], ordered[above]
    if below == above or low == high:  # also keeps inf - inf out of the interpolation
        return low
    return low + (high - low) * (position - below)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def distribution(values: Iterable[float]) -> dict[str, float | int | None]:
    """`n`, `p50`, `p90`, `p99` and `mean` of values (latencies of one level); all None but n when empty."""
    ordered = sorted(float(value) for value in values)
    result: dict[str, float | int | None] = {"n": len(ordered)}
    for q in PERCENTILES:
        result[f"p{q}"] = percentile(ordered, q) if ordered else None
    result["mean"] = _mean(ordered) if ordered else None
    return result


def spread(values: Iterable[float]) -> dict[str, float | int | None]:
    """`mean`, `min`, `max` and `n` of one figure over repetitions; all None but n when empty."""
    numbers = [float(value) for value in values]
    if not numbers:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": _mean(numbers), "min": min(numbers), "max": max(numbers), "n": len(numbers)}


# -- Student's t, for Welch's test --------------------------------------------------------


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by the continued fraction of Numerical Recipes (6.4) with Lentz's method."""
    if a <= 0 or b <= 0:
        raise ValueError(f"incomplete beta needs a, b > 0, got {a}, {b}")
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    # The fraction converges fast only below the mean of the beta distribution; above it,
    # use the symmetry I_x(a, b) = 1 - I_{1-x}(b, a).
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_continued_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(1.0 - x, b, a) / b


def _beta_continued_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300
    epsilon = 1e-15

    def guarded(value: float) -> float:
        return tiny if abs(value) < tiny else value

    c = 1.0
    d = 1.0 / guarded(1.0 - (a + b) * x / (a + 1.0))
    fraction = d
    for m in range(1, 10_000):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 / guarded(1.0 + even * d)
        c = guarded(1.0 + even / c)
        fraction *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 / guarded(1.0 + odd * d)
        c = guarded(1.0 + odd / c)
        step = d * c
        fraction *= step
        if abs(step - 1.0) < epsilon:
            return fraction
    raise ArithmeticError(f"incomplete beta did not converge for x={x}, a={a}, b={b}")


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (df need not be an integer)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5)
    return 1.0 - tail if t > 0 else tail


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|): the two-sided p-value of a t statistic."""
    if math.isinf(t):
        return 0.0
    # Computed directly rather than as 2 * (1 - cdf), which loses small p-values to rounding.
    return regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5)


class TTest(NamedTuple):
    t: float
    df: float
    p_value: float


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Welch's two-sample t-test (unequal variances), two-sided; each side needs n >= 2.

    With no variance on either side the test degenerates: equal means give p = 1,
    different ones p = 0 (every value of one side differs from every value of the other).
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's test needs at least two values per side, got {len(a)} and {len(b)}")
    difference = _mean(b) - _mean(a)
    error_a = statistics.variance(a) / len(a)
    error_b = statistics.variance(b) / len(b)
    standard_error_squared = error_a + error_b
    if standard_error_squared == 0:
        if difference == 0:
            return TTest(0.0, math.inf, 1.0)
        return TTest(math.copysign(math.inf, difference), math.inf, 0.0)
    t = difference / math.sqrt(standard_error_squared)
    df = standard_error_squared**2 / (error_a**2 / (len(a) - 1) + error_b**2 / (len(b) - 1))
    return TTest(t, df, student_t_two_sided_p(t, df))


# -- two samples ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Comparison:
    """What `compare(a, b)` concluded about B against A, and why, in a sentence."""

    verdict: str  # "indistinguishable" | "different"
    ratio: float | None  # mean(b) / mean(a); None when mean(a) is 0
    low: float | None  # 95% bootstrap interval of the ratio; None when a side has n = 1 or mean(a) is 0
    high: float | None
    p_value: float | None  # Welch's t-test, two-sided; None when a side has n = 1
    reason: str
    difference: float  # mean(b) - mean(a): what a score comparison quotes
    difference_low: float | None  # 95% bootstrap interval of the difference
    difference_high: float | None
    n_a: int
    n_b: int

    @property
    def different(self) -> bool:
        return self.verdict == "different"


def compare(a: Sequence[float], b: Sequence[float], *, seed: int = 0, resamples: int = 10_000) -> Comparison:
    """Compare per-repetition figures of B against A.

    "indistinguishable" when the min-max spreads overlap or Welch's test finds no
    difference at 95% (p >= 0.05), and always when a side has a single value (one run
    can't be told from noise); otherwise "different", with B/A and its 95% bootstrap
    interval (percentile method, each side resampled with replacement, seeded so the
    same data always give the same interval).
    """
    a = [float(value) for value in a]
    b = [float(value) for value in b]
    if not a or not b:
        raise ValueError(f"compare needs at least one value on each side, got {len(a)} and {len(b)}")
    mean_a, mean_b = _mean(a), _mean(b)
    ratio = mean_b / mean_a if mean_a != 0 else None
    difference = mean_b - mean_a
    shared = dict(ratio=ratio, difference=difference, n_a=len(a), n_b=len(b))

    if len(a) < 2 or len(b) < 2:
        lonely = " and ".join(side for side, values in (("A", a), ("B", b)) if len(values) < 2)
        reason = (
            f"{lonely} {'has' if ' and ' not in lonely else 'have'} a single run (n = {len(a)} vs {len(b)}), "
            "and one run can't be told apart from run-to-run noise: repeat it (--reps 3)"
        )
        return Comparison("indistinguishable", low=None, high=None, p_value=None, reason=reason,
                          difference_low=None, difference_high=None, **shared)

    test = welch_t_test(a, b)
    (low, high), (difference_low, difference_high) = _bootstrap(a, b, seed=seed, resamples=resamples)
    if ratio is None:  # no ratio to bound; the difference still has its interval
        low = high = None
    interval = dict(low=low, high=high, difference_low=difference_low, difference_high=difference_high)
    effect = _effect_text(ratio, low, high, difference, difference_low, difference_high)
    p_text = _p_text(test.p_value)
    ranges = f"{_range(min(a), max(a))} vs {_range(min(b), max(b))}"

    if max(min(a), min(b)) <= min(max(a), max(b)):
        reason = f"the min-max spreads overlap ({ranges}); {p_text}"
        return Comparison("indistinguishable", p_value=test.p_value, reason=reason, **interval, **shared)
    if test.p_value >= SIGNIFICANCE:
        reason = f"{p_text}, no difference at 95% although the min-max spreads don't overlap ({ranges})"
        return Comparison("indistinguishable", p_value=test.p_value, reason=reason, **interval, **shared)
    if math.isinf(test.df):  # both sides constant: the t statistic is infinite, and saying p = 0 would hide why
        p_text = "neither side varies from run to run"
    return Comparison("different", p_value=test.p_value, reason=f"{p_text}; {effect}", **interval, **shared)


def _bootstrap(
    a: Sequence[float], b: Sequence[float], *, seed: int, resamples: int
) -> tuple[tuple[float, float], tuple[float, float]]:
    """95% percentile intervals of mean(b)/mean(a) and mean(b) - mean(a) over resamples."""
    if resamples < 1:
        raise ValueError(f"resamples must be positive, got {resamples}")
    generator = random.Random(seed)
    ratios: list[float] = []
    differences: list[float] = []
    for _ in range(resamples):
        mean_a = sum(generator.choices(a, k=len(a))) / len(a)
        mean_b = sum(generator.choices(b, k=len(b))) / len(b)
        differences.append(mean_b - mean_a)
        if mean_a != 0:
            ratios.append(mean_b / mean_a)
        else:  # a resample of only zeros: the ratio is unbounded that way
            ratios.append(math.copysign(math.inf, mean_b) if mean_b != 0 else 1.0)
    tail = (1 - CONFIDENCE) / 2 * 100
    ratios.sort()
    differences.sort()
    return (
        (percentile(ratios, tail), percentile(ratios, 100 - tail)),
        (percentile(differences, tail), percentile(differences, 100 - tail)),
    )


def _figure(value: float) -> str:
    """A measured value for a sentence: 19.0, 2370, 0.0123."""
    if value == 0 or abs(value) >= 1000:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _range(low: float, high: float) -> str:
    separator = " to " if low < 0 or high < 0 else "-"
    return f"{_figure(low)}{separator}{_figure(high)}"


def _ratio_figure(value: float, decimals: int = 2) -> str:
    return f"{value:.{decimals}f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"


def _interval_decimals(*values: float) -> int:
    """Enough decimals (2 to 4) that a ratio and its narrow interval's ends don't print as the same number."""
    for decimals in (2, 3):
        if len({_ratio_figure(value, decimals) for value in values}) == len(set(values)):
            return decimals
    return 4


def _p_text(p_value: float) -> str:
    return "p < 0.001" if p_value < 0.001 else f"p = {p_value:.2g}"


def _effect_text(
    ratio: float | None, low: float | None, high: float | None,
    difference: float, difference_low: float, difference_high: float,
) -> str:
    if ratio is not None and low is not None and high is not None:
        decimals = _interval_decimals(low, ratio, high)
        shown = [_ratio_figure(value, decimals) for value in (ratio, low, high)]
        return f"B/A = {shown[0]} (95% CI {shown[1]}-{shown[2]})"
    return f"B - A = {_figure(difference)} (95% CI {_range(difference_low, difference_high)})"
