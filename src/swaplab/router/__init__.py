"""The OpenAI/Anthropic-compatible HTTP endpoint in front of the fleet."""

from swaplab.router.app import Router

__all__ = ["Router"]
