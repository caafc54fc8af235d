"""What is never shown: the values of secrets in a header, a backend's command, its environment and its config entry.

One decision, `secret_name`, says whether a name (a header, an environment variable, a
command-line flag, a YAML key) names a secret: its last word is a key, a token, a secret,
a password, a credential, a cookie or an auth (`X-Goog-Api-Key`, `HF_TOKEN`, `--api-key`,
`apiKey`), so `--api-key-file`, `TOKENIZERS_PARALLELISM` and `--max-tokens` stay shown.
The functions below apply it to argv, environment entries and the text of a config entry,
and also replace any known secret value (the config's `apiKeys`, the peers' `apiKey`s)
wherever it appears. Pure functions; `REDACTED` is the one marker (`swaplab config show`'s).
docs/security.md, "What is never shown or stored", lists where they are applied.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Sequence

from swaplab.config.model import Config, ModelConfig

REDACTED = "***"
SECRET_ENDINGS = (
    "key", "keys", "token", "secret", "secrets", "password", "passwd", "passphrase", "credential", "credentials",
    "cookie",
)  # fmt: skip
"""A name whose last word ends so names a secret (`apikey` and `hftoken` are one word each)."""
AUTH_WORDS = frozenset({"auth", "authorization", "authentication", "authenticate"})
MIN_VALUE_CHARS = 4
"""A value found elsewhere is replaced in text only from this length: `HF_HUB_OFFLINE=1` must not mask every `1`."""

_WORDS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_VALUE = r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\]+)"
# `--name VALUE` or `--name=VALUE` on one line, VALUE not a flag (one on the next line is found from the parsed argv).
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|[ \t]+)(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'\\-][^\s\"'\\]*)")
# `NAME=VALUE`: an environment entry, `env NAME=VALUE cmd`, `-e NAME=VALUE`.
_ASSIGNMENT = re.compile(r"(?<![\w.-])([A-Za-z_][A-Za-z0-9_]*)=" + _VALUE)
# `name: value` in YAML (a model's `macros:`, a peer's `apiKey:`), up to a comment or the line's end.
_YAML_KEY = re.compile(
    r"^([ \t]*(?:-[ \t]+)?)([\"']?)([A-Za-z_][\w.-]*)\2([ \t]*:[ \t]+)(\"[^\"\n]*\"|'[^'\n]*'|[^\s#|>\"'][^\n]*?)"
    r"(?=[ \t]+#|[ \t]*$)",
    re.MULTILINE,
)
# The password of `scheme://user:password@host`.
_USERINFO = re.compile(r"(\b[A-Za-z][\w+.-]*://[^/\s:@]*:)([^/\s@]+)(@)")


@functools.lru_cache(maxsize=1024)  # header names, request after request
def secret_name(name: str) -> bool:
    """Whether `name` names a secret: its last word (split at `-`, `_`, `.` and camelCase) is a key, token, secret,
    password, credential, cookie or auth."""
    words = [word for word in _WORDS.split(name) if word]
    if not words:
        return False
    last = words[-1].lower()
    return last in AUTH_WORDS or last.endswith(SECRET_ENDINGS)


def _is_reference(value: str) -> bool:
    """`${env.NAME}` and other macro references name where a secret comes from: they stay shown."""
    bare = value.strip("\"'")
    return bare.startswith("${") and bare.endswith("}")


def _masked(value: str) -> str:
    """`value` replaced by the marker, its quotes kept."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    return REDACTED


def _argv_secrets(argv: Sequence[str]) -> list[tuple[str, str]]:
    """Each argument split into (what is shown, the secret value after it): ("--api-key=", "sk-1"), ("", "sk-1"),
    ("HF_TOKEN=", "hf_abc"); ("--port", "") for an argument that holds none."""
    split: list[tuple[str, str]] = []
    value_next = False
    for arg in argv:
        if value_next and arg and not arg.startswith("-"):
            split.append(("", arg))
            value_next = False
            continue
        value_next = False
        name, equals, value = arg.partition("=")
        if arg.startswith("-") and secret_name(name):
            if not equals:
                value_next = True
            elif value and not _is_reference(value):
                split.append((name + equals, value))
                continue
        elif equals and value and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and secret_name(name):
            split.append((name + equals, value))
            continue
        split.append((arg, ""))
    return split


