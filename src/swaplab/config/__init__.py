"""llama-swap YAML configs (plus swaplab's keys), read into plain resolved data."""

from swaplab.config.loader import (
    config_sources,
    load_config,
    load_config_sources,
    load_config_text,
    load_default_config,
)
from swaplab.config.model import (
    Config,
    DeviceConfig,
    Filters,
    GroupConfig,
    ModelConfig,
    PeerConfig,
    Timeouts,
)

__all__ = [
    "Config",
    "DeviceConfig",
    "Filters",
    "GroupConfig",
    "ModelConfig",
    "PeerConfig",
    "Timeouts",
    "config_sources",
    "load_config",
    "load_config_sources",
    "load_config_text",
    "load_default_config",
]
