"""Which engine a command line runs, and what it says on the flags an engine contract names.

`--flag value` and `--flag=value` both count and the last one wins, as argparse reads them.
A `swaplab sim --engine E` command is engine E: the sim in a personality is that engine's
stand-in, so everything checked of a real engine's command is checked of it too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

from swaplab.engines.contract import ENGINES, EngineName


def engine_of(argv: Sequence[str]) -> EngineName | None:
    """The engine a command line runs (its program, a `python -m` module, a container image,
    swaplab's llama.cpp wrapper or the sim in a personality), else None. A model path that
    merely contains an engine's name does not count."""
    argv = _without_env(argv)
    if not argv:
        return None
    sim = _sim_engine(argv)
    if sim is not None:
        return sim
    if os.path.basename(argv[0]) == "llama-server" or list(argv[1:3]) == ["-m", "swaplab.builtin.llamacpp"]:
        return "llamacpp"
    for index, word in enumerate(argv):
        name = os.path.basename(word.split(":")[0])
        for engine in ("vllm", "sglang"):
            # `vllm serve`, `python -m vllm.entrypoints...`, `sglang.launch_server`, images
            # `vllm/vllm-openai:latest` and `lmsysorg/sglang:latest`.
            # A bare word or the program itself, an image with its tag: a model folder named `vllm` is neither.
            image = ":" in word or ("run" in argv[:index] and not word.startswith(("/", ".", "~")))  # docker run IMAGE
            named = name == engine and (index == 0 or "/" not in word or image)
            if named or word.startswith(f"{engine}.") or name == f"{engine}-openai":
                return engine
        if name == "llama-server":  # behind env, docker run ...
            return "llamacpp"
        # TabbyAPI runs from its checkout: `python /opt/tabbyAPI/main.py`, `./start.sh`.
        if name in ("main.py", "start.py", "start.sh") and "tabby" in word.lower():
            return "tabby"
        if index > 6:
            break
    return None


def _without_env(argv: Sequence[str]) -> list[str]:
    """The command after `env` and its `NAME=value` assignments (the seed's SGLang entry opens with
    six): what it runs is the word after them."""
    words = list(argv)
    while words and (os.path.basename(words[0]) == "env" or _ENV_WORD.match(words[0])):
        words.pop(0)
    return words


def _sim_engine(argv: Sequence[str]) -> EngineName | None:
    words = list(argv)
    if "sim" not in words[:4] or not any(os.path.basename(word).startswith("swaplab") for word in words[:3]):
        return None
    value = flag_value(words, ("--engine",))
    return value if value in ENGINES else None  # type: ignore[return-value]


def _occurrences(argv: Sequence[str], spellings: Iterable[str]) -> Iterator[tuple[int, str | None]]:
    """Where one of `spellings` stands in argv, with its `=value` when written so (else None)."""
    names = set(spellings)
    for index, word in enumerate(argv):
        flag, equals, inline = word.partition("=")
        if flag in names:
            yield index, inline if equals else None


def flag_value(argv: Sequence[str], spellings: Iterable[str]) -> str | None:
    """The value of the last of `spellings` in argv (`--flag value` or `--flag=value`), or None."""
    words = list(argv)
    found: str | None = None
    for index, inline in _occurrences(words, spellings):
        if inline is not None:
            found = inline
        elif index + 1 < len(words):
            found = words[index + 1]
    return found


def flag_given(argv: Sequence[str], spellings: Iterable[str]) -> tuple[str, str | None] | None:
    """The last of `spellings` on the command line, as written, with its value (None for a switch
    or a flag at the end); None when none is there."""
    words = list(argv)
    found: tuple[str, str | None] | None = None
    for index, inline in _occurrences(words, spellings):
        value = inline if inline is not None else (words[index + 1] if index + 1 < len(words) else None)
        found = (words[index].partition("=")[0], value)
    return found


def flag_values(argv: Sequence[str], spellings: Iterable[str]) -> list[str]:
    """Every value given to `spellings`, with the words after a flag up to the next `-` word
    (argparse's `nargs='+'`: `--served-model-name a b`)."""
    words = list(argv)
    values: list[str] = []
    for index, inline in _occurrences(words, spellings):
        if inline is not None:
            values.append(inline)
            continue
        for following in words[index + 1:]:
            if following.startswith("-"):
                break
            values.append(following)
    return values


def has_flag(argv: Sequence[str], spellings: Iterable[str]) -> bool:
    """Whether any of `spellings` is on the command line (a switch, or a flag with a value)."""
    names = set(spellings)
    return any(word.partition("=")[0] in names for word in argv)


_ENV_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def command_env(argv: Sequence[str], env: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """The environment a command's engine sees from its config entry: the entry's `env`, then
    `NAME=value` words in front of the program (`/usr/bin/env A=1 vllm serve`, `docker run -e A=1`)."""
    result = dict(env.items() if isinstance(env, Mapping) else env)
    words = list(argv)
    for index, word in enumerate(words):
        matched = _ENV_WORD.match(word)
        if matched and (index == 0 or os.path.basename(words[index - 1]) == "env" or _ENV_WORD.match(words[index - 1])
                        or words[index - 1] in ("-e", "--env")):
            result[matched.group(1)] = matched.group(2)
    return result