def redact_argv(argv: Sequence[str], secrets: Iterable[str] = ()) -> tuple[str, ...]:
    """`argv` with the values of secret flags (`--api-key X`, `--hf-token=X`) and assignments (`HF_TOKEN=X`) masked,
    and any of `secrets` masked wherever it appears (in an `sh -c` script too)."""
    secrets = tuple(secrets)
    return tuple(shown + REDACTED if value else redact_text(shown, secrets) for shown, value in _argv_secrets(argv))


def command_text(argv: Sequence[str], secrets: Iterable[str] = ()) -> str:
    """`argv` as one shell line (`shlex.join`), secrets masked; a masked value (`***`, `--api-key=***`) unquoted."""
    parts = []
    for part in redact_argv(argv, secrets):
        prefix = part.removesuffix(REDACTED)
        masked = part.endswith(REDACTED) and (not prefix or shlex.quote(prefix) == prefix)
        parts.append(part if masked else shlex.quote(part))
    return " ".join(parts)


def redact_env(env: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Environment entries with the value of each secret-named one (`HF_TOKEN`, `OPENAI_API_KEY`) masked."""
    return tuple((name, REDACTED if secret_name(name) and value else value) for name, value in env)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Text a user wrote (a config entry, a shell script) with every secret in it masked: each of `secrets` (of at
    least MIN_VALUE_CHARS), the value of a secret flag, assignment or YAML key on its line, a URL's password."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_VALUE_CHARS}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)

    def flag(match: re.Match[str]) -> str:
        name, separator, value = match.groups()
        if not secret_name(name):  # its value may be a quoted script with flags of its own: `-c "srv --api-key X"`
            return name + separator + _FLAG.sub(flag, value)
        return match.group(0) if _is_reference(value) else name + separator + _masked(value)

    def assignment(match: re.Match[str]) -> str:
        name, value = match.groups()
        if not secret_name(name) or _is_reference(value):
            return match.group(0)
        return f"{name}={_masked(value)}"

    def yaml_key(match: re.Match[str]) -> str:
        indent, quote, name, colon, value = match.groups()
        if not secret_name(name) or _is_reference(value):
            return match.group(0)
        return f"{indent}{quote}{name}{quote}{colon}{_masked(value)}"

    text = _FLAG.sub(flag, text)
    text = _ASSIGNMENT.sub(assignment, text)
    text = _YAML_KEY.sub(yaml_key, text)
    return _USERINFO.sub(lambda match: match.group(1) + REDACTED + match.group(3), text)


def config_secrets(config: Config) -> tuple[str, ...]:
    """The config's own secret values: its `apiKeys`, the peers' and the models' `apiKey`s."""
    keys = (*config.api_keys, *(peer.api_key for peer in config.peers.values()),
            *(model.api_key for model in config.models.values()))
    return tuple(key for key in keys if key)


def model_secrets(model: ModelConfig) -> tuple[str, ...]:
    """The secret values a model's parsed settings hold: its secret flags' and assignments' values in `cmd` and
    `cmdStop`, its secret-named `env` entries' values. Found there, they are masked in its entry's text wherever
    they sit (a flag's value on the next line of a `cmd: |` block, a model's own `macros:`)."""
    values = [value for _, value in _argv_secrets(model.cmd)]
    values += [value for _, value in _argv_secrets(model.cmd_stop or ())]
    values += [value for name, value in model.env if secret_name(name)]
    return tuple(value for value in values if value)


def entry_text(model: ModelConfig, secrets: Iterable[str] = ()) -> str:
    """The model's config entry as written (`raw_text`), every secret in it masked: `secrets` (the config's,
    `config_secrets`) and its own (`model_secrets`)."""
    return redact_text(model.raw_text, (*secrets, *model_secrets(model)))
