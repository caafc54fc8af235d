"""Errors a user can cause. The CLI prints them without a traceback and exits 2."""

from __future__ import annotations

from dataclasses import dataclass


class SwaplabError(Exception):
    """A fault the user can fix (bad config, unknown model, unreachable host)."""

    exit_code = 2


@dataclass(frozen=True)
class Fault:
    """One problem in a config file, located by the line of the offending key."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class ConfigError(SwaplabError):
    """A config with one or more faults; `faults` lists all of them, in file order."""

    def __init__(self, faults: list[Fault], warnings: tuple[str, ...] = ()):
        self.faults = sorted(faults, key=lambda f: (f.file, f.line))
        self.warnings = warnings
        """`FILE:LINE: message` for each unknown key found on the way (never fatal)."""
        super().__init__("\n".join(str(f) for f in self.faults))


class BackendStartError(SwaplabError):
    """A backend could not be started or never became ready."""


class UnknownModelError(SwaplabError):
    """A request named a model that is neither a local id, an alias nor a peer model."""

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = known
        listing = ", ".join(known) if known else "(none configured)"
        super().__init__(f"model {name!r} not found; available models: {listing}")
