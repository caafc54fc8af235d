"""llama-swap's own test corpus (tests/fixtures/llama-swap/, issue 13), run through swaplab's loader.

Each case of `cases.json` is one test, named by its file: the YAML is loaded as `swaplab
serve` loads it (`load_config_sources`, with the case's environment and its `-config` /
`-config-dir` files), and the test asserts what llama-swap's Go test asserts: that it loads
or is refused (`error_contains` / `error_equals` against the message of one of swaplab's
faults, without its `FILE:LINE: ` prefix; an equal message may follow the place it is
about, `macros.PORT: `, and go on with a hint of swaplab's in parentheses), the values it
resolves to, and the names it resolves; and that no key llama-swap reads is warned of as
unknown. A case that disagrees fails, unless it is a deliberate difference: `DIFFERENCES`
below, which must list exactly the case ids of the "differs" rows of docs/config.md's
"Differences from llama-swap".

How a case's dotted path (`models.m1.cmd`, `routing.router.use`, ...) reaches swaplab's
resolved `Config` is `llama_swap_view`: the Config re-shaped under llama-swap's key names.
Where swaplab keeps a value in another form, the view says so with a type, and the
comparison translates llama-swap's form, never swaplab's:

- `cmd`, `cmdStop`: swaplab keeps the argv (`Argv`); llama-swap's string equals it when it
  splits to that argv, and a substring of it is looked for in the argv joined by spaces
  (as written, or as the shell would split it: quotes are gone from an argv);
- `filters.stripParams`: swaplab keeps the sanitized names (`ParamNames`); llama-swap's raw
  string is compared once sanitized its way (split on `,`, trimmed, `model` and empties
  dropped, sorted);
- a model's `aliases` are its aliases then its `setParamsByID` keys (llama-swap appends those);
- `groups` (and `routing.router.settings.groups`) are the effective groups, with the implicit
  `(default)` group of the ungrouped models, sorted; `{}` under the matrix router;
  `matrix` is the matrix in force (`None` under the group router);
- timeouts of `None` (swaplab's "no limit") are llama-swap's `0`; `capabilities.in`/`out`
  that are empty are llama-swap's `null`.

Cases that only describe HTTP behaviour (`runtime`, `active_profile`, `mutation`) are
checked here for what the config says; their requests are sent to a real router by
tests/test_llama_swap_runtime.py (where their deliberate differences, `RUNTIME_DIFFERENCES`,
are asserted).

The last tests take `config.example.fixed.yaml` (llama-swap's example with only the edits
llama-swap demands): it loads with no warning, and `swaplab config show` gives every model
what llama-swap's code computes for it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from swaplab.config import load_config_sources
from swaplab.config.model import Config, ModelConfig, PeerConfig
from swaplab.errors import ConfigError, SwaplabError

CORPUS = Path(__file__).parent / "fixtures" / "llama-swap"
CASES: list[dict[str, Any]] = json.loads((CORPUS / "cases.json").read_text())
DOCS = Path(__file__).parent.parent / "docs" / "config.md"


def _case_ids(cases: list[dict[str, Any]]) -> list[str]:
    """Each case's test id: its file's name; a file several Go tests share (or none) adds the test's name."""
    uses = Counter(case["file"] for case in cases)
    ids = [
        case["file"] if uses[case["file"]] == 1
        else "::".join(part for part in (case["file"], case["test"], case.get("subtest")) if part)
        for case in cases
    ]
    assert len(set(ids)) == len(ids), "two cases share an id"
    return ids


CASE_IDS = _case_ids(CASES)

RUNTIME_DIFFERENCES: dict[str, str] = {
    "profiles_test__profileTestConfig.yaml::TestServer_Profile_ModelListings": (
        "a /v1/models record's `name` falls back to its id; llama-swap omits an empty name"
    ),
}
"""Case id -> why swaplab's HTTP answers deliberately differ from what llama-swap's server test
asserts (tests/test_llama_swap_runtime.py); the config itself loads as llama-swap loads it."""

DIFFERENCES: dict[str, str] = {
    "config.example.yaml": (
        "its groups list members that are no model (llama, qwen-unlisted, modelA, forever-modelc, ...): "
        "swaplab refuses them when it loads the config, llama-swap when its group router starts "
        "(`no model config for ...`)"
    ),
    **RUNTIME_DIFFERENCES,
}
"""Case id -> why swaplab deliberately disagrees with llama-swap's test (docs/config.md)."""

UNASSERTED: dict[str, str | tuple[str, str]] = {
    "docs__examples__aider-qwq-coder__llama-swap.yaml": ("error", "legacy list syntax is no longer supported"),
    "docs__docs__examples__aider-qwq-coder__README.md__3.yaml": ("error", "legacy list syntax is no longer supported"),
    "docs__cmd__vllm-wrapper__README.md__1.yaml": ("error", "unknown macro"),
    "docs__cmd__vllm-wrapper__README.md__2.yaml": ("error", "proxy uses ${PORT} but cmd does not"),
    "docs__cmd__vllm-wrapper__README.md__3.yaml": ("error", "unknown macro"),
    "docs__docs__examples__speculative-decoding__README.md__2.yaml": ("error", "proxy uses ${PORT} but cmd does not"),
    # a model (z-image, image) with neither a proxy nor ${PORT} in its cmd: the default proxy
    # http://localhost:${PORT} has no port, and llama-swap's loader refuses its own example
    "docker__config.example.yaml": ("error", "model z-image: proxy uses ${PORT} but cmd does not"),
    "docker__unified__config.example.yaml": ("error", "model image: proxy uses ${PORT} but cmd does not"),
}
"""What llama-swap's code does with the documents no Go test loads (the corpus's `analysis`);
any other such document is a config from llama-swap's docs, which it loads."""

