"""The resolved config: plain frozen data that the fleet and the router read.

Everything here is final: macros expanded, `${PORT}` assigned, `cmd` split into argv,
defaults applied. The loader (`swaplab.config.loader`) is the only producer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Timeouts:
    """Per-model or per-peer upstream timeouts, in seconds; None = no limit."""

    connect: float | None = None
    response_header: float | None = None
    idle_conn: float | None = None


@dataclass(frozen=True)
class Filters:
    strip_params: tuple[str, ...] = ()
    set_params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelConfig:
    id: str
    cmd: tuple[str, ...]
    """Final argv: comment lines dropped, continuations joined, macros expanded, shlex-split."""
    cmd_stop: tuple[str, ...] | None
    """argv for stopping; the literal token text `${PID}` is substituted by the fleet at stop time."""
    proxy: str
    check_endpoint: str
    """A path such as `/health`, `none` (ready once spawned) or `generate` (a real one-token completion)."""
    ttl: int = 0
    aliases: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    name: str = ""
    description: str = ""
    unlisted: bool = False
    use_model_name: str = ""
    concurrency_limit: int = 0
    unload_timeout: float = 10.0
    send_loading_state: bool = False
    heartbeat_interval: float = 10.0
    """swaplab: seconds a streaming client may wait for its first byte before heartbeats keep it alive; 0 = never."""
    metadata: dict[str, Any] = field(default_factory=dict)
    filters: Filters = field(default_factory=Filters)
    timeouts: Timeouts = field(default_factory=Timeouts)
    devices: tuple[int, ...] = ()
    vram_gib: dict[int, float] = field(default_factory=dict)
    raw_text: str = ""
    """The entry's text as written in the file, comments included (the catalogue shows it)."""
    line: int = 0
    """Line of the model's key in the file."""


@dataclass(frozen=True)
class GroupConfig:
    id: str
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class PeerConfig:
    id: str
    proxy: str
    api_key: str = ""
    models: tuple[str, ...] = ()
    filters: Filters = field(default_factory=Filters)
    timeouts: Timeouts = field(default_factory=lambda: Timeouts(response_header=60.0))
    probe: float = 0.0
    """Seconds between availability probes of each listed model; 0 = never probed."""


@dataclass(frozen=True)
class DeviceConfig:
    id: int
    name: str = ""
    vram_gib: float = 0.0


@dataclass(frozen=True)
class Config:
    path: str
    health_check_timeout: float = 120.0
    log_level: str = "info"
    start_port: int = 5800
    global_ttl: int = 0
    unload_timeout: float = 10.0
    api_keys: tuple[str, ...] = ()
    include_aliases_in_list: bool = False
    send_loading_state: bool = False
    heartbeat_interval: float = 10.0
    preload: tuple[str, ...] = ()
    models: dict[str, ModelConfig] = field(default_factory=dict)
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    peers: dict[str, PeerConfig] = field(default_factory=dict)
    devices: dict[int, DeviceConfig] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    """`FILE:LINE: message` for each unknown key (never fatal)."""
    notes: str | None = None
    """The catalogue's notes folder (`notes:`), relative paths already taken from the config file's folder."""

    def resolve_alias(self, name: str) -> str | None:
        """The model id `name` denotes (itself or through an alias), or None."""
        if name in self.models:
            return name
        for model in self.models.values():
            if name in model.aliases:
                return model.id
        return None

    def group_of(self, model_id: str) -> GroupConfig:
        """The group a model belongs to; models in no group form an implicit swap+exclusive group."""
        for group in self.groups.values():
            if model_id in group.members:
                return group
        return GroupConfig(id="(default)", members=tuple(m for m in self.models if not self._grouped(m)))

    def _grouped(self, model_id: str) -> bool:
        return any(model_id in g.members for g in self.groups.values())
