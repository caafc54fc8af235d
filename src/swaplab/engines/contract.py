"""What an engine is, as its release says: the contract fixtures under `contracts/`, typed.

Each `contracts/<engine>.yaml` was read from one release of the engine (vLLM's and SGLang's
PyPI wheels, llama.cpp as the xllamacpp sdist vendors it, TabbyAPI's repository), every fact
with the `file:line` it came from. Nothing here is an assumption of ours: the sim's engine
personalities, `config check`, the fleet's calls and the memory claims all read these, and
tests/test_engine_contracts.py holds the sim to them. A newer release that changes a contract
changes its fixture, and the tests show what follows.

Only the fields swaplab acts on are typed; the rest of a fixture (prose with its origins) is
kept for people and the docs.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swaplab.errors import SwaplabError

EngineName = Literal["vllm", "sglang", "llamacpp", "tabby"]
ENGINES: tuple[EngineName, ...] = ("vllm", "sglang", "llamacpp", "tabby")


class _Facts(BaseModel):
    # A fixture holds more than swaplab reads (prose, origins): kept, not refused.
    model_config = ConfigDict(extra="allow", frozen=True)


class Refusal(_Facts):
    """An HTTP answer the engine gives: its status and body (with `{model}` where it names one)."""

    status: int
    body: Any = None
    origin: str = ""


class ServedName(_Facts):
    flags: tuple[str, ...] = ()
    default: str = ""
    any_name_accepted: bool = False
    unknown_model: Refusal | None = None


class Admin(_Facts):
    flags: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    rule: str = ""
    refused: Refusal | None = None
    """The answer on an admin route without the admin key, where it differs from `auth.refused`."""


class Auth(_Facts):
    flags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    header: str = "Authorization: Bearer {key}"
    also: tuple[str, ...] = ()
    protected: str = ""
    unprotected: tuple[str, ...] = ()
    guarded_prefixes: tuple[str, ...] = ()
    """Where set, only paths with one of these prefixes need the key (vLLM's GUARDED_PREFIX)."""
    open_prefixes: tuple[str, ...] = ()
    """Paths with one of these prefixes never need the key (SGLang's prefix match), beside `unprotected`."""
    refused: Refusal | None = None
    admin: Admin | None = None
    origin: str = ""

    def headers(self, key: str) -> dict[str, str]:
        """The header that carries `key` the way this engine reads it first."""
        name, _, value = self.header.partition(":")
        return {name.strip(): value.strip().format(key=key)}


class Requires(_Facts):
    flags: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    why: str = ""


class Route(_Facts):
    method: str
    path: str
    requires: Requires | None = None
    origin: str = ""


class Call(_Facts):
    method: str
    path: str
    params: str = ""
    origin: str = ""


class Report(_Facts):
    """A log line the engine prints with figures: its format string and what the figures mean."""

    format: str
    example: str = ""
    meaning: str = ""
    origin: str = ""

    def pattern(self) -> re.Pattern[str]:
        """A regular expression for the line, each printf/format field a named group from `meaning`."""
        return report_pattern(self.format, self.meaning)


class Sleep(_Facts):
    requires: Requires = Field(default_factory=Requires)
    weights_back_requires: Requires | None = None
    calls: dict[str, Call] = Field(default_factory=dict)
    reports: tuple[Report, ...] = ()


class Utilization(_Facts):
    flags: tuple[str, ...] = ()
    default: float | None = None
    rule: str = ""
    origin: str = ""


class ContextSpellings(_Facts):
    examples: dict[str, Any] = Field(default_factory=dict)
    origin: str = ""


class Slots(_Facts):
    """llama.cpp's slots: the flag that sets how many share the context, and whether they share it whole."""

    flags: tuple[str, ...] = ()
    kv_unified_flags: tuple[str, ...] = ()
    """Both spellings, on and off (`--no-kv-unified`): the last one given wins."""


class Memory(_Facts):
    utilization: Utilization | None = None
    kv_cache_bytes_flags: tuple[str, ...] = ()
    tensor_parallel_flags: tuple[str, ...] = ()
    data_parallel_flags: tuple[str, ...] = ()
    pipeline_parallel_flags: tuple[str, ...] = ()
    context_flags: tuple[str, ...] = ()
    context_spellings: ContextSpellings | None = None
    slots: Slots | None = None
    kv_cache_dtype_flags: tuple[str, ...] = ()
    kv_cache_dtypes: dict[str, float | None] = Field(default_factory=dict)
    reports: tuple[Report, ...] = ()


class StartupLine(_Facts):
    stage: str
    format: str = ""
    example: str = ""
    origin: str = ""


class Startup(_Facts):
    verbosity: str = ""
    lines: tuple[StartupLine, ...] = ()


class Health(_Facts):
    path: str = "/health"
    while_loading: str = ""
    origin: str = ""


class Ping(_Facts):
    """A keep-alive the engine writes into a stream that stays silent (llama.cpp's SSE ping)."""

    event: str
    flags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    request_field: str = ""
    default_seconds: float = 0.0
    """Seconds of silence before each ping; 0 or less: none."""
    origin: str = ""


class Stream(_Facts):
    """How the engine frames a streamed answer, and what it sends before the first token."""

    format: str = ""
    before_first_token: str = ""
    ping: Ping | None = None
    origin: str = ""


class ContextLimit(_Facts):
    """How the engine refuses a request longer than its context: the status, and each message's format
    with its figures named (`prompt_tokens`, `context_tokens`) in its `meaning`."""

    status: int
    messages: tuple[Report, ...] = ()

    def figures(self, message: str) -> dict[str, int] | None:
        """The named figures of `message` when it is one of these refusals, else None."""
        for known in self.messages:
            found = known.pattern().search(message)
            if found is not None:
                return {name: int(value.replace(",", "")) for name, value in found.groupdict().items()
                        if value is not None and value.replace(",", "").isdigit()}
        return None


class Errors(_Facts):
    exceed_context: ContextLimit | None = None


class Contract(_Facts):
    """One engine's contract, as its release has it."""

    engine: EngineName
    name: str
    release: str
    read_from: str
    served_name: ServedName
    auth: Auth
    health: Health = Field(default_factory=Health)
    routes: tuple[Route, ...] = ()
    absent: tuple[str, ...] = ()
    sleep: Sleep | None = None
    memory: Memory = Field(default_factory=Memory)
    startup: Startup = Field(default_factory=Startup)
    errors: Errors = Field(default_factory=Errors)
    stream: Stream = Field(default_factory=Stream)

    def route(self, method: str, path: str) -> Route | None:
        """The route the engine serves at `method path`, or None."""
        return next((r for r in self.routes if r.method == method and r.path == path), None)

    def serves(self, path: str) -> bool:
        """Whether the engine has a route at `path` at all (whatever it requires)."""
        return path not in self.absent and any(route.path == path for route in self.routes)


# libyaml's safe loader where PyYAML was built with it: a contract is read at every start that has its
# engine in the config (the built-in default's llama.cpp), and the pure-Python reader takes 30 ms a file.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def contract(engine: str) -> Contract:
    """The contract of `engine` (vllm, sglang, llamacpp, tabby), read once."""
    if engine not in ENGINES:
        raise SwaplabError(f"no engine contract for {engine!r}: the engines are {', '.join(ENGINES)}")
    source = resources.files("swaplab.engines").joinpath("contracts", f"{engine}.yaml")
    text = source.read_text(encoding="utf-8")
    try:
        return Contract.model_validate(yaml.load(text, Loader=_LOADER))
    except (yaml.YAMLError, ValidationError) as error:
        # A packaging fault, never a user's: say which fixture and why.
        raise SwaplabError(f"swaplab's engine contract {engine}.yaml is broken: {error}") from None


_FIELD = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?(?:l{0,2}|z)[sdiufgeEx]|\{[^{}]*\}")


def report_pattern(fmt: str, meaning: str) -> re.Pattern[str]:
    """A regex for a printf- or format-style log line; its numeric fields become groups named by
    `meaning` ("freed_gib (prose), in_use_gib"), unnamed where `meaning` has no name for them."""
    names = meaning_names(meaning)
    parts: list[str] = []
    last = 0
    fmt = fmt.rstrip("\n")
    for index, field in enumerate(_FIELD.finditer(fmt)):
        parts.append(re.escape(fmt[last:field.start()]))
        text = field.group()
        numeric = bool(re.search(r"[diufgeEx]$", text) if text.startswith("%") else re.search(r":[^{}]*[dfgeE%]\}$", text))
        name = names[index] if index < len(names) else None
        # A field `meaning` names is a figure, whatever its conversion (vLLM prints its GiB with %s).
        value = r"-?[0-9.,]+(?:[eE][-+]?\d+)?" if numeric or name else r".*?"
        if re.match(r"%[-+ #0]*\d", text):  # a width: padded with spaces
            value = r"\s*" + value
        parts.append(f"(?P<{name}>{value})" if name else f"(?:{value})")
        last = field.end()
    parts.append(re.escape(fmt[last:]))
    return re.compile("".join(parts))


_ASIDE = re.compile(r"\([^()]*\)")
_NAME = re.compile(r"\s*([A-Za-z_]\w*)\b")


def meaning_names(meaning: str) -> list[str | None]:
    """The figure names of a report's `meaning` ("freed_gib (prose), still_in_use_gib; more prose"):
    the leading word of each comma-separated part before any ';', asides in brackets left out."""
    text = meaning
    while _ASIDE.search(text):
        text = _ASIDE.sub("", text)
    names: list[str | None] = []
    for part in text.split(";", 1)[0].split(","):
        found = _NAME.match(part)
        names.append(found.group(1) if found and "_" in found.group(1) else None)
    return names