NOT_LLAMA_SWAP_KEYS = {
    "defs": "a top-level key the Go tests hang YAML anchors on; llama-swap ignores it too",
    "enable": "`performance.enable`, which llama-swap has not (its key is `disabled`)",
}
"""Keys in the corpus that llama-swap does not read either: swaplab's warning about them is right."""

EXAMPLE_ENV = {"API_KEY_1": "key-one", "API_KEY_2": "key-two", "OPENROUTER_API_KEY": "sk-or-example"}
"""config.example.yaml's `${env.*}` besides HOME, as a user running it would set them."""
EXAMPLE_REFUSALS = (
    'fifo.priority references unknown model "',
    "model unlisted-model: proxy uses ${PORT} but cmd does not",
    'references unknown model "qwen-unlisted"',
    'references unknown model "modelA"',
    'references unknown model "modelB"',
)
"""Why llama-swap's loader refuses its own config.example.yaml at the corpus's commit (its test
only validates it against the schema): `fifo.priority` names models A to D that are none,
`unlisted-model` has neither a proxy nor `${PORT}` in its cmd, and selectors, profiles and
groups name models that are none."""


# --- the view: swaplab's Config under llama-swap's key names -------------------------------


class MacroList(list):
    """The global macros as declared, `[name, value]` pairs in order; `macros.NAME` is one's value."""

    def __getitem__(self, key: Any) -> Any:
        return dict(self)[key] if isinstance(key, str) else super().__getitem__(key)


class Argv(tuple):
    """A command as swaplab keeps it: its argv (llama-swap keeps the string)."""


class ParamNames(tuple):
    """`stripParams` as swaplab keeps it: sanitized names (llama-swap keeps the string)."""


def llama_swap_view(config: Config) -> dict[str, Any]:
    """`config` as llama-swap's Config struct, for the corpus's value paths."""
    matrix = config.matrix if config.router == "matrix" else None
    groups = _groups_view(config) if matrix is None else {}
    return {
        "healthCheckTimeout": config.health_check_timeout,
        "logLevel": config.log_level,
        "logTimeFormat": config.log_time_format,
        "logToStdout": config.log_to_stdout,
        "logRequests": config.log_requests,
        "startPort": config.start_port,
        "metricsMaxInMemory": config.metrics_max_in_memory,
        "captureBuffer": config.capture_buffer_mb,
        "globalTTL": config.global_ttl,
        "unloadTimeout": config.unload_timeout,
        "sendLoadingState": config.send_loading_state,
        "includeAliasesInList": config.include_aliases_in_list,
        "store": None if config.store_path is None else {"path": config.store_path},
        "ui": {"activity": {"session_id": list(config.session_id_headers)}},
        "performance": {"disabled": config.performance_disabled, "every": config.performance_every},
        "macros": MacroList([name, value] for name, value in config.macros),
        "apiKeys": list(config.api_keys),
        "hooks": {"on_startup": {"preload": list(config.preload)}},
        "models": {model_id: _model_view(config, model) for model_id, model in config.models.items()},
        "groups": groups,
        "matrix": matrix,
        "routing": {
            "router": {"use": config.router, "settings": {"groups": groups, "matrix": matrix}},
            "scheduler": {"use": "fifo", "settings": {"fifo": {"priority": dict(config.priority)}}},
        },
        "profiles": {
            profile_id: {"description": profile.description, "pins": dict(profile.pins)}
            for profile_id, profile in config.profiles.items()
        },
        "selectors": {
            selector_id: {
                "strategy": selector.strategy,
                "targets": list(selector.targets),
                "settings": {"spillover": selector.spillover},
                "name": selector.name,
                "description": selector.description,
                "unlisted": selector.unlisted,
                "metadata": selector.metadata,
            }
            for selector_id, selector in config.selectors.items()
        },
        "upstream": {"ignorePaths": list(config.ignore_paths)},
        "peers": {peer_id: _peer_view(peer) for peer_id, peer in config.peers.items()},
    }


def _groups_view(config: Config) -> dict[str, Any]:
    groups = {
        group.id: {"swap": group.swap, "exclusive": group.exclusive, "persistent": group.persistent,
                   "members": list(group.members)}
        for group in config.groups.values()
    }
    grouped = {member for group in config.groups.values() for member in group.members}
    groups["(default)"] = {"swap": True, "exclusive": True, "persistent": False,
                           "members": sorted(model for model in config.models if model not in grouped)}
    return groups


def _model_view(config: Config, model: ModelConfig) -> dict[str, Any]:
    by_id = [key for key in model.filters.set_params_by_id if key != model.id and key not in model.aliases]
    capabilities = model.capabilities
    return {
        "cmd": Argv(model.cmd),
        "cmdStop": Argv(model.cmd_stop or ()),
        "proxy": model.proxy,
        "checkEndpoint": model.check_endpoint,
        "aliases": [*model.aliases, *by_id],
        "env": [f"{name}={value}" for name, value in model.env],
        "ttl": model.ttl,
        "unloadTimeout": model.unload_timeout,
        "unlisted": model.unlisted,
        "useModelName": model.use_model_name,
        "concurrencyLimit": model.concurrency_limit,
        "name": model.name,
        "description": model.description,
        "sendLoadingState": model.send_loading_state,
        "healthCheckTimeout": config.health_check_timeout,
        "metadata": model.metadata,
        "filters": _filters_view(model.filters),
        "timeouts": _timeouts_view(model.timeouts),
        "capabilities": {
            "in": list(capabilities.input) or None,
            "out": list(capabilities.output) or None,
            "tools": capabilities.tools,
            "reranker": capabilities.reranker,
            "context": capabilities.context,
        },
        "compat": {"ignoreWebsockets": model.ignore_websockets},
    }


