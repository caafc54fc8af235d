"""The sim as one engine (`--engine vllm|sglang|llamacpp|tabby`): what that engine's release does
with the names, keys and routes a client sends, read from its contract (`swaplab.engines`).

The sim takes the engine's own spellings of the flags that change those answers
(`--served-model-name`, `--api-key`, `--admin-api-key`, `--enable-sleep-mode`, ...), and
refuses one the engine does not have, so a sim command is checked by `config check` exactly
as the engine's would be. Each answer (a 404 for another model, a 401 without the key, a
route that is not there) is the contract's, status and body.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from aiohttp import web

from swaplab.engines import Contract, contract
from swaplab.errors import SwaplabError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TABBY_TOKENS = "api_tokens.yml"


class EngineSettings(Protocol):
    """The part of the sim's settings this module reads (`SimSettings` has them)."""

    engine: str
    model: str
    served_model_names: tuple[str, ...]
    api_key: str | None
    admin_api_key: str | None
    switches: frozenset[str]
    sse_ping_interval: float | None


ENGINE_SWITCHES = (
    "--enable-sleep-mode", "--enable-tokenizer-info-endpoint", "--enable-memory-saver", "--enable-weights-cpu-backup",
    "--disable-auth",
)
"""The engines' on/off flags the sim reads; each engine accepts those its contract names."""


def contract_flags(facts: Contract) -> frozenset[str]:
    """Every flag the contract says changes what the sim answers."""
    flags = {*facts.served_name.flags, *facts.auth.flags}
    if facts.auth.admin is not None:
        flags |= set(facts.auth.admin.flags)
    flags |= set(getattr(facts.auth, "disable_flags", None) or ())
    if facts.stream.ping is not None:
        flags |= set(facts.stream.ping.flags)
    if facts.sleep is not None:
        flags |= set(facts.sleep.requires.flags)
        if facts.sleep.weights_back_requires is not None:
            flags |= set(facts.sleep.weights_back_requires.flags)
    for route in facts.routes:
        if route.requires is not None:
            flags |= set(route.requires.flags)
    return frozenset(flags)


def check_settings(settings: EngineSettings) -> Contract | None:
    """The engine's contract, once the engine flags given are ones it has; None for the generic sim."""
    given = [flag for flag, value in (
        ("--served-model-name", settings.served_model_names), ("--api-key", settings.api_key),
        ("--admin-api-key", settings.admin_api_key), ("--sse-ping-interval", settings.sse_ping_interval is not None),
    ) if value] + sorted(settings.switches)
    if settings.engine == "generic":
        if given:
            raise SwaplabError(f"sim: {', '.join(given)} is an engine's flag: give --engine vllm, sglang, llamacpp or tabby")
        return None
    facts = contract(settings.engine)
    foreign = [flag for flag in given if flag not in contract_flags(facts)]
    if foreign:
        raise SwaplabError(f"sim: {facts.name} {facts.release} has no {', '.join(foreign)} ({facts.read_from})")
    return facts


@dataclass(frozen=True)
class Keys:
    """The keys the engine was started with; "" where none."""

    api: str = ""
    admin: str = ""

    @property
    def any(self) -> bool:
        return bool(self.api or self.admin)


def engine_keys(settings: EngineSettings, facts: Contract, environ: Mapping[str, str], workdir: Path) -> Keys:
    """The keys as the engine reads them: its flags, then its environment; TabbyAPI's from
    `api_tokens.yml` in its working folder, written with new keys when missing (as it does)."""
    if facts.engine == "tabby":
        if "--disable-auth" in settings.switches:
            return Keys()
        return _tabby_tokens(workdir / TABBY_TOKENS)
    api = settings.api_key or next((environ[name] for name in facts.auth.env if environ.get(name)), "")
    return Keys(api, settings.admin_api_key or "")


def _tabby_tokens(path: Path) -> Keys:
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        document = {"api_key": secrets.token_hex(16), "admin_key": secrets.token_hex(16)}
        path.write_text(yaml.safe_dump(document))
    except (OSError, yaml.YAMLError) as error:
        raise SwaplabError(f"sim: {path}: {error}") from None
    if not isinstance(document, dict):
        raise SwaplabError(f"sim: {path}: expected api_key and admin_key")
    return Keys(str(document.get("api_key") or ""), str(document.get("admin_key") or ""))


