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
checked here for what the config says; their requests are the router's tests.
"""

from __future__ import annotations

import json
import os
import re
import shlex
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

DIFFERENCES: dict[str, str] = {
    "config.example.yaml": (
        "its groups list members that are no model (llama, qwen-unlisted, modelA, forever-modelc, ...): "
        "swaplab refuses them when it loads the config, llama-swap when its group router starts "
        "(`no model config for ...`)"
    ),
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
    if case_id in DIFFERENCES:
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