def _peer_view(peer: PeerConfig) -> dict[str, Any]:
    return {
        "proxy": peer.proxy,
        "apiKey": peer.api_key,
        "models": list(peer.models),
        "filters": _filters_view(peer.filters),
        "timeouts": _timeouts_view(peer.timeouts),
    }


def _filters_view(filters: Any) -> dict[str, Any]:
    return {
        "stripParams": ParamNames(filters.strip_params),
        "setParams": filters.set_params,
        "setParamsByID": filters.set_params_by_id,
    }


def _timeouts_view(timeouts: Any) -> dict[str, Any]:
    names = {"connect": "connect", "keepalive": "keepalive", "responseHeader": "response_header",
             "tlsHandshake": "tls_handshake", "expectContinue": "expect_continue", "idleConn": "idle_conn"}
    return {key: getattr(timeouts, field) or 0 for key, field in names.items()}


# --- comparing ------------------------------------------------------------------------------


def sanitized_params(text: str) -> list[str]:
    """llama-swap's sanitizing of `stripParams` (filters.go)."""
    return sorted({name.strip() for name in text.split(",")} - {"", "model"})


def split_like_a_shell(text: str) -> list[str]:
    lines = [line for line in text.split("\n") if not line.strip().startswith("#")]
    return shlex.split(" ".join(line.rstrip().removesuffix("\\") for line in lines))


def differences(expected: Any, actual: Any, where: str, subset: bool = False) -> list[str]:
    """Where `actual` (from the view) is not `expected` (llama-swap's value), in words."""
    if isinstance(actual, Argv) and isinstance(expected, str):
        if " ".join(actual) == expected or list(actual) == split_like_a_shell(expected):
            return []
        return [f"{where}: argv {list(actual)}, llama-swap's command {expected!r}"]
    if isinstance(actual, ParamNames) and isinstance(expected, str):
        expected = sanitized_params(expected)
        actual = list(actual)
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: {actual!r}, expected a mapping {expected!r}"]
        problems = []
        if not subset and set(actual) != set(expected):
            problems.append(f"{where}: keys {sorted(actual)}, expected {sorted(expected)}")
        for key, value in expected.items():
            if key not in actual:
                if subset:
                    problems.append(f"{where}.{key}: missing")
                continue
            problems += differences(value, actual[key], f"{where}.{key}")
        return problems
    if isinstance(expected, list):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return [f"{where}: {actual!r}, expected {expected!r}"]
        return [problem for index, (want, got) in enumerate(zip(expected, actual))
                for problem in differences(want, got, f"{where}[{index}]")]
    if isinstance(expected, bool) or isinstance(actual, bool) or expected is None:
        same = expected is actual if (expected is None or isinstance(expected, bool)) else False
    else:
        same = expected == actual
    return [] if same else [f"{where}: {actual!r}, expected {expected!r}"]


def _contains(value: Any, part: Any) -> bool:
    if isinstance(value, Argv):
        joined = " ".join(value)
        try:
            split = " ".join(split_like_a_shell(part))
        except ValueError:
            split = part
        return part in joined or split in joined
    return part in value


DERIVED: Mapping[str, Callable[[Any, Any], bool]] = {
    "argv_joined": lambda value, want: " ".join(value) == want,
    "sanitized": lambda value, want: list(value) == want,
    "sanitized_keys": lambda value, want: sorted(set(value) - {"model"}) == want,
    "contains": lambda value, want: all(_contains(value, part) for part in want),
    "not_contains": lambda value, want: not any(_contains(value, part) for part in want),
    "has_keys": lambda value, want: set(want) <= set(value),
    "lacks_keys": lambda value, want: not set(want) & set(value),
    "same_elements": lambda value, want: sorted(map(repr, value)) == sorted(map(repr, want)),
    "len": lambda value, want: len(value) == want,
    "empty": lambda value, want: (not any(value.values())) == want,
    "not_null": lambda value, want: (value is not None) == want,
    "compiled": lambda value, want: (value is not None and bool(value.sets)) == want,
    "seconds": lambda value, want: value == want,
    "pattern": lambda value, want: value == want,
    "patterns": lambda value, want: list(value) == want,
    "matches": lambda value, want: {text: bool(re.search(value, text)) for text in want} == want,
    "url.host": lambda value, want: urlsplit(value).netloc == want,
    "url.scheme": lambda value, want: urlsplit(value).scheme == want,
    "url.path": lambda value, want: urlsplit(value).path == want,
}
"""The corpus's `@suffix` derived values: (the view's value, the expected) -> agree."""

PATH_PART = re.compile(r'\["((?:[^"\\]|\\.)*)"\]|\[(\d+)\]|([^.\[\]]+)')


