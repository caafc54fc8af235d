"""argparse types the commands share: comma-separated lists of numbers."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """`1,2,4` -> [1, 2, 4]."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None


def float_list(text: str) -> list[float]:
    """`0.1,0.5` -> [0.1, 0.5]."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
