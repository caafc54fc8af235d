"""The one OpenAI streaming client everyone in swaplab shares (bench, grill)."""

from swaplab.client.errors import (
    ServerAnswerError,
    ServerUnreachableError,
    TokenizeUnavailableError,
)
from swaplab.client.http import OpenAIClient, base_url_of
from swaplab.client.result import RequestResult, WallClock
from swaplab.client.server import ServerInfo

__all__ = [
    "OpenAIClient",
    "RequestResult",
    "ServerAnswerError",
    "ServerInfo",
    "ServerUnreachableError",
    "TokenizeUnavailableError",
    "WallClock",
    "base_url_of",
]
