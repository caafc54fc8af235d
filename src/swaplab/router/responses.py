"""The router's own answers: OpenAI-style JSON errors."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from swaplab.config.model import Config
from swaplab.router.targets import known_names


def error_response(status: int, message: str, kind: str = "invalid_request_error", **extra: Any) -> web.Response:
    """An OpenAI-style JSON error."""
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status)


def unknown_model(config: Config, name: str) -> web.Response:
    """404 for a model `config` does not know, listing the names it does."""
    available = known_names(config)
    return error_response(
        404,
        f"model {name!r} not found; available models: {', '.join(available) or '(none configured)'}",
        "model_not_found",
        available=available,
    )