class Personality:
    """One engine's answers to names, keys and routes, from its contract."""

    def __init__(self, settings: EngineSettings, facts: Contract, environ: Mapping[str, str] | None = None,
                 workdir: Path | None = None):
        self.settings = settings
        self.facts = facts
        self.environ = dict(os.environ if environ is None else environ)
        self.keys = engine_keys(settings, facts, self.environ, workdir or Path.cwd())
        self.served = settings.served_model_names or (settings.model,)
        self.ping_seconds = _ping_seconds(settings, facts, self.environ)
        """The server's ping interval (0 or less: none), for requests that do not set their own."""

    # -- routes ------------------------------------------------------------

    def has_route(self, method: str, path: str) -> bool:
        """Whether the engine serves `method path` as started: not absent from its release, and its
        route's required switches and environment present. A sleep route's flags say whether it frees
        memory, not whether it answers: only its environment counts."""
        if path in self.facts.absent:
            return False
        route = self.facts.route(method, path) or (self.facts.route("POST", path) if method == "*" else None)
        if route is None or route.requires is None:
            return True
        sleep_flags = set(self.facts.sleep.requires.flags) if self.facts.sleep is not None else set()
        for flag in route.requires.flags:
            if flag in ENGINE_SWITCHES and flag not in sleep_flags and flag not in self.settings.switches:
                return False
        return all(self.environ.get(name) == value for name, value in route.requires.env.items())

    # -- names -------------------------------------------------------------

    def unknown_model(self, model: Any) -> web.Response | None:
        """The engine's answer to a request naming a model it does not serve, or None."""
        refused = self.facts.served_name.unknown_model
        if self.facts.served_name.any_name_accepted or refused is None or not isinstance(model, str):
            return None
        if model in self.served:
            return None
        body = _fill(refused.body, model=model, served_names=", ".join(self.served))
        return web.json_response(body, status=refused.status)

    # -- streams -----------------------------------------------------------

    def ping_interval(self, body: Mapping[str, Any]) -> float:
        """Seconds of silence after which a stream gets the engine's ping (llama.cpp's `sse_ping_interval`):
        the request's own value, else the server's; 0 or less: none. Raises ValueError, with the message
        to answer, for a request's value the engine refuses."""
        ping = self.facts.stream.ping
        asked = body.get(ping.request_field) if ping is not None and ping.request_field else None
        if asked is None:
            return self.ping_seconds
        # The engine reads whole seconds; the sim takes fractions, so a test can wait milliseconds.
        if isinstance(asked, bool) or not isinstance(asked, (int, float)) or asked < -1:
            raise ValueError(f"'{ping.request_field}' must be a number of seconds, or -1 for no pings")  # type: ignore[union-attr]
        return float(asked)

    # -- keys --------------------------------------------------------------

    @web.middleware
    async def auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse a request without the key its route needs, as the engine does."""
        if request.method == "OPTIONS" or request.path.startswith("/sim/") or not self.keys.any:
            return await handler(request)
        if self._allowed(request):
            return await handler(request)
        admin = self.facts.auth.admin
        refused = self.facts.auth.refused
        if admin is not None and admin.refused is not None and request.path in admin.routes:
            refused = admin.refused
        status = refused.status if refused is not None else 401
        return web.json_response(refused.body if refused is not None else {"error": "Unauthorized"}, status=status)

    def _allowed(self, request: web.Request) -> bool:
        path = request.path
        auth = self.facts.auth
        if path in auth.unprotected or (auth.open_prefixes and path.startswith(auth.open_prefixes)):
            return True
        if auth.guarded_prefixes and not path.startswith(auth.guarded_prefixes):
            return True
        admin_routes = auth.admin.routes if auth.admin is not None else ()
        sent = _bearer(request.headers.get("Authorization", ""))
        if self.facts.engine == "tabby":
            if path in admin_routes:
                return request.headers.get("x-admin-key", sent) == self.keys.admin
            offered = request.headers.get("x-api-key", sent)
            return offered in (self.keys.api, self.keys.admin)
        if path in admin_routes and self.keys.admin:
            return sent == self.keys.admin
        if path in admin_routes:
            return sent == self.keys.api
        return not self.keys.api or sent == self.keys.api


def _ping_seconds(settings: EngineSettings, facts: Contract, environ: Mapping[str, str]) -> float:
    """The ping interval as the engine reads it: its flag, else its environment, else its default."""
    ping = facts.stream.ping
    if ping is None:
        return 0.0
    if settings.sse_ping_interval is not None:
        return settings.sse_ping_interval
    for name in ping.env:
        value = environ.get(name)
        if value:
            try:
                return float(value)
            except ValueError:
                raise SwaplabError(f"sim: {name}={value!r} is not a number of seconds") from None
    return ping.default_seconds


def _bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _fill(body: Any, **values: str) -> Any:
    """The contract's body with `{model}` and the like filled in."""
    if isinstance(body, str):
        for name, value in values.items():
            body = body.replace("{" + name + "}", value)
        return body
    if isinstance(body, dict):
        return {key: _fill(value, **values) for key, value in body.items()}
    if isinstance(body, list):
        return [_fill(value, **values) for value in body]
    return body


def sleep_ready(engine: str) -> tuple[list[str], dict[str, str]]:
    """The flags and environment an engine must be started with for its sleep to free memory and give
    it back (its contract's `sleep.requires` and `weights_back_requires`): for configs of sims that sleep."""
    sleep = contract(engine).sleep
    if sleep is None:
        return [], {}
    back = sleep.weights_back_requires.flags if sleep.weights_back_requires is not None else ()
    return [*sleep.requires.flags, *back], dict(sleep.requires.env)
