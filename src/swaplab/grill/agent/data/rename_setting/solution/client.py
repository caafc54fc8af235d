"""Reads the billing client's settings."""

import json
from pathlib import Path

CONFIG = Path(__file__).with_name("config.json")


def load_settings(path=CONFIG):
    return json.loads(Path(path).read_text())


def timeout_seconds(path=CONFIG):
    """The request timeout in seconds."""
    return load_settings(path)["request_timeout_ms"] / 1000


def retries(path=CONFIG):
    return load_settings(path)["retries"]
