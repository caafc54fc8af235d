"""Debian's headless Chromium driven by Playwright: the launch every browser test shares.

Playwright's own browser download cannot work offline, so the tests drive Debian's
Chromium, with the flags that keep it from reaching for the network at every start.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def require_chromium() -> None:
    """Skip the calling test module where Chromium is missing (never in CI, where it must be there)."""
    if not CHROMIUM.exists() and not os.environ.get("CI"):
        pytest.skip(
            "the browser test needs Debian's chromium at /usr/bin/chromium (`make system-deps`, as root)",
            allow_module_level=True,
        )


def launch(playwright):
    """Chromium, headless, offline."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)


def console_errors(page) -> list[str]:
    """A list that fills with the page's console errors and uncaught exceptions as they happen."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    return errors
