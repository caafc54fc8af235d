"""Which server a request goes to: model name extraction and resolution, no I/O."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

import orjson
from aiohttp import web

from swaplab.config.model import Config, PeerConfig
from swaplab.errors import SwaplabError
from swaplab.router.door.responses import error_response
from swaplab.router.door.routes import MODEL_GET_ROUTES, MODEL_ROUTES
from swaplab.router.path.multipart import MalformedForm, form_fields

# Routes whose requests reach the model's server under another path, as llama-swap sends
# them: the versionless `/v/...` without its prefix, ACE-Step's task API under `/v1`.
UPSTREAM_PATHS = {
    "/audioapi/v1/tasks/run": "/v1/tasks/run",
    **{route: route.removeprefix("/v") for route in MODEL_ROUTES if route.startswith("/v/")},
}


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


@dataclass(frozen=True)
class Tracking:
    """What is kept of one request: an in-flight entry while it runs, an activity row (and capture) once done."""

    in_flight: bool = True
    activity: bool = True


def upstream_tracking(method: str, path: str) -> Tracking:
    """llama-swap's rule for `/upstream/<model><path>`: only the model routes are kept. In flight: a POST of
    one of `MODEL_ROUTES`, a GET of `MODEL_GET_ROUTES`; an activity row: a POST of either (its metrics take
    POSTs alone). The model's own page, its assets and the web page's Load button (`GET /upstream/<m>/`) are not."""
    posted = method == "POST" and (path in MODEL_ROUTES or path in MODEL_GET_ROUTES)
    in_flight = (method == "POST" and path in MODEL_ROUTES) or (method == "GET" and path in MODEL_GET_ROUTES)
    return Tracking(in_flight=in_flight, activity=posted)


FORM_URLENCODED = "application/x-www-form-urlencoded"
JSON = "application/json"
MULTIPART = "multipart/form-data"
# orjson's own bound on nesting: a body past it is refused, not read by json's fallback,
# whose recursion would end in a RecursionError.
MAX_JSON_DEPTH = 1024
# A body past this has its heavy parsing done in a thread, so the loop goes on answering meanwhile:
# a form's parts (`reads_off_loop`: up to 1,000 of header parsing), Ollama's images (`router.ollama`).
OFF_LOOP_BYTES = 64 * 1024


class UnreadableBody(SwaplabError):
    """A request body the router cannot read; `status` is the HTTP answer (400, or 415 for its Content-Type)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def reads_off_loop(content_type: str | None, body: bytes) -> bool:
    """Whether `model_from_body` should run in a thread: a form body past `OFF_LOOP_BYTES` (JSON never)."""
    return len(body) > OFF_LOOP_BYTES and _media(content_type) in (MULTIPART, FORM_URLENCODED)


def _media(content_type: str | None) -> str:
    return (content_type or "").partition(";")[0].strip().lower()


def model_from_body(content_type: str | None, body: bytes) -> tuple[str | None, dict | None]:
    """The `model` named by a JSON body, a multipart form or a urlencoded form; also the parsed JSON object, if any.

    JSON is read under `application/json`, a `+json` type, or no Content-Type at all (a
    script's client); forms under their two types. Any other Content-Type is refused
    (415): a browser sends `text/plain` to another site without asking first, so such a
    body must never reach a model as JSON. UnreadableBody says what is wrong.
    """
    if not body:
        return None, None
    if content_type != JSON:  # what nearly every client sends needs no look at its parameters
        media = _media(content_type)
        if media == MULTIPART:
            return _model_from_multipart(content_type or "", body), None
        if media == FORM_URLENCODED and body.lstrip()[:1] not in (b"{", b"["):
            return _form_fields(body).get("model"), None
        refuse_unless_json(content_type, body, forms=f" (or a form as {MULTIPART} or {FORM_URLENCODED})")
    document = parse_json(body)
    if isinstance(document, dict):
        model = document.get("model")
        return (model if isinstance(model, str) else None), document
    return None, None


