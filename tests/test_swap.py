"""The swap decision as a table: which running models must stop before a target starts."""

from __future__ import annotations

import pytest
from swapcases import CASES

from swaplab.fleet.swap import must_stop


@pytest.mark.parametrize("cfg, target, running, expected", CASES)
def test_must_stop(cfg, target, running, expected):
    assert must_stop(cfg, target, running) == expected