def parse_path(path: str) -> tuple[list[str | int], str | None]:
    """`models["a/b:F16"].cmd@argv_joined` as (["models", "a/b:F16", "cmd"], "argv_joined")."""
    depth, split = 0, None
    for index, char in enumerate(path):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "@" and depth == 0:
            split = index
            break
    body, suffix = (path, None) if split is None else (path[:split], path[split + 1 :])
    parts: list[str | int] = []
    for quoted, number, plain in PATH_PART.findall(body):
        parts.append(json.loads(f'"{quoted}"') if quoted else int(number) if number else plain)
    return parts, suffix


def value_at(view: Any, parts: list[str | int]) -> Any:
    for part in parts:
        view = view[part]
    return view


# --- running a case -------------------------------------------------------------------------


@dataclass
class Outcome:
    config: Config | None
    faults: list[str]
    """The messages of the faults, without `FILE:LINE: `, swaplab's `--config` flags spelled as llama-swap's `-config`."""
    warnings: tuple[str, ...] = ()


def load_case(case: dict[str, Any], tmp_path: Path) -> Outcome:
    """The case's files written (placeholders filled, preconditions made) and loaded as `swaplab serve` would."""
    environ = {key: value for key, value in os.environ.items() if key not in case.get("env_unset", [])}
    environ.update(case.get("env", {}))
    temp_dir = tmp_path / "tmpdir"
    temp_dir.mkdir(parents=True, exist_ok=True)

    def written(name: str, fixture: str, folder: Path) -> str:
        text = (CORPUS / fixture).read_text()
        for placeholder in case.get("template", {}):
            text = text.replace(placeholder, str(temp_dir))
        if case.get("scope") == "peer":  # one `peers.<id>` entry: placed under a peer of that name
            text = "peers:\n  peer1:\n" + "".join(f"    {line}\n" for line in text.splitlines())
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        return str(folder / name)

    precondition = re.fullmatch(r'file (\S+) exists with content "(.*)" \(mode \d+\)', case.get("precondition", ""))
    if precondition:
        Path(precondition.group(1).replace("__TEMP_DIR__", str(temp_dir))).write_text(precondition.group(2))
    sources = case.get("sources")
    config_dir = tmp_path / "config-dir"
    if sources is None:
        config_path, directory = written(case["file"], case["file"], tmp_path), None
    else:
        config_path = directory = None
        if sources["config_dir"] is not None:
            config_dir.mkdir()
            directory = str(config_dir)
            for source in sources["config_dir"]:
                written(source["name"], source["file"], config_dir)
        if sources["config"] is not None:
            folder = config_dir if sources["config"].get("inside_config_dir") else tmp_path
            config_path = written(sources["config"]["name"], sources["config"]["file"], folder)
    try:
        config = load_config_sources(config_path, directory, environ)
        return Outcome(config, [], config.warnings)
    except ConfigError as error:
        return Outcome(None, [_as_llama_swap_says(fault.message) for fault in error.faults], error.warnings)
    except SwaplabError as error:
        return Outcome(None, [_as_llama_swap_says(str(error))])


def _as_llama_swap_says(message: str) -> str:
    return message.replace("--config", "-config")


def disagreements(case: dict[str, Any], outcome: Outcome, tmp_path: Path) -> list[str]:
    """Every way swaplab's outcome differs from what llama-swap's test asserts."""
    expect = case["expect"]
    if expect == "error":
        if outcome.config is not None:
            return ["loads; llama-swap refuses it"]
        contains = case.get("error_contains", [])
        contains = [contains] if isinstance(contains, str) else contains
        equals = case.get("error_equals")
        if any(all(part in fault for part in contains) and (equals is None or _is_message(fault, equals))
               for fault in outcome.faults):
            return []
        wanted = f"equal to {equals!r}" if equals is not None else f"containing {contains!r}"
        return [f"no fault {wanted}; swaplab's faults: {outcome.faults}"]
    if outcome.config is None:
        return [f"refused: {outcome.faults}; llama-swap loads it"]
    return (
        _unknown_key_disagreements(outcome)
        + _value_disagreements(case, outcome.config, str(tmp_path / "tmpdir"))
        + _lookup_disagreements(case, outcome.config)
    )


def _unknown_key_disagreements(outcome: Outcome) -> list[str]:
    """A key llama-swap reads is never one swaplab calls unknown."""
    return [
        f"a key llama-swap reads, called unknown: {warning}"
        for warning in outcome.warnings
        if (match := re.search(r"unknown key '([^']*)'", warning)) and match.group(1) not in NOT_LLAMA_SWAP_KEYS
    ]


def _is_message(fault: str, message: str) -> bool:
    """`fault` is llama-swap's whole `message`, perhaps after the place it is about (`macros.PORT: `)
    and before a hint of swaplab's in parentheses."""
    return re.fullmatch(rf"(?:[^ ]+: )?{re.escape(message)}(?: \(.*\))?", fault, re.DOTALL) is not None


def _value_disagreements(case: dict[str, Any], config: Config, temp_dir: str) -> list[str]:
    view = llama_swap_view(config)
    if case.get("scope") == "peer":
        view = view["peers"]["peer1"]
    whole_structs = case["test"] in ("TestConfig_LoadPosix", "TestConfig_LoadWindows")
    problems = []
    for path, expected in case.get("values", {}).items():
        expected = json.loads(json.dumps(expected).replace("__TEMP_DIR__", temp_dir))
        parts, suffix = parse_path(path)
        try:
            value = value_at(view, parts)
        except (KeyError, IndexError, TypeError):
            problems.append(f"{path}: no such value in swaplab's config")
            continue
        if suffix is None:
            subset = whole_structs and len(parts) == 2 and parts[0] in ("models", "peers")
            problems += differences(expected, value, path, subset=subset)
        elif not DERIVED[suffix](value, expected):
            problems.append(f"{path}: swaplab has {value!r}, expected {expected!r}")
    return problems


