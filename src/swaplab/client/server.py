"""Who is serving: the backend's kind and version as it reports them, a swaplab router's entry, the context.

Each engine says who it is in its own way: llama.cpp's `GET /props` (`build_info`),
vLLM's `GET /version`, SGLang's `GET /get_server_info` (`/server_info` in newer
releases); all three put `owned_by` in `/v1/models`. A swaplab router answers
`GET /api/models` with each entry's `config_hash`, and reaches the backend's own
endpoints through `/upstream/<model>/...`.

`ServerProbe` asks, and keeps what it learnt; the client (`http.OpenAIClient`) holds one
and reaches the server's JSON endpoints for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from swaplab.client.errors import ServerAnswerError, TokenizeUnavailableError
from swaplab.errors import UnknownModelError

# owned_by in /v1/models -> the kind recorded with results.
KIND_BY_OWNER = {"llamacpp": "llama.cpp", "vllm": "vllm", "sglang": "sglang", "swaplab-sim": "swaplab-sim"}


@dataclass(frozen=True)
class ServerInfo:
    """What a bench run records about its target."""

    url: str
    model: str  # the name requests carry, as the user gave it
    model_id: str  # a router's id for it (aliases resolved); else the name the server lists
    alias: str | None  # the name given, when it is an alias of model_id
    backend_kind: str | None  # "llama.cpp", "vllm", "sglang", "swaplab-sim"; None when it didn't say
    backend_version: str | None
    router: bool  # reached through a swaplab router
    config_hash: str | None  # the router's fingerprint of the model's resolved entry
    context_tokens: int | None  # the longest prompt + answer one request may have, as the server reports it
    known_models: tuple[str, ...]
    upstream_prefix: str  # where the backend's own endpoints are: "" direct, "/upstream/<id>" via a router


class JsonEndpoints(Protocol):
    """What probing needs of a client: its address and plain JSON requests."""

    base_url: str

    async def get_json(self, path: str) -> tuple[int, Any]: ...

    async def post_json(self, path: str, body: Any) -> tuple[int, Any]: ...


class ServerProbe:
    """Who serves what at one server, asked once per model, and how its `/tokenize` takes a body."""

    def __init__(self, client: JsonEndpoints):
        self._client = client
        self._info: dict[str | None, ServerInfo] = {}
        self.tokenize_shape: str | None = None  # the /tokenize body shape that worked, once known

    async def server_info(self, model: str | None) -> ServerInfo:
        """`identify`, cached per model."""
        if model not in self._info:
            self._info[model] = await identify(self._client, model)
        return self._info[model]

    async def tokenize(self, text: str, model: str | None) -> list[int]:
        """Token ids from the backend's `/tokenize`: llama.cpp's `{"content"}` or vLLM/SGLang's `{"prompt"}`."""
        client = self._client
        info = await self.server_info(model)
        path = f"{info.upstream_prefix}/tokenize"
        shapes = {
            "content": {"content": text, "add_special": False},
            "prompt": {"prompt": text, "add_special_tokens": False},
        }
        order = ["prompt", "content"] if info.backend_kind in ("vllm", "sglang") else ["content", "prompt"]
        if self.tokenize_shape is not None:
            order = [self.tokenize_shape]
        last = None
        for shape in order:
            status, document = await client.post_json(path, shapes[shape])
            if status == 200 and isinstance(document, dict):
                tokens = document.get("tokens")
                if isinstance(tokens, list):
                    self.tokenize_shape = shape
                    return [token if isinstance(token, int) else token.get("id") for token in tokens]
            if status in (404, 405, 501):
                break  # no such endpoint: the other shape can't help
            last = status
        raise TokenizeUnavailableError(
            f"{client.base_url}{path} does not tokenize (HTTP {last if last is not None else status})"
        )


async def identify(client: JsonEndpoints, model: str | None) -> ServerInfo:
    """Find `model` on the server (the only model when None) and ask the backend who it is."""
    status, document = await client.get_json("/api/models")
    if status == 200 and isinstance(document, dict) and isinstance(document.get("models"), list):
        return await _through_router(client, model, document["models"])
    return await _direct(client, model)


