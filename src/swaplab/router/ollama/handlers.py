"""Ollama's routes on the router: listings answered here, generation sent down the OpenAI request path.

`/api/chat`, `/api/generate`, `/api/embed` and `/api/embeddings` are translated
(`translate`) and forwarded as OpenAI requests (`Forwarder.forward_reshaped`), so admission,
heartbeats, `sendLoadingState`, activity rows, captures, metrics and cancel on disconnect are
the OpenAI routes' own; the reply comes back in Ollama's shape (`replies`). An empty prompt
(or no messages) loads the model, or with `keep_alive: 0` unloads it, as Ollama does. The
model-management routes (`pull`, `push`, `create`, `copy`, `delete`, `blobs`) answer that
models live in the config file. `/api/version` is llama-swap's route (`router.api`), whose
answer carries Ollama's `version` field too.

A body past `OFF_LOOP_BYTES` (a 200 MiB image is seconds of parsing and base64) is parsed,
translated and encoded in a thread, a step at a time, so that the loop goes on answering
meanwhile and each step's input can be let go before the next; a smaller one stays on the loop.
orjson's parse and encode are each one call that holds the GIL: the loop still waits on those.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
import psutil
from aiohttp import web

from swaplab.errors import SwaplabError
from swaplab.fleet.lease import OverCapacity
from swaplab.router.ollama import listing
from swaplab.router.ollama.replies import ChatReply, EmbedReply, Reply, error_response, timestamp
from swaplab.router.ollama.translate import (
    CHAT_PATH,
    EMBEDDINGS_PATH,
    BadRequest,
    chat_request,
    embed_request,
    generate_request,
    keep_alive_seconds,
    model_name,
    streaming,
)
from swaplab.router.path.targets import (
    OFF_LOOP_BYTES,
    LocalTarget,
    PeerTarget,
    UnreadableBody,
    refuse_unless_json,
    resolve,
)

if TYPE_CHECKING:
    from swaplab.config.model import Config
    from swaplab.fleet import Fleet
    from swaplab.router.path.forward import Forwarder
    from swaplab.router.path.profiles import ProfileSwitch

log = logging.getLogger("swaplab.router")

GIB = 1024**3
MANAGED = ("pull", "push", "create", "copy")
_VERBS = {"pull": "download", "push": "upload", "create": "create", "copy": "copy", "delete": "delete",
          "blobs": "upload files for"}
EMPTY_DETAILS = {"parent_model": "", "format": "", "family": "", "families": [], "parameter_size": "",
                 "quantization_level": ""}
# Fleet states in which a model holds memory, as Ollama's `ps` lists its loaded runners.
LOADED_STATES = frozenset({"starting", "ready", "falling_asleep", "sleeping", "waking"})
_Result = TypeVar("_Result")


class Router(Protocol):
    """What these routes read of the router (`app.Router`)."""

    config: Config
    fleet: Fleet
    forwarder: Forwarder
    profiles: ProfileSwitch
    started: float

    def model_list(self) -> list[dict[str, Any]]: ...


class OllamaApi:
    def __init__(self, router: Router):
        self.router = router

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/tags", self.handle_tags)
        app.router.add_get("/api/ps", self.handle_ps)
        app.router.add_post("/api/show", self.handle_show)
        app.router.add_post("/api/chat", self.handle_chat)
        app.router.add_post("/api/generate", self.handle_generate)
        app.router.add_post("/api/embed", self.handle_embed)
        app.router.add_post("/api/embeddings", self.handle_embed)
        for name in MANAGED:
            app.router.add_post(f"/api/{name}", self.handle_managed)
        app.router.add_delete("/api/delete", self.handle_managed)
        app.router.add_route("HEAD", "/api/blobs/{digest}", self.handle_managed)
        app.router.add_post("/api/blobs/{digest}", self.handle_managed)

    # -- generation ---------------------------------------------------------------------

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, chat=True)

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, chat=False)

    async def _generation(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            document, large = await _read_json(request)
            requested = model_name(document)
            stream = streaming(document)
            keep_alive = keep_alive_seconds(document.get("keep_alive"))
            name = self._name(requested)
            if name is None:
                return self._not_found(requested)
            if chat:
                empty = document.get("messages") in (None, [])
            else:
                empty = not document.get("prompt") and not document.get("images")
            if empty:
                return await self._load(requested, name, keep_alive, chat)
            # Always streamed from the backend, whatever the client asked: its first token times the prompt's
            # evaluation apart from the reply's, where the backend reports no timings of its own.
            if chat:
                path, body = CHAT_PATH, await off_loop_if(large, chat_request, document, name, True)
            else:
                path, body = await off_loop_if(large, generate_request, document, name, True, self._chats(name))
            del document  # the client's images, once their data URLs are made: not held while the request runs
            encoded = await off_loop_if(large, _encoded, body)
        except UnreadableBody as refusal:
            return error_response(refusal.status, str(refusal))
        except BadRequest as error:
            return error_response(400, str(error))
        reply = ChatReply(requested, request.path, stream, keep_alive, generate=not chat)
        return await self._forward(request, reply, name, path, body, encoded)

    async def handle_embed(self, request: web.Request) -> web.StreamResponse:
        legacy = request.path == "/api/embeddings"
        try:
            document, large = await _read_json(request)
            requested = model_name(document)
            keep_alive = keep_alive_seconds(document.get("keep_alive"))
            name = self._name(requested)
            if name is None:
                return self._not_found(requested)
            body, inputs = await off_loop_if(large, embed_request, document, name, legacy)
            del document
            encoded = await off_loop_if(large, _encoded, body) if inputs else b""
        except UnreadableBody as refusal:
            return error_response(refusal.status, str(refusal))
        except BadRequest as error:
            return error_response(400, str(error))
        if not inputs:  # Ollama's answer to an empty prompt, without loading the model
            return web.json_response({"embedding": []})
        reply = EmbedReply(requested, request.path, keep_alive, legacy=legacy)
        return await self._forward(request, reply, name, EMBEDDINGS_PATH, body, encoded)

    async def _forward(
        self, request: web.Request, reply: Reply, name: str, path: str, body: dict[str, Any], encoded: bytes
    ) -> web.StreamResponse:
        response = await self.router.forwarder.forward_reshaped(request, reply, name, path, body, encoded)
        if response.prepared or response.status < 400 or not isinstance(response, web.Response):
            return response
        # The router's own refusal (unknown model, over capacity, a start that failed), in OpenAI's
        # shape: told again in Ollama's, with its status and Retry-After.
        answer = error_response(response.status, _message(response.body))
        if "Retry-After" in response.headers:
            answer.headers["Retry-After"] = response.headers["Retry-After"]
        return answer

    async def _load(self, requested: str, name: str, keep_alive: float | None, chat: bool) -> web.Response:
        """Ollama's empty request: load the model (`done_reason: load`), or with `keep_alive: 0` unload it."""
        fleet = self.router.fleet
        target = resolve(self.router.config, name)
        reason = "unload" if keep_alive == 0 else "load"
        if isinstance(target, LocalTarget):
            try:
                if reason == "unload":
                    await fleet.unload(target.model_id)
                else:
                    await fleet.load(target.model_id)
                    if keep_alive is not None:
                        fleet.keep_alive(target.model_id, keep_alive)
            except OverCapacity as error:
                answer = error_response(429, str(error))
                answer.headers["Retry-After"] = str(max(1, round(error.retry_after)))
                return answer
            except SwaplabError as error:
                return error_response(503, str(error))
        document: dict[str, Any] = {"model": requested, "created_at": timestamp()}
        if chat:
            document["message"] = {"role": "assistant", "content": ""}
        else:
            document["response"] = ""
        document.update({"done": True, "done_reason": reason})
        return web.json_response(document)

    def _chats(self, name: str) -> bool:
        """False for a local model whose config says it does not chat (`Capabilities.chat`); a peer's model or a
        selector's pick is the backend's to know."""
        config = self.router.config
        target = resolve(config, name)
        return not isinstance(target, LocalTarget) or config.models[target.model_id].capabilities.chat is not False

    def _name(self, requested: str) -> str | None:
        """The router's name for an Ollama model name: as given, else without Ollama's default `:latest` tag."""
        config = self.router.config
        pins = self.router.profiles.pins(config) or {}
        for candidate in (requested, requested.removesuffix(":latest")):
            if resolve(config, candidate) is not None or candidate in config.selectors or candidate in pins:
                return candidate
        return None

    def _not_found(self, requested: str) -> web.Response:
        return error_response(404, f"model {requested!r} not found; GET /api/tags lists the models this router serves "
                                   f"(from its config, {self.router.config.path})")

    # -- listings -------------------------------------------------------------------------

    async def handle_tags(self, request: web.Request) -> web.Response:
        """Every model `/v1/models` lists, in Ollama's shape."""
        config = self.router.config
        entries = self.router.model_list()
        models = await asyncio.to_thread(lambda: [self._tag(config, entry["id"]) for entry in entries])
        return web.json_response({"models": models})

    def _tag(self, config: Config, name: str) -> dict[str, Any]:
        target = resolve(config, name)
        info = listing.file_info(config.models[target.model_id]) if isinstance(target, LocalTarget) else None
        entry: dict[str, Any] = {
            "name": listing.ollama_name(name),
            "model": listing.ollama_name(name),
            "modified_at": timestamp(info.modified if info is not None else self.router.started),
            "size": info.size if info is not None else 0,
            "digest": info.digest if info is not None else listing.name_digest(name),
            "details": info.details if info is not None and info.details else EMPTY_DETAILS,
        }
        if isinstance(target, PeerTarget):
            entry["remote_model"] = target.model
        return entry

    async def handle_ps(self, request: web.Request) -> web.Response:
        """The models loaded now: memory (the process's resident set and its device claim), expiry, context."""
        config = self.router.config
        fleet = self.router.fleet
        running = [entry for entry in fleet.status() if entry["state"] in LOADED_STATES and entry["model"] in config.models]
        models = await asyncio.to_thread(lambda: [self._process(config, fleet, entry) for entry in running])
        models.sort(key=lambda model: model.pop("_expires"), reverse=True)  # Ollama's order: longest left first
        return web.json_response({"models": models})

    def _process(self, config: Config, fleet: Fleet, entry: dict[str, Any]) -> dict[str, Any]:
        model = config.models[entry["model"]]
        info = listing.file_info(model)
        vram = round(sum(amount for amount in entry.get("devices", {}).values() if amount) * GIB)
        resident = 0
        if entry.get("pid"):
            try:
                resident = psutil.Process(entry["pid"]).memory_info().rss
            except psutil.Error:
                resident = 0
        expires = fleet.expires_at(model.id)
        if expires is None:
            expires = time.time() + listing.FOREVER_SECONDS
        context = listing.command_facts(model).context or (info.context_length if info is not None else 0)
        document: dict[str, Any] = {
            "name": listing.ollama_name(model.id),
            "model": listing.ollama_name(model.id),
            "size": resident + vram or (info.size if info is not None else 0),
            "digest": info.digest if info is not None else listing.name_digest(model.id),
            "details": info.details if info is not None and info.details else EMPTY_DETAILS,
            "expires_at": timestamp(min(expires, 253402300799.0)),  # datetime's last second, 9999-12-31
            "size_vram": vram,
            "context_length": context,
            "_expires": expires,
        }
        return document

    async def handle_show(self, request: web.Request) -> web.Response:
        try:
            document, _ = await _read_json(request)
            requested = model_name(document)
        except UnreadableBody as refusal:
            return error_response(refusal.status, str(refusal))
        except BadRequest as error:
            return error_response(400, str(error))
        name = self._name(requested)
        config = self.router.config
        target = resolve(config, name) if name is not None else None
        if target is None:
            return self._not_found(requested)
        if isinstance(target, PeerTarget):
            return web.json_response({
                "modelfile": f"# {requested}: served by peer {target.peer.id!r} of {config.path}\n",
                "parameters": "", "template": "", "details": EMPTY_DETAILS, "model_info": {},
                "capabilities": ["completion"], "remote_model": target.model,
                "modified_at": timestamp(self.router.started),
            })
        model = config.models[target.model_id]
        info = await asyncio.to_thread(listing.file_info, model)
        context = listing.command_facts(model).context or (info.context_length if info is not None else 0)
        parameters = listing.parameters_text(model, context)
        source = info.path if info is not None else "(no model file: its command names none this router can read)"
        modelfile = (f"# Served by swaplab from {config.path}, entry {model.id!r}: edit the model there.\n"
                     f"FROM {source}\n")
        modelfile += "".join(f"PARAMETER {line}\n" for line in parameters.splitlines())
        return web.json_response({
            "modelfile": modelfile,
            "parameters": parameters,
            "template": info.template if info is not None else "",
            "details": info.details if info is not None and info.details else EMPTY_DETAILS,
            "model_info": info.model_info if info is not None else {},
            "capabilities": listing.capabilities(model, info),
            "modified_at": timestamp(info.modified if info is not None else self.router.started),
        })

    async def handle_managed(self, request: web.Request) -> web.Response:
        """pull, push, create, copy, delete, blobs: models are the config's, so these say where to go instead."""
        operation = request.path.split("/")[2]
        where = self.router.config.path
        message = (f"swaplab serves the models its config lists ({where}): to {_VERBS[operation]} a model, edit "
                   f"that file (the router reloads it on SIGHUP or with --watch-config); /api/{operation} is not "
                   "available here")
        return error_response(400, message)