def _lookup_disagreements(case: dict[str, Any], config: Config) -> list[str]:
    problems = []
    for kind, names in case.get("lookups", {}).items():
        if kind == "aliases_map":
            actual = {alias: model_id for model_id, model in llama_swap_view(config)["models"].items()
                      for alias in model["aliases"]}
            problems += differences(names, actual, "aliases map")
            continue
        resolve = _resolve_base if kind == "ResolveBaseModel" else Config.resolve_alias
        for name, expected in names.items():
            actual = resolve(config, name)
            if actual != expected:
                problems.append(f"{kind}({name!r}): swaplab {actual!r}, expected {expected!r}")
    return problems


def _resolve_base(config: Config, name: str) -> str | None:
    """llama-swap's ResolveBaseModel: a local id or alias gives the model id; a peer's model
    (`PEER/MODEL`, or a bare name exactly one peer lists) gives the name as asked."""
    local = config.resolve_alias(name)
    if local is not None:
        return local
    peer, _, model = name.partition("/")
    if peer in config.peers and model in config.peers[peer].models:
        return name
    listing = [peer for peer in config.peers.values() if name in peer.models]
    return name if len(listing) == 1 else None


@pytest.mark.parametrize(("case_id", "case"), list(zip(CASE_IDS, CASES)), ids=CASE_IDS)
def test_case(case_id: str, case: dict[str, Any], tmp_path: Path):
    if case.get("platform") == "windows":
        pytest.skip("llama-swap's Windows-only test (Windows defaults and command splitting)")
    if case["expect"] in ("unasserted", "schema_valid"):
        problems = _unasserted_disagreements(case, case_id, tmp_path)
    else:
        problems = disagreements(case, load_case(case, tmp_path), tmp_path)
    if case_id in DIFFERENCES and case_id not in RUNTIME_DIFFERENCES:
        assert problems, f"{case_id} now agrees with llama-swap: take it out of DIFFERENCES and docs/config.md"
        return
    assert not problems, f"{case['origin']} {case['test']} {case.get('subtest') or ''}\n" + "\n".join(problems)


def _unasserted_disagreements(case: dict[str, Any], case_id: str, tmp_path: Path) -> list[str]:
    """A document no Go test loads: what llama-swap's code does with it (UNASSERTED)."""
    if case_id == "config.example.yaml":
        # refused only for what llama-swap's loader refuses it for, and every key known
        outcome = load_case({**case, "env": EXAMPLE_ENV}, tmp_path)
        problems = _unknown_key_disagreements(outcome)
        if outcome.config is not None:
            return [*problems, "loads; llama-swap refuses it"]
        return problems + [f"a fault llama-swap has not: {fault}" for fault in outcome.faults
                           if not any(reason in fault for reason in EXAMPLE_REFUSALS)]
    expected = UNASSERTED.get(case_id, "loads")
    outcome = load_case(case, tmp_path)
    if expected == "loads":
        if outcome.config is None:
            return [f"refused: {outcome.faults}; llama-swap loads it"]
        return _unknown_key_disagreements(outcome)
    _, part = expected
    if outcome.config is not None:
        return [f"loads; llama-swap refuses it ({part})"]
    return [] if any(part in fault for fault in outcome.faults) else [f"no fault containing {part!r}: {outcome.faults}"]


def test_differences_are_the_docs_differs_rows():
    """DIFFERENCES lists exactly the case ids that docs/config.md's "differs" rows name."""
    text = DOCS.read_text()
    section = re.search(r"^## Differences from llama-swap\n(.*?)(?=^#{1,2} |\Z)", text, re.DOTALL | re.MULTILINE)
    documented = set()
    for row in (section.group(1) if section else "").splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if row.lstrip().startswith("|") and "differs" in cells:
            documented |= set(re.findall(r"`([^`]+)`", row)) & set(CASE_IDS)
    assert documented == set(DIFFERENCES)


def _perturbed(path: str, expected: Any) -> Any:
    """An expectation that must not hold where `expected` does; None where none is derived."""
    suffix = parse_path(path)[1]
    if suffix in ("not_contains", "lacks_keys"):
        return None
    if suffix == "matches":
        first = next(iter(expected))
        return {**expected, first: not expected[first]}
    if isinstance(expected, bool):
        return not expected
    if isinstance(expected, (int, float)):
        return expected + 1
    if isinstance(expected, str):
        return expected + "-perturbed"
    if isinstance(expected, list):
        return [*expected, "perturbed"]
    if isinstance(expected, dict):
        return {**expected, "perturbed": 1}
    return "perturbed"