async def _through_router(client: JsonEndpoints, model: str | None, entries: list[dict[str, Any]]) -> ServerInfo:
    known: list[str] = []
    by_name: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for name in (entry.get("id"), *(entry.get("aliases") or ())):
            if isinstance(name, str) and name not in by_name:
                by_name[name] = entry
                known.append(name)
    if model is None:
        ids = [entry["id"] for entry in entries if not entry.get("unlisted")]
        if len(ids) != 1:
            raise ServerAnswerError(f"{client.base_url} serves {len(ids)} models; name one with --model ({', '.join(ids)})")
        model = ids[0]
    entry = by_name.get(model)
    if entry is None:
        raise UnknownModelError(model, known)
    if entry.get("peer") and not entry.get("available", True):
        raise ServerAnswerError(f"model {model!r} is a peer the router marks unavailable: {entry.get('reason')}")
    model_id = entry["id"]
    prefix = f"/upstream/{model_id}"
    backend = await _backend(client, prefix)
    return ServerInfo(
        url=client.base_url,
        model=model,
        model_id=model_id,
        alias=model if model != model_id else None,
        backend_kind=backend.kind,
        backend_version=backend.version,
        router=True,
        config_hash=entry.get("config_hash"),
        context_tokens=backend.context,
        known_models=tuple(known),
        upstream_prefix=prefix,
    )


async def _direct(client: JsonEndpoints, model: str | None) -> ServerInfo:
    backend = await _backend(client, "")
    if backend.models_status != 200:
        raise ServerAnswerError(
            f"{client.base_url}/v1/models answered {backend.models_status}: is this an OpenAI-compatible server?",
            backend.models_status,
        )
    ids = list(backend.model_ids)
    if model is None:
        if len(ids) != 1:
            raise ServerAnswerError(f"{client.base_url} serves {len(ids)} models; name one with --model ({', '.join(ids)})")
        model = ids[0]
    if ids and model not in ids and model not in backend.aliases:
        raise UnknownModelError(model, ids)
    return ServerInfo(
        url=client.base_url,
        model=model,
        model_id=model,
        alias=None,
        backend_kind=backend.kind,
        backend_version=backend.version,
        router=False,
        config_hash=None,
        context_tokens=backend.context,
        known_models=tuple(ids),
        upstream_prefix="",
    )


@dataclass
class _Backend:
    models_status: int = 0
    model_ids: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    kind: str | None = None
    version: str | None = None
    context: int | None = None


async def _backend(client: JsonEndpoints, prefix: str) -> _Backend:
    backend = _Backend()
    status, document = await client.get_json(f"{prefix}/v1/models")
    backend.models_status = status
    data = document.get("data") if isinstance(document, dict) else None
    if status != 200 or not isinstance(data, list):
        return backend
    backend.model_ids = tuple(entry["id"] for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str))
    backend.aliases = tuple(
        alias for entry in data if isinstance(entry, dict) for alias in entry.get("aliases") or () if isinstance(alias, str)
    )
    first = data[0] if data and isinstance(data[0], dict) else {}
    backend.kind = KIND_BY_OWNER.get(str(first.get("owned_by", "")).lower())
    backend.context = _positive(first.get("max_model_len"))  # vLLM, SGLang

    if backend.kind in (None, "llama.cpp"):
        status, props = await client.get_json(f"{prefix}/props")
        if status == 200 and isinstance(props, dict) and "build_info" in props:
            backend.kind = "llama.cpp"
            backend.version = str(props["build_info"])
            settings = props.get("default_generation_settings") or {}
            backend.context = _positive(settings.get("n_ctx")) or backend.context  # one slot's share
            return backend
    if backend.kind in (None, "vllm"):
        status, version = await client.get_json(f"{prefix}/version")
        if status == 200 and isinstance(version, dict) and isinstance(version.get("version"), str):
            backend.kind = backend.kind or "vllm"
            backend.version = version["version"]
            return backend
    if backend.kind in (None, "sglang"):
        for path in ("/get_server_info", "/server_info"):
            status, info = await client.get_json(f"{prefix}{path}")
            if status == 200 and isinstance(info, dict) and "version" in info:
                backend.kind = "sglang"
                backend.version = str(info["version"])
                backend.context = backend.context or _positive(info.get("context_length"))
                return backend
    return backend


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
