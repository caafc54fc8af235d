"""The resolved config: plain frozen data that the fleet and the router read.

Everything here is final: macros expanded, `${PORT}` assigned, `cmd` split into argv,
defaults applied. The loader (`swaplab.config.loader`) is the only producer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import platformdirs

from swaplab.config.matrixtree import MatrixNode, maximal_combinations
from swaplab.config.security import Security


@dataclass(frozen=True)
class Timeouts:
    """Per-model or per-peer upstream timeouts, in seconds; None = no limit."""

    connect: float | None = None
    response_header: float | None = None
    idle_conn: float | None = None
    keepalive: float | None = None
    """TCP keep-alive probe interval of upstream connections (llama-swap's default 30)."""
    tls_handshake: float | None = None
    """TLS handshake limit for https upstreams (llama-swap's default 10)."""
    expect_continue: float | None = None
    """How long a request sent with `Expect: 100-continue` waits for the go-ahead (default 1)."""


@dataclass(frozen=True)
class Filters:
    strip_params: tuple[str, ...] = ()
    set_params: dict[str, Any] = field(default_factory=dict)
    set_params_by_id: dict[str, dict[str, Any]] = field(default_factory=dict)
    """llama-swap's `setParamsByID`: requested name -> params applied after `set_params`
    (keys are dotted paths into the body). For a model, each key is also one of its aliases."""


@dataclass(frozen=True)
class Capabilities:
    """llama-swap's per-model `capabilities`, rendered in `/v1/models` as llama-swap renders them."""

    input: tuple[str, ...] = ()
    """Input modalities: text, audio, image."""
    output: tuple[str, ...] = ()
    tools: bool = False
    reranker: bool = False
    context: int = 0

    def __bool__(self) -> bool:
        return bool(self.input or self.output or self.tools or self.reranker or self.context)

    @property
    def chat(self) -> bool | None:
        """Whether the model chats, read as the page's playground reads it (`chatCapable`): True when it takes
        text in and gives text out; False when `capabilities` are written without saying so (a base model,
        as the built-in Gemma-3-270M's `{context: 4096}`); None when none are written, which says nothing."""
        if "text" in self.input and "text" in self.output:
            return True
        return False if self else None


@dataclass(frozen=True)
class SleepCall:
    """One HTTP call to the model's own server that puts it to sleep or wakes it."""

    method: str
    path: str
    """Path and query, as sent to the model's `proxy`."""
    body: Any = None
    """A JSON body, or None for none."""

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class SleepConfig:
    """swaplab's `sleep:` of a model: how to free its GPU without stopping its process (`config.sleep`)."""

    engine: str
    """`vllm`, `sglang` or `http` (the calls as written)."""
    level: int | None
    """vLLM's sleep level: 1 keeps the weights in host RAM, 2 drops them (reloaded from disk on wake)."""
    sleep_calls: tuple[SleepCall, ...]
    wake_calls: tuple[SleepCall, ...]
    host_memory_gib: float | None = None
    """RAM the sleeping process holds, as declared; None: measured once it sleeps."""
    timeout: float = 120.0
    """Seconds each sleep or wake call, and the readiness check after a wake, may take."""


@dataclass(frozen=True)
class HostMemory:
    """swaplab's top-level `hostMemory:`: how much RAM sleeping models may hold together."""

    budget_gib: float | None = None
    """Declared budget; None: sleep only while the system's available RAM stays above `headroom_gib`."""
    headroom_gib: float = 8.0


@dataclass(frozen=True)
class KvCacheConfig:
    """swaplab's `kvCache:` of a model: its llama.cpp slots saved on eviction, restored on return (issue 23).

    Only a model whose cache is on has one; `kvCache: false` or `enabled: false` reads as None.
    """

    min_tokens: int = 1024
    """A slot holding fewer tokens is not saved (re-reading it is cheaper than the file)."""
    save_timeout: float = 30.0
    """Seconds the saves may add to a stop; past them the server stops without its cache."""


KVCACHE_ENVIRONMENT_VARIABLE = "SWAPLAB_KVCACHE_DIR"


def default_kvcache_path() -> str:
    """Where saved KV caches live when the config names no `kvCache.path`: `$SWAPLAB_KVCACHE_DIR`,
    else the user data folder's kvcache/."""
    override = os.environ.get(KVCACHE_ENVIRONMENT_VARIABLE)
    if override:
        return os.path.abspath(os.path.expanduser(override))
    return str(Path(platformdirs.user_data_dir("swaplab")) / "kvcache")


@dataclass(frozen=True)
class KvCacheStore:
    """swaplab's top-level `kvCache:`: the one folder and budget every model's saved caches share."""

    path: str = field(default_factory=default_kvcache_path)
    """`~` expanded, a relative path already taken from the config file's folder."""
    budget_gib: float = 20.0
    """Disk all saved caches may hold together; the least recently used goes first."""


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
    capabilities: Capabilities = field(default_factory=Capabilities)
    ignore_websockets: bool = False
    """`compat.ignoreWebsockets`: websocket upgrades bypass admission and never start the model."""
    devices: tuple[int, ...] = ()
    vram_gib: dict[int, float] = field(default_factory=dict)
    sleep: SleepConfig | None = None
    """swaplab: put to sleep instead of stopped when a swap needs its GPU (`config.sleep`)."""
    api_key: str = ""
    """swaplab: the key the router's own calls to this server carry (`apiKey`); else read from its cmd."""
    kv_cache: KvCacheConfig | None = None
    """swaplab: save its KV cache when evicted, restore it on return (`config.kvcache`); None: off."""
    translate: dict[str, bool] = field(default_factory=dict)
    """swaplab: the APIs (`messages`, `responses`) its server lacks (true) or has (false); absent: learned."""
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
    translate: dict[str, bool] = field(default_factory=dict)
    """swaplab: the APIs (`messages`, `responses`) the peer lacks (true) or has (false); absent: learned."""


@dataclass(frozen=True)
class MatrixSet:
    """One named set of llama-swap's matrix, its DSL parsed (`config.matrix`)."""

    name: str
    expression: str
    """The DSL as written."""
    root: MatrixNode
    """The expression with vars resolved to model ids and each `+ref` replaced by the
    referenced set's tree (`config.matrixtree`)."""
    models: frozenset[str]
    """Every model id the expression mentions."""

    @cached_property
    def combinations(self) -> tuple[frozenset[str], ...]:
        """Every maximal combination of model ids the set lets run together (subset semantics:
        any subset of one may run), in the order the DSL produces them.

        Expanded on first use, and it can be huge (a product of ORs): the solver never
        expands it, it projects `root` onto the models in question.
        """
        return maximal_combinations(self.root, sorted(self.models))


@dataclass(frozen=True)
class MatrixConfig:
    """llama-swap's matrix router (`routing.router.settings.matrix`, or top-level `matrix`)."""

    sets: tuple[MatrixSet, ...]
    """In tie-break order: definition order, a set referenced with `+ref` ahead of its user."""
    evict_costs: dict[str, int] = field(default_factory=dict)
    """Model id -> cost of evicting it (1 when absent)."""
    vars: dict[str, str] = field(default_factory=dict)
    """Short name -> model id, as written."""


@dataclass(frozen=True)
class ProfileConfig:
    id: str
    description: str = ""
    pins: dict[str, str] = field(default_factory=dict)
    """Requested name -> the name it routes to while the profile is active; "" = disabled (404)."""


@dataclass(frozen=True)
class SelectorConfig:
    id: str
    strategy: str
    """`warm`, `pin` or `spillover`."""
    targets: tuple[str, ...]
    spillover: int = 1
    name: str = ""
    description: str = ""
    unlisted: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceConfig:
    id: int
    name: str = ""
    vram_gib: float = 0.0


@dataclass(frozen=True)
class ClaimEstimate:
    """A model's device claim estimated from its GGUF file, where the config declares none
    (config/estimates.py; docs/memory.md)."""

    claim: dict[int, float] | None
    """GiB per device id; None where no estimate could be made (`detail` says why)."""
    detail: str
    """The arithmetic (per device: weights + KV + compute), or why there is no estimate."""
    unreadable: str = ""
    """Why the model's file could not be read, where that is why (one of the config's warnings)."""


class Names:
    """What a requested name denotes in one config: a model (by id or alias) or a peer's model.

    The same rules as llama-swap's `RealModelName` and `ResolveBaseModel`: a local id or
    alias wins; then a peer's fully qualified `PEER/MODEL`; then a bare model name that
    exactly one peer lists. Profiles and selectors are resolved before these and are not
    names here. The loader checks a config with it; the router resolves every request
    through `Config.names`.
    """

    def __init__(self, models: dict[str, ModelConfig], peers: dict[str, PeerConfig]):
        self.model_ids = set(models)
        self.aliases: dict[str, str] = {}
        for model in models.values():
            for alias in model.aliases:
                self.aliases.setdefault(alias, model.id)
        self.qualified: dict[str, list[str]] = {}
        """`PEER/MODEL` -> the peers that produce that name (two is an ambiguity)."""
        self.bare: dict[str, list[str]] = {}
        for peer in peers.values():
            for name in dict.fromkeys(peer.models):
                self.qualified.setdefault(f"{peer.id}/{name}", []).append(peer.id)
                self.bare.setdefault(name, []).append(f"{peer.id}/{name}")

    def local(self, name: str) -> str | None:
        """The model id `name` denotes (its id or an alias), or None."""
        if name in self.model_ids:
            return name
        return self.aliases.get(name)

    def peer(self, name: str) -> str | None:
        """The `PEER/MODEL` a name denotes: itself when fully qualified, or the one peer listing it bare."""
        if len(self.qualified.get(name, ())) == 1:
            return name
        owners = self.bare.get(name, [])
        return owners[0] if len(owners) == 1 else None

    def base(self, name: str) -> str | None:
        """A local model id, else a peer's `PEER/MODEL`, else None (llama-swap's ResolveBaseModel)."""
        return self.local(name) or self.peer(name)

    def peer_model(self, name: str) -> tuple[str, str] | None:
        """The (peer id, the peer's own model name) a name denotes, or None."""
        qualified = self.peer(name)
        if qualified is None:
            return None
        peer_id = self.qualified[qualified][0]
        return peer_id, qualified[len(peer_id) + 1:]


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
    host_memory: HostMemory = field(default_factory=HostMemory)
    kv_cache_store: KvCacheStore = field(default_factory=KvCacheStore)
    """`kvCache:` at the top: where saved KV caches go and how much they may hold (docs/kvcache.md)."""
    router: str = "group"
    """`routing.router.use`: `group` (llama-swap's groups) or `matrix`."""
    matrix: MatrixConfig | None = None
    priority: dict[str, int] = field(default_factory=dict)
    """`routing.scheduler.settings.fifo.priority`: model id -> priority (0 when absent); a
    waiting request is queued ahead of every waiting request of strictly lower priority."""
    profiles: dict[str, ProfileConfig] = field(default_factory=dict)
    selectors: dict[str, SelectorConfig] = field(default_factory=dict)
    ignore_paths: tuple[str, ...] = (r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$",)
    """`upstream.ignorePaths` (regular expressions): `/upstream/<model>/<path>` matching one
    answers 409 while the model is not ready, instead of starting it."""
    log_time_format: str = ""
    log_to_stdout: str = "proxy"
    """`proxy`, `upstream`, `both` or `none`: which logs reach stdout (and `/logs`)."""
    log_requests: bool = False
    metrics_max_in_memory: int = 1000
    capture_buffer_mb: int = 5
    """`captureBuffer`: MiB of request/response captures kept; 0 = none."""
    store_path: str | None = None
    """`store.path`: the SQLite results store, when the config names one."""
    session_id_headers: tuple[str, ...] = ("X-Session-ID", "X-Litellm-Session-Id")
    """`ui.activity.session_id`: request headers that name a client's session."""
    performance_disabled: bool = False
    performance_every: float = 5.0
    """`performance.every`, seconds between samples of CPU, memory and GPU (at least 5)."""
    macros: tuple[tuple[str, Any], ...] = ()
    """The global `macros`, as declared (unexpanded) and in their order, as llama-swap keeps them."""
    warnings: tuple[str, ...] = ()
    """`FILE:LINE: message` for each unknown key (never fatal)."""
    security: Security = field(default_factory=Security)
    estimates: dict[str, ClaimEstimate] = field(default_factory=dict)
    """Device claims estimated from the model files, for models with none declared."""
    """`security:`: the Host and Origin policy and the request limits (docs/security.md)."""
    notes: str | None = None
    """The catalogue's notes folder (`notes:`), relative paths already taken from the config file's folder."""

    @cached_property
    def names(self) -> Names:
        """Its names, indexed once (a request resolves its model through them)."""
        return Names(self.models, self.peers)

    def resolve_alias(self, name: str) -> str | None:
        """The model id `name` denotes (itself or through an alias), or None."""
        return self.names.local(name)

    def group_of(self, model_id: str) -> GroupConfig:
        """The group a model belongs to; models in no group form an implicit swap+exclusive group."""
        for group in self.groups.values():
            if model_id in group.members:
                return group
        return GroupConfig(id="(default)", members=tuple(m for m in self.models if not self._grouped(m)))

    def _grouped(self, model_id: str) -> bool:
        return any(model_id in g.members for g in self.groups.values())