def test_every_value_asserted_can_disagree(tmp_path):
    """The mapping is no rubber stamp: each value a loading case asserts, changed, disagrees."""
    checked = 0
    for case_id, case in zip(CASE_IDS, CASES):
        if case.get("platform") == "windows" or case_id in DIFFERENCES:
            continue
        if case["expect"] == "error":
            outcome = load_case(case, tmp_path / case_id)
            for key in ("error_contains", "error_equals"):
                if key in case:
                    wrong = {**case, key: _perturbed(key, case[key])}
                    assert disagreements(wrong, outcome, tmp_path), f"{case_id}: {key}"
                    checked += 1
            continue
        if case["expect"] != "loads":
            continue
        outcome = load_case(case, tmp_path / case_id)
        assert outcome.config is not None, case_id
        for path, expected in case.get("values", {}).items():
            wrong = _perturbed(path, expected)
            if wrong is not None:
                assert _value_disagreements({**case, "values": {path: wrong}}, outcome.config, ""), f"{case_id}: {path}"
                checked += 1
        for kind, names in case.get("lookups", {}).items():
            wrong_names = {name: f"{target}-perturbed" for name, target in names.items()}
            assert _lookup_disagreements({**case, "lookups": {kind: wrong_names}}, outcome.config), f"{case_id}: {kind}"
            checked += 1
    assert checked > 400, checked


# --- config.example.yaml with the edits llama-swap demands ----------------------------------
#
# config.example.fixed.yaml is llama-swap's example with the fewest edits that let llama-swap
# run it (each marked `# swaplab fixture:` in the file; the README lists them). The expected
# values below are llama-swap's, worked out from its code at the corpus's commit (each rule
# cited path:line), in llama-swap's terms; `_in_show_form` restates them in the form
# `swaplab config show` prints. (They were also checked against llama-swap's own loader at
# that commit, built from its source.)

FIXED_EXAMPLE = CORPUS / "config.example.fixed.yaml"
FIXED_EXAMPLE_ENV = {"HOME": "/home/example", **EXAMPLE_ENV}

START_PORT = 10001
"""`startPort: 10001`, read after the global macros (internal/config/macros.go:145, 219-234)."""
FIXED_EXAMPLE_PORTS = {"docker-llama": START_PORT, "gpt-oss-120b": START_PORT + 1, "unlisted-model": START_PORT + 2}
"""${PORT}: llama-swap walks the model ids sorted (macros.go:150-157) and hands the next port
to each model whose `cmd`, once that model's macros are expanded, holds `${PORT}`
(macros.go:167-193). All three do: docker-llama writes it; gpt-oss-120b gets it from the
global macro `latest-llama`; unlisted-model writes it (the fixture's edit)."""

_GPT_PORT = FIXED_EXAMPLE_PORTS["gpt-oss-120b"]
_DEFAULT_TIMEOUTS = {"connect": 30, "keepalive": 30, "responseHeader": 0, "tlsHandshake": 10,
                     "expectContinue": 1, "idleConn": 90}
"""A model's timeouts when it sets none (internal/config/model_config.go:140-148)."""
_NO_CAPABILITIES = {"in": None, "out": None, "tools": False, "reranker": False, "context": 0}
_NO_FILTERS = {"stripParams": [], "setParams": None, "setParamsByID": None}