def off_loop(body: bytes) -> bool:
    """Whether a request's parsing, translation and upstream encoding run in a thread: a body past
    `OFF_LOOP_BYTES`."""
    return len(body) > OFF_LOOP_BYTES


async def off_loop_if(large: bool, function: Callable[..., _Result], *arguments: Any) -> _Result:
    """`function(*arguments)`: in a thread for a large body, so that the loop goes on answering; else here."""
    if large:
        return await asyncio.to_thread(function, *arguments)
    return function(*arguments)


async def _read_json(request: web.Request) -> tuple[dict[str, Any], bool]:
    """The body's JSON object, and whether the body is large (`off_loop`); UnreadableBody says why there is none."""
    body = await request.read()
    # Ollama's clients send application/json; a text/plain body (a page's, cross-site) is never taken
    refuse_unless_json(request.headers.get("Content-Type"), body)
    if not body or body.isspace():  # `strip()`'s test without its copy of the body
        raise UnreadableBody(400, "the body is empty: send a JSON object")
    large = off_loop(body)
    try:
        document = await off_loop_if(large, orjson.loads, body)  # its depth limit: a bomb of brackets is a 400
    except orjson.JSONDecodeError as error:
        raise UnreadableBody(400, f"the body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise UnreadableBody(400, "the body must be a JSON object")
    return document, large


def _encoded(body: dict[str, Any]) -> bytes:
    """The upstream request's body as the forwarder sends it, encoded once; BadRequest for a value nested past
    orjson's depth (the client's doing)."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as error:
        raise BadRequest(f"the request cannot be sent on: {error} (a value nested too deeply?)") from None


def _message(body: Any) -> str:
    """The message of the router's OpenAI-shaped (or llama-swap's) error body."""
    try:
        document = json.loads(body)
    except (TypeError, ValueError):
        return body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return error if isinstance(error, str) else json.dumps(document)