def refuse_unless_json(content_type: str | None, body: bytes, forms: str = "") -> None:
    """UnreadableBody (415) unless the Content-Type says JSON (`application/json`, `+json`) or is absent.

    A page can send `text/plain` or a form's type to another site without a preflight, so a
    body under those types is never read as JSON; `forms` names what else the route reads.
    """
    media = _media(content_type)
    if media == FORM_URLENCODED and body.lstrip()[:1] in (b"{", b"["):  # curl -d's default type, on a JSON body
        raise UnreadableBody(
            415, "the body is JSON but its Content-Type is application/x-www-form-urlencoded (curl -d sends that "
            "unless told otherwise): send it as application/json, with curl -H 'Content-Type: application/json'",
        )
    if media and media != "application/json" and not (media.endswith("+json") and "/" in media):
        raise UnreadableBody(
            415, f"the body's Content-Type is {media}, which this route does not read: send JSON as application/json"
            f"{forms}",
        )


def parse_json(body: bytes) -> object:
    """The JSON document `body` holds; UnreadableBody (400) saying why when it holds none."""
    try:
        # Every request's body is parsed on its way to the first byte, and a 64k-token
        # prompt is 300 KB of JSON: orjson reads it in a fifth of json's time.
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        if error.msg.startswith("depth limit exceeded"):
            raise UnreadableBody(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    # What orjson refuses and json takes: NaN, Infinity, a number past a double, a lone
    # surrogate escape; json's messages also say better what is wrong with the rest.
    try:
        text = body.decode()
    except UnicodeDecodeError as error:
        raise UnreadableBody(
            400, f"the body is not UTF-8 (byte 0x{body[error.start]:02x} at offset {error.start})"
        ) from None
    try:
        document = json.loads(text)
        # A lone surrogate (`"\\ud800"`) is no character: nothing could write it out as UTF-8 again.
        json.dumps(document, ensure_ascii=False).encode()
    except json.JSONDecodeError as error:
        raise UnreadableBody(
            400, f"the body is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except UnicodeEncodeError:
        raise UnreadableBody(
            400, "the body holds a lone UTF-16 surrogate escape (\\ud800 to \\udfff), no character"
        ) from None
    except ValueError:  # an integer of more digits than Python converts
        raise UnreadableBody(
            400, f"a number in the body is too large (more than {sys.get_int_max_str_digits()} digits)"
        ) from None
    except RecursionError:
        raise UnreadableBody(400, "the body nests too deeply to read") from None
    return document


def _form_fields(body: bytes) -> dict[str, str]:
    """A urlencoded form's fields, the first value of each (Go's `FormValue`)."""
    fields: dict[str, str] = {}
    for key, value in parse_qsl(body.decode(errors="replace"), keep_blank_values=True):
        fields.setdefault(key, value)
    return fields


def _model_from_multipart(content_type: str, body: bytes) -> str | None:
    """The first `model` field's value; UnreadableBody (400) for a form `multipart.form_fields` refuses."""
    try:
        fields = form_fields(content_type, body)
    except MalformedForm as error:
        raise UnreadableBody(400, str(error)) from None
    for field in fields or ():
        if field.name == "model":
            return body[field.start:field.end].decode(errors="replace").strip()
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
    """The multipart body with form field `field` holding `value`; every other byte as it was.

    A body that is no readable form (an `/upstream/` request's, never read for its model) goes as it came."""
    try:
        fields = form_fields(content_type, body)
    except MalformedForm:
        return body
    pieces, done = [], 0
    for found in fields or ():
        if found.name == field:
            pieces += [body[done:found.start], value.encode()]
            done = found.end
    return b"".join([*pieces, body[done:]]) if pieces else body


def unknown_model(config: Config, name: str) -> web.Response:
    """404 for a model `config` does not know, listing the names it does."""
    available = known_names(config)
    return error_response(
        404,
        f"model {name!r} not found; available models: {', '.join(available) or '(none configured)'}",
        "model_not_found",
        available=available,
    )


async def renamed_form(content_type: str, body: bytes, name: str) -> bytes:
    """The form body with its `model` field holding `name`: in a thread for a large form, as it was read."""
    if reads_off_loop(content_type, body):
        return await asyncio.to_thread(replace_form_field, content_type, body, "model", name)
    return replace_form_field(content_type, body, "model", name)