FIXED_EXAMPLE_MODELS: dict[str, dict[str, Any]] = {
    "gpt-oss-120b": {
        # The comment line of cmd goes before any macro (macros.go:126, 211-217). Macros are
        # MODEL_ID, the globals in order with the model's own replacing a global of the same
        # name in place (default_ctx 16384), then the model's new ones (temp)
        # (macros.go:236-255), substituted last to first (macros.go:257-262); PORT comes last
        # (macros.go:186-188). `latest-llama` is a folded scalar (`>`): its value ends in a
        # newline, a line break between arguments. The argv is the text split POSIX-style
        # (commands.go:11-44, model_config.go:164-166); fmt's %v writes 0.7 as "0.7".
        "cmd": ["/path/to/llama-server/llama-server-ec9e0301", "--port", str(_GPT_PORT),
                "--model", "path/to/gpt-oss-120B.gguf", "--ctx-size", "16384", "--temperature", "0.7"],
        "cmdStop": None,
        "proxy": "http://127.0.0.1:8999",  # as written: no ${PORT} in it
        "checkEndpoint": "/custom-endpoint",
        # explicit aliases, then each setParamsByID key but the model's id (load.go:159-175),
        # keys expanded with the model's macros (macros.go:170, 264-288)
        "aliases": ["gpt-4o-mini"],
        "aliases_from_set_params_by_id": {"gpt-oss-120b:high", "gpt-oss-120b:low"},
        "env": ["CUDA_VISIBLE_DEVICES=0,1,2"],
        "ttl": 60,
        "unloadTimeout": 10,
        "unlisted": False,
        "useModelName": "openai/gpt-oss-120B",
        "name": "gpt-oss 120B",
        "description": "A thinking model from OpenAI",
        "concurrencyLimit": 0,
        "sendLoadingState": False,  # its own, over the global true (load.go:181-184)
        # a value that is exactly one macro keeps the macro's type (macros.go:420-423); the
        # double-quoted `note` folds its line break into a space (YAML)
        "metadata": {
            "port": _GPT_PORT,
            "temperature": 0.7,
            "note": f"The gpt-oss-120b is running on port {_GPT_PORT} temp=0.7, context=16384",
            "a_list": [1, 1.23, "macros are OK in list and dictionary types: gpt-oss-120b"],
            "an_obj": {"a": "1", "b": 2, "c": [0.7, False, "model: gpt-oss-120b"]},
        },
        "filters": {
            # split on ",", trimmed, sorted (filters.go:31-58)
            "stripParams": ["temperature", "top_k", "top_p"],
            "setParams": {"temperature": 0.7, "top_p": 0.9},
            "setParamsByID": {
                "gpt-oss-120b": {"chat_template_kwargs": {"reasoning_effort": "medium"}},
                "gpt-oss-120b:high": {"chat_template_kwargs": {"reasoning_effort": "high"}},
                "gpt-oss-120b:low": {"chat_template_kwargs": {"reasoning_effort": "low"}},
            },
        },
        "timeouts": {"connect": 30, "keepalive": 0, "responseHeader": 60, "tlsHandshake": 10,
                     "expectContinue": 1, "idleConn": 90},
        "capabilities": {"in": ["text", "audio", "image"], "out": ["text", "audio", "image"],
                         "tools": True, "reranker": False, "context": 32000},
        "compat": {"ignoreWebsockets": True},
    },
    "unlisted-model": {
        "cmd": ["some-upstream-server", "--port", str(FIXED_EXAMPLE_PORTS["unlisted-model"])],
        "cmdStop": None,
        # no proxy: the default http://localhost:${PORT} (model_config.go:11, macros.go:127-129)
        "proxy": f"http://localhost:{FIXED_EXAMPLE_PORTS['unlisted-model']}",
        "checkEndpoint": "/health",
        "aliases": [],
        "aliases_from_set_params_by_id": set(),
        "env": [],
        "ttl": 0,  # -1 (unset) becomes globalTTL, 0 (load.go:138-141)
        "unloadTimeout": 10,  # 0 (unset) becomes the global unloadTimeout, 10 (load.go:147-153)
        "unlisted": True,
        "useModelName": "",
        "name": "",
        "description": "",
        "concurrencyLimit": 0,
        "sendLoadingState": True,  # the global sendLoadingState: true (load.go:181-184)
        "metadata": None,
        "filters": _NO_FILTERS,
        "timeouts": _DEFAULT_TIMEOUTS,
        "capabilities": _NO_CAPABILITIES,
        "compat": {"ignoreWebsockets": False},
    },
    "docker-llama": {
        # ${MODEL_ID} and ${PORT} expanded; the quotes of '/models/...' are the shell's
        "cmd": ["docker", "run", "--name", "docker-llama", "--init", "--rm",
                "-p", f"{FIXED_EXAMPLE_PORTS['docker-llama']}:8080", "-v", "/mnt/nvme/models:/models",
                "ghcr.io/ggml-org/llama.cpp:server", "--model", "/models/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"],
        "cmdStop": ["docker", "stop", "docker-llama"],
        # the proxy's ${PORT} is the cmd's (macros.go:186-188)
        "proxy": f"http://127.0.0.1:{FIXED_EXAMPLE_PORTS['docker-llama']}",
        "checkEndpoint": "/health",
        "aliases": [],
        "aliases_from_set_params_by_id": set(),
        "env": [],
        "ttl": 0,
        "unloadTimeout": 10,
        "unlisted": False,
        "useModelName": "",
        "name": "",
        "description": "",
        "concurrencyLimit": 0,
        "sendLoadingState": True,
        "metadata": None,
        "filters": _NO_FILTERS,
        "timeouts": _DEFAULT_TIMEOUTS,
        "capabilities": _NO_CAPABILITIES,
        "compat": {"ignoreWebsockets": False},
    },
}
"""Each model as llama-swap resolves it (internal/config/load.go:128-187 after macros.go:63-209)."""

FIXED_EXAMPLE_GROUPS = {
    "group1": {"swap": True, "exclusive": True, "persistent": False, "members": ["gpt-oss-120b", "unlisted-model"]},
    "group2": {"swap": False, "exclusive": False, "persistent": False, "members": ["docker-llama"]},
    "forever": {"swap": False, "exclusive": False, "persistent": True, "members": []},
}
"""`routing.router.use: group` puts settings.groups in force and leaves settings.matrix unread
(load.go:200-215); unset swap/exclusive default to true, persistent to false
(config.go:73-89). Every model is in a group, so llama-swap's implicit `(default)` group is
empty (config.go:258-300)."""


def _in_show_form(model_id: str, llama: dict[str, Any]) -> dict[str, Any]:
    """llama-swap's resolved model in the form `swaplab config show` prints it: timeouts of 0
    (no limit) are null, an absent mapping or modality list is empty, env is name/value pairs."""
    timeouts, capabilities, filters = llama["timeouts"], llama["capabilities"], llama["filters"]
    return {
        "id": model_id,
        "cmd": llama["cmd"],
        "cmd_stop": llama["cmdStop"],
        "proxy": llama["proxy"],
        "check_endpoint": llama["checkEndpoint"],
        "ttl": llama["ttl"],
        "env": [entry.split("=", 1) for entry in llama["env"]],
        "name": llama["name"],
        "description": llama["description"],
        "unlisted": llama["unlisted"],
        "use_model_name": llama["useModelName"],
        "concurrency_limit": llama["concurrencyLimit"],
        "unload_timeout": llama["unloadTimeout"],
        "send_loading_state": llama["sendLoadingState"],
        "metadata": llama["metadata"] or {},
        "filters": {
            "strip_params": filters["stripParams"],
            "set_params": filters["setParams"] or {},
            "set_params_by_id": filters["setParamsByID"] or {},
        },
        "timeouts": {
            "connect": timeouts["connect"] or None,
            "response_header": timeouts["responseHeader"] or None,
            "idle_conn": timeouts["idleConn"] or None,
            "keepalive": timeouts["keepalive"] or None,
            "tls_handshake": timeouts["tlsHandshake"] or None,
            "expect_continue": timeouts["expectContinue"] or None,
        },
        "capabilities": {
            "input": capabilities["in"] or [],
            "output": capabilities["out"] or [],
            "tools": capabilities["tools"],
            "reranker": capabilities["reranker"],
            "context": capabilities["context"],
        },
        "ignore_websockets": llama["compat"]["ignoreWebsockets"],
    }


