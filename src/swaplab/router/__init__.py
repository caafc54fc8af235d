"""The OpenAI/Anthropic-compatible HTTP endpoint in front of the fleet."""
