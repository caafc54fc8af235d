"""How a figure reads on the site: a number, a spread over repetitions, a distribution."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any


def number(value: float | int | None) -> str:
    """78.2, 187.0, 2370, 0.52: as many digits as a reader can use; whole numbers of type int as they are."""
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def central(value: Any) -> float | None:
    """The number a figure stands for: itself, a spread's mean, a distribution's mean (else p50)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, Mapping):
        for key in ("mean", "p50"):
            if isinstance(value.get(key), (int, float)) and not isinstance(value.get(key), bool):
                return value[key]
    return None


def spread_range(value: Any) -> tuple[float, float] | None:
    """(min, max) of a spread over repetitions when they differ; None for a single value or no spread."""
    if not isinstance(value, Mapping):
        return None
    low, high = value.get("min"), value.get("max")
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)) or low == high:
        return None
    return low, high


def spread_text(value: Any) -> str:
    """`20.0 (19-21)` for a spread, the number alone when nothing varied; `-` when absent."""
    mean = central(value)
    if mean is None:
        return "-"
    bounds = spread_range(value)
    if bounds is None:
        # Nothing varied: a count (tasks passed, 6/6) reads as the whole number it is.
        return number(int(mean) if float(mean).is_integer() else mean)
    return f"{number(mean)} ({number(bounds[0])}–{number(bounds[1])})"


def repetitions(value: Any) -> int | None:
    return value.get("n") if isinstance(value, Mapping) and isinstance(value.get("n"), int) else None


def when(stamp: float | None) -> str:
    """A run's start, in local time, to the minute."""
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def backend(run: Mapping[str, Any]) -> str:
    kind, version = run.get("backend_kind"), run.get("backend_version")
    return " ".join(part for part in (kind, version) if part) or "-"
