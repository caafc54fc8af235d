"""Config tests' shared readers: a config text loaded as `test.yaml`, or its faults as (line, message)."""

from __future__ import annotations

import textwrap

import pytest

from swaplab.config import load_config_text
from swaplab.config.model import Config
from swaplab.errors import ConfigError


def load(text: str, environ: dict[str, str] | None = None) -> Config:
    """The config a (dedented) text resolves to, with only `environ` as the environment."""
    return load_config_text(textwrap.dedent(text), "test.yaml", environ=environ or {})


def faults_of(text: str, environ: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """The faults a text is refused with, as (line, message); the test fails if it loads."""
    with pytest.raises(ConfigError) as caught:
        load(text, environ)
    return [(fault.line, fault.message) for fault in caught.value.faults]
