"""Which server a request goes to: model name extraction and resolution, no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP

import orjson

from swaplab.config.model import Config, PeerConfig

# The routes whose requests name a model and go to its server.
MODEL_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/audio/transcriptions",
    "/v1/audio/speech",
    "/v1/rerank",
    "/rerank",
    "/v1/reranking",
    "/infill",
    "/completion",
    "/reranking",
    "/v1/audio/voices",
    "/v1/images/generations",
    "/v1/images/edits",
    "/sdapi/v1/txt2img",
    "/sdapi/v1/img2img",
    "/audioapi/v1/tasks/run",
    "/v/chat/completions",
    "/v/responses",
    "/v/completions",
    "/v/messages",
    "/v/messages/count_tokens",
    "/v/embeddings",
    "/v/rerank",
    "/v/reranking",
)
# Routes whose requests reach the model's server under another path, as llama-swap sends
# them: the versionless `/v/...` without its prefix, ACE-Step's task API under `/v1`.
UPSTREAM_PATHS = {
    "/audioapi/v1/tasks/run": "/v1/tasks/run",
    **{route: route.removeprefix("/v") for route in MODEL_ROUTES if route.startswith("/v/")},
}
# The GET routes that name a model with ?model= (llama-swap's modelGetRoutes); a websocket
# upgrade on one is relayed to the model as under /upstream/.
MODEL_GET_ROUTES = ("/props", "/v1/audio/voices", "/sdapi/v1/loras")


def upstream_path(path: str, query_string: str) -> str:
    """Where a model route's request goes on the model's server: its path (rewritten where
    llama-swap rewrites it) and its query."""
    path = UPSTREAM_PATHS.get(path, path)
    return f"{path}?{query_string}" if query_string else path


@dataclass(frozen=True)
class LocalTarget:
    model_id: str


@dataclass(frozen=True)
class PeerTarget:
    peer: PeerConfig
    model: str
    """The name the peer knows the model by (without the `peer/` prefix)."""


Target = LocalTarget | PeerTarget


def resolve(config: Config, name: str) -> Target | None:
    """A local id or alias; else `<peer>/<model>`; else a bare name exactly one peer lists."""
    names = config.names
    local = names.local(name)
    if local is not None:
        return LocalTarget(local)
    peer_model = names.peer_model(name)
    if peer_model is None:
        return None
    peer_id, model = peer_model
    return PeerTarget(config.peers[peer_id], model)


def known_names(config: Config) -> list[str]:
    """Every name a client may use, for error messages."""
    names = []
    for model in config.models.values():
        names.append(model.id)
        names.extend(model.aliases)
    for peer in config.peers.values():
        names.extend(f"{peer.id}/{model}" for model in peer.models)
    return names


def split_upstream_path(config: Config, tail: str) -> tuple[str, str] | None:
    """`/upstream/<model>/<path>`: model names may hold `/` (peer models), so try the longest first."""
    parts = tail.split("/")
    for cut in range(len(parts), 0, -1):
        name = "/".join(parts[:cut])
        if resolve(config, name) is not None:
            return name, "/" + "/".join(parts[cut:])
    return None


FORM_URLENCODED = "application/x-www-form-urlencoded"


def model_from_body(content_type: str, body: bytes) -> tuple[str | None, dict | None]:
    """The `model` named by a JSON body, a multipart form or a urlencoded form; also the parsed JSON object, if any.

    A body that parses as a JSON object is JSON whatever its Content-Type says: `curl -d`
    labels JSON as a urlencoded form unless told otherwise (llama-swap reads JSON only
    under `application/json`; docs/config.md, "differs").
    """
    if not body:
        return None, None
    if content_type.startswith("multipart/form-data"):
        return _model_from_multipart(content_type, body), None
    if body[:1] in (b"{", b" ", b"\n", b"\r", b"\t"):
        try:
            # Every request's body is parsed on its way to the first byte, and a 64k-token
            # prompt is 300 KB of JSON: orjson reads it in a fifth of json's time.
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            try:  # what orjson refuses and json takes: NaN, integers beyond 64 bits
                document = json.loads(body)
            except ValueError:
                return None, None
        if isinstance(document, dict):
            model = document.get("model")
            return (model if isinstance(model, str) else None), document
    if FORM_URLENCODED in content_type:
        return _form_fields(body).get("model"), None
    return None, None


def _form_fields(body: bytes) -> dict[str, str]:
    """A urlencoded form's fields, the first value of each (Go's `FormValue`)."""
    fields: dict[str, str] = {}
    for key, value in parse_qsl(body.decode(errors="replace"), keep_blank_values=True):
        fields.setdefault(key, value)
    return fields


def _model_from_multipart(content_type: str, body: bytes) -> str | None:
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    if not message.is_multipart():
        return None
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "model":
            payload = part.get_payload(decode=True)
            return payload.decode(errors="replace").strip() if payload is not None else None
    return None


def replace_form_field(content_type: str, body: bytes, field: str, value: str) -> bytes:
    """The form body (multipart or urlencoded) with field `field` holding `value`; other bodies unchanged."""
    if FORM_URLENCODED in content_type:
        pairs = parse_qsl(body.decode(errors="replace"), keep_blank_values=True)
        if not any(key == field for key, _ in pairs):
            return body
        return urlencode([(key, value if key == field else old) for key, old in pairs]).encode()
    return replace_multipart_field(content_type, body, field, value)


def replace_multipart_field(content_type: str, body: bytes, field: str, value: str) -> bytes:
    """The multipart body with form field `field` holding `value`; every other byte as it was."""
    boundary = _param(content_type, "content-type", "boundary")
    if not boundary:
        return body
    delimiter = b"--" + boundary.encode()
    pieces = body.split(delimiter)
    for index in range(1, len(pieces) - 1):  # between the preamble and the closing `--`
        head, separator, _ = pieces[index].partition(b"\r\n\r\n")
        if not separator:
            continue
        for line in head.split(b"\r\n"):
            name, colon, header = line.decode(errors="replace").partition(":")
            disposition = colon and name.strip().lower() == "content-disposition"
            if disposition and _param(header.strip(), "content-disposition", "name") == field:
                pieces[index] = head + separator + value.encode() + b"\r\n"
    return delimiter.join(pieces)


def _param(value: str, header: str, name: str) -> str | None:
    message = Message()
    message[header] = value
    found = message.get_param(name, header=header)
    return found if isinstance(found, str) else None
