"""What the fleet hands a request: a lease on a ready backend's run, or the reason it cannot have one."""

from __future__ import annotations

from dataclasses import dataclass

from swaplab.config.model import ModelConfig
from swaplab.errors import BackendStartError, SwaplabError
from swaplab.fleet.backend import Backend, Run


class PlacementRefused(BackendStartError):
    """The model can never start as things stand: a claim too big, a persistent model in the way, memory taken."""


class BackendUnavailable(SwaplabError):
    """The model is crash-looping and in its back-off window."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class OverCapacity(SwaplabError):
    """The model already holds `concurrencyLimit` requests, queued or in flight."""

    retry_after = 1.0


@dataclass(eq=False, slots=True)
class Lease:
    """One admitted request (or `/load`) on one run of a ready backend.

    Its backend's `model` is the config entry it runs: a reload while the request was
    queued does not mix the old entry's filters with the new entry's server.
    """

    backend: Backend
    run: Run
    completed: bool = False
    released: bool = False
    waited_for: str | None = None
    """`start` or `wake` when the request was queued while its model got ready; None when it was ready."""
    fallback: str = ""
    """Why the model was started cold while this request waited, when a wake failed ("" otherwise)."""

    @property
    def model(self) -> ModelConfig:
        return self.backend.model
