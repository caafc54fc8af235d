"""llama-swap's profiles: while one is active, a requested name that is one of its pins routes to the pin's target.

The active profile is the router's one piece of state here (`ProfileSwitch`): none at
start and after every reload, changed by `PUT /api/profiles/active`. Pins do not chain,
and a pin whose target is empty is disabled (the request answers 404, as llama-swap's).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from swaplab.config.model import Config

log = logging.getLogger("swaplab.router")


class ProfileSwitch:
    """Which profile is active. Only `activate` and `reset` change it."""

    def __init__(self) -> None:
        self.active: str | None = None

    def reset(self) -> None:
        """A reload: llama-swap starts every config with no profile active."""
        self.active = None

    def pins(self, config: Config) -> dict[str, str] | None:
        """The active profile's pins, or None when none is active (or it left the config)."""
        if self.active is None:
            return None
        profile = config.profiles.get(self.active)
        return profile.pins if profile is not None else None

    def activate(self, config: Config, body: bytes) -> tuple[int, str | dict[str, Any]]:
        """`PUT /api/profiles/active`: (200, `{"active": ...}`) or (status, llama-swap's error message)."""
        request = parse_activation(body)
        if isinstance(request, ActivationError):
            return request.status, request.message
        if request is not None and request not in config.profiles:
            return 404, f"profile {json.dumps(request, ensure_ascii=False)} not found"
        if request != self.active:
            log.info("active profile changed to %s", json.dumps(request or "", ensure_ascii=False))
        self.active = request
        return 200, {"active": request}


@dataclass(frozen=True)
class ActivationError:
    status: int
    message: str


def parse_activation(body: bytes) -> str | None | ActivationError:
    """The profile a `PUT /api/profiles/active` body names (None: deactivate), or why it names none."""
    # Like Go's json.Decoder: the first JSON value counts, whatever follows it; `null` is an empty object.
    text = body.decode(errors="replace").lstrip()
    try:
        document, _ = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json reads
        return ActivationError(400, "invalid profile request")
    if document is None:
        document = {}
    if not isinstance(document, dict):
        return ActivationError(400, "invalid profile request")
    if "name" not in document:
        return ActivationError(400, "profile name is required")
    name = document["name"]
    if name is None or name == "":
        return None
    if not isinstance(name, str):
        return ActivationError(400, "profile name must be a string or null")
    return name


def upstream_pin(pins: dict[str, str], tail: str) -> tuple[str, str] | None:
    """`/upstream/<tail>`: the longest pin that is the tail or a prefix of it up to a `/`, and its target."""
    matched: tuple[str, str] | None = None
    for pin, target in pins.items():
        if (tail == pin or tail.startswith(pin + "/")) and (matched is None or len(pin) > len(matched[0])):
            matched = (pin, target)
    return matched


def listing(config: Config, active: str | None) -> dict[str, Any]:
    """`GET /api/profiles`: the active one and every profile, sorted by id."""
    return {
        "active": active if active in config.profiles else None,
        "profiles": [
            {"id": profile.id, "description": profile.description, "pins": dict(profile.pins)}
            for profile in sorted(config.profiles.values(), key=lambda profile: profile.id)
        ],
    }