SWAPLAB_ONLY_MODEL_KEYS = (
    "heartbeat_interval", "devices", "vram_gib", "sleep", "kv_cache", "api_key", "translate", "line",
)
"""What `config show` prints of a model that llama-swap has not."""


def _swaplab(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "swaplab"), "config", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **FIXED_EXAMPLE_ENV}, check=False,
    )
    return result


def test_the_fixed_example_loads_with_no_warning(tmp_path):
    config = load_config_sources(str(FIXED_EXAMPLE), None, {**os.environ, **FIXED_EXAMPLE_ENV})
    assert config.warnings == ()
    check = _swaplab("check", "--strict", str(FIXED_EXAMPLE))
    assert (check.returncode, check.stdout, check.stderr) == (0, "", "")


def test_the_fixed_example_differs_from_llama_swaps_only_in_marked_edits():
    """Each stretch of lines that differs from llama-swap's example opens with one
    `# swaplab fixture:` note saying what llama-swap refuses there."""
    original = (CORPUS / "config.example.yaml").read_text().splitlines()
    fixed = FIXED_EXAMPLE.read_text().splitlines()
    matcher = difflib.SequenceMatcher(a=original, b=fixed, autojunk=False)
    stretches = [(a0, a1, b0, b1) for tag, a0, a1, b0, b1 in matcher.get_opcodes() if tag != "equal"]
    for a0, a1, b0, b1 in stretches:
        assert "# swaplab fixture:" in fixed[b0], (original[a0:a1], fixed[b0:b1])
    assert len(stretches) == sum("# swaplab fixture:" in line for line in fixed) == 8


def test_config_show_of_the_fixed_example_is_what_llama_swap_computes():
    show = _swaplab("show", str(FIXED_EXAMPLE))
    assert show.returncode == 0, show.stderr
    document = json.loads(show.stdout)
    assert document["warnings"] == []
    assert document["start_port"] == START_PORT
    assert (document["health_check_timeout"], document["global_ttl"], document["unload_timeout"]) == (500, 0, 10)
    assert list(FIXED_EXAMPLE_PORTS) == sorted(FIXED_EXAMPLE_PORTS)  # the rule: sorted ids, one port each
    assert list(FIXED_EXAMPLE_PORTS.values()) == list(range(START_PORT, START_PORT + len(FIXED_EXAMPLE_PORTS)))
    assert set(document["models"]) == set(FIXED_EXAMPLE_MODELS)

    for model_id, llama in FIXED_EXAMPLE_MODELS.items():
        shown = document["models"][model_id]
        alone = _swaplab("show", str(FIXED_EXAMPLE), "--model", model_id)
        assert alone.returncode == 0, alone.stderr
        assert json.loads(alone.stdout) == shown
        for alias in shown["aliases"]:  # each alias names the model (load.go:110-119, 159-175)
            by_alias = _swaplab("show", str(FIXED_EXAMPLE), "--model", alias)
            assert json.loads(by_alias.stdout) == shown, alias

        shown = {key: value for key, value in shown.items() if key not in SWAPLAB_ONLY_MODEL_KEYS}
        aliases = shown.pop("aliases")
        explicit = llama["aliases"]
        # llama-swap appends the setParamsByID keys in its map's (random) order
        assert aliases[: len(explicit)] == explicit, model_id
        assert sorted(aliases[len(explicit):]) == sorted(llama["aliases_from_set_params_by_id"]), model_id
        assert shown == _in_show_form(model_id, llama), model_id

    groups = {group_id: {key: value for key, value in group.items() if key != "id"}
              for group_id, group in document["groups"].items()}
    assert groups == FIXED_EXAMPLE_GROUPS
    assert {member for group in groups.values() for member in group["members"]} == set(FIXED_EXAMPLE_MODELS)
    assert (document["router"], document["matrix"]) == ("group", None)
    # keys resolve to models by id (load.go:264-268); priorities as written
    assert document["priority"] == {"gpt-oss-120b": 10, "docker-llama": 5, "unlisted-model": 5}
    # selectors as decoded: spillover defaults to 1 (selectors.go:33-47)
    assert {selector_id: (selector["strategy"], selector["targets"], selector["spillover"])
            for selector_id, selector in document["selectors"].items()} == {
        "coding-model": ("warm", ["gpt-oss-120b", "unlisted-model"], 1),
        "llm-plan": ("pin", ["gpt-oss-120b", "z-ai/glm-4.7"], 1),
        "llama": ("spillover", ["docker-llama"], 4),
    }
    # a pin of ~ decodes to "", disabled (config.go:111-132)
    assert document["profiles"]["coding"]["pins"] == {
        "llm-code": "gpt-oss-120b", "llm-plan": "unlisted-model", "image-gen": ""}
    # `preload: [llama]`: llama-swap keeps only names that are model ids or aliases
    # (load.go:270-283), so it preloads nothing; swaplab preloads the model the selector
    # `llama` picks at launch, its first target (docs/config.md, hooks.on_startup.preload).
    llama_swap_preload: list[str] = []
    assert llama_swap_preload == [] and document["preload"] == ["docker-llama"]
