"""What `swaplab launch doctor` reports: one finding per check and node, and the small helpers
its checks share."""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Finding:
    """One check on one node: passed or not, what was seen, and how to fix a failure."""

    host: str
    check: str
    ok: bool
    detail: str
    fix: str = ""


def last_line(text: str) -> str:
    """The last non-blank line of `text`, its whitespace runs made single spaces."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return re.sub(r"\s+", " ", lines[-1]) if lines else ""
