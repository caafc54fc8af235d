"""What can go wrong talking to a server, as errors a user can act on (the CLI prints them, exit 2)."""

from __future__ import annotations

from swaplab.errors import SwaplabError


class ServerUnreachableError(SwaplabError):
    """Nothing answers at the URL."""


class ServerAnswerError(SwaplabError):
    """The server answered, but not with what the request needed."""

    def __init__(self, message: str, status: int | None = None):
        self.status = status
        super().__init__(message)


class TokenizeUnavailableError(SwaplabError):
    """The server has no tokenizer endpoint this client understands."""
