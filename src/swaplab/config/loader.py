"""Read a llama-swap YAML config (plus swaplab's keys) into a resolved `Config`, in one pass.

The pass parses the text (`yamltree`), drops the comment lines inside commands,
substitutes `${env.NAME}` (for `--config-dir`, file by file, then merges the files'
trees: `merge`), expands the global macros in every top-level value but `models`, then
reads each section with the shared reader: the top-level settings (`settings`), what the
server records (`telemetry`), `models` (`models`), `peers` (`peers`), `routing` and the
legacy `groups`/`matrix` (`routing`, `groups`, `matrix`), `hooks` (`groups`),
`upstream` (`upstream`), `selectors`, `profiles`, and checks across them (`checks`).
Every fault is collected, each at the line of the key that holds it, and raised
together; unknown keys are warnings. Nothing here touches the machine beyond reading the
file, the environment and whether `store.path` can be written (llama-swap checks that at
load too): a config that names binaries absent from this box is still valid (it may
describe another box).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from swaplab.config import macros as macro_rules
from swaplab.config.checks import check_devices, check_names
from swaplab.config.engines import check_engines
from swaplab.config.cmd import strip_comment_lines
from swaplab.config.groups import read_preload
from swaplab.config.kvcache import read_kv_cache_store
from swaplab.config.macros import ExpansionBudget, Macro
from swaplab.config.merge import merge_trees
from swaplab.config.model import Config
from swaplab.config.models import ModelDefaults, read_models
from swaplab.config.model import Names
from swaplab.config.peers import read_peers
from swaplab.config.profiles import read_profiles
from swaplab.config.reader import Findings, read_text
from swaplab.config.routing import read_routing
from swaplab.config.selectors import read_selectors
from swaplab.config.security import read_security
from swaplab.config.settings import read_api_keys, read_devices, read_settings
from swaplab.config.sleep import read_host_memory
from swaplab.config.estimates import estimate_claims
from swaplab.config.telemetry import read_telemetry
from swaplab.config.tree import Entry, Item, Line
from swaplab.config.upstream import read_ignore_paths
from swaplab.config.yamlreader import YamlSection
from swaplab.config.yamltree import parse
from swaplab.builtin.defaults import DEFAULT_CONFIG_NAME, SERVE_LISTEN, backend_start_port, default_config_text
from swaplab.errors import SwaplabError


def load_config(path: str) -> Config:
    """Load and resolve the config file at `path`; raises ConfigError listing every fault."""
    return load_config_text(read_text(path), path)


def load_default_config(listen_port: int = SERVE_LISTEN[1]) -> Config:
    """The built-in default as `swaplab serve` on `listen_port` runs it with no `--config` (its
    backends on the ports after the router's), as `swaplab config init` writes it."""
    return load_config_text(default_config_text(backend_start_port(listen_port)), DEFAULT_CONFIG_NAME)


def load_config_text(text: str, path: str = "<config>", environ: Mapping[str, str] | None = None) -> Config:
    """Resolve config `text` (named `path` in faults); `environ` defaults to the process environment."""
    findings = Findings(path)
    root = _read_source(text, path, findings, environ)
    if root is None:
        findings.raise_faults()
    return _resolve(root or Item({}, 1), findings, path, {path: text.split("\n")})


def config_sources(config: str | None, config_dir: str | None) -> list[str]:
    """The files a config is read from, in merge order: `config`, then every `*.yml` and
    `*.yaml` directly in `config_dir`, in sorted path order (llama-swap's `-config-dir`)."""
    if not config and not config_dir:
        raise SwaplabError("at least one of --config or --config-dir must be given")
    files = [config] if config else []
    if config_dir:
        try:
            names = sorted(
                entry.path for entry in os.scandir(config_dir)
                if entry.name.endswith((".yml", ".yaml")) and entry.is_file()
            )
        except OSError as error:
            raise SwaplabError(f"--config-dir {config_dir}: {error.strerror or error}") from None
        if config and any(os.path.abspath(name) == os.path.abspath(config) for name in names):
            raise SwaplabError(f"--config {config} is also present in --config-dir {config_dir}; remove it from one")
        files += names
    if not files:
        raise SwaplabError(f"no configuration sources found: --config-dir {config_dir} holds no *.yml or *.yaml file")
    return files


def load_config_sources(
    config: str | None, config_dir: str | None, environ: Mapping[str, str] | None = None
) -> Config:
    """Load `config` and every file of `config_dir` merged into one config (`config.merge`).

    Each fault is reported at its FILE:LINE, a key defined twice at its second definition.
    """
    files = config_sources(config, config_dir)
    if len(files) == 1:
        return load_config_text(read_text(files[0]), files[0], environ)
    findings = Findings(files[0])
    lines: dict[str, list[str]] = {}
    roots: list[Item] = []
    unparsed = False
    for file in files:
        text = read_text(file)
        lines[file] = text.split("\n")
        faults_before = len(findings.faults)
        root = _read_source(text, file, findings, environ)
        if root is not None:
            roots.append(root)
        # a file that is not YAML stops the load, once every file has been parsed
        unparsed = unparsed or (root is None and len(findings.faults) > faults_before)
    if unparsed:
        findings.raise_faults()
    merged = merge_trees(roots, findings.fault) if roots else Item({}, 1)
    return _resolve(merged, findings, files[0], lines)


def _read_source(text: str, path: str, findings: Findings, environ: Mapping[str, str] | None) -> Item | None:
    """One file's text parsed, comment lines dropped from commands, `${env.NAME}` substituted.

    None when the file is empty or not YAML (a fault); a top level that is no mapping is
    a fault and raises.
    """
    environ = os.environ if environ is None else environ
    parsed = parse(text, path)
    if parsed.faults and "${env." in text:
        # llama-swap substitutes `${env.NAME}` in the raw text before parsing, so a file may be
        # YAML only then (`apiKeys: [${env.KEY}]`, a flow list where `{` cannot stand).
        env_faults: list[tuple[int, str]] = []
        substituted = parse(macro_rules.substitute_env_text(text, environ, lambda *fault: env_faults.append(fault)), path)
        if not substituted.faults:
            parsed = substituted
            for line, message in env_faults:
                findings.fault(Line(line, path), message)
    for fault in parsed.faults:
        findings.fault(Line(fault.line, fault.file), fault.message)
    if parsed.root is None:
        return None
    root = parsed.root
    if not root.is_mapping:
        findings.fault(root.line, "a config is a mapping of settings (healthCheckTimeout, models, ...)")
        findings.raise_faults()
    _strip_command_comments(root)
    return macro_rules.substitute_env(root, environ, findings.fault)


def _resolve(root: Item, findings: Findings, path: str, lines: Mapping[str, list[str]]) -> Config:
    """The config tree (one file's, or several merged) read section by section."""
    models_entry = root.value.get("models")
    # Every model as written, even one too broken to resolve (so it is not reported twice).
    model_entries = dict(models_entry.item.value) if models_entry is not None and models_entry.item.is_mapping else {}
    peers_entry = root.value.get("peers")
    peer_entries = dict(peers_entry.item.value) if peers_entry is not None and peers_entry.item.is_mapping else {}

    macros_entry = root.value.get("macros")
    global_macros = macro_rules.read_macros(
        macros_entry if macros_entry is not None and macros_entry.item.value is not None else None,
        "macros",
        findings.fault,
    )
    budget = macro_rules.ExpansionBudget()
    global_chain = macro_rules.resolve_chain(global_macros, budget)
    root = _expand_top_level(root, global_macros, global_chain, findings, budget)
    top = YamlSection(findings, root, ())
    top.entry("macros")

    settings = read_settings(top, path)
    telemetry = read_telemetry(top)
    api_keys = read_api_keys(top)
    devices = read_devices(top.section("devices"))
    host_memory = read_host_memory(top.section("hostMemory"))
    kv_cache_store = read_kv_cache_store(top.section("kvCache"), path)
    security = read_security(top.section("security"))

    model_defaults = ModelDefaults(
        settings.global_ttl,
        settings.unload_timeout,
        settings.send_loading_state,
        settings.heartbeat_interval,
        settings.start_port,
    )
    models = read_models(top.section("models"), global_macros, model_defaults, lines, budget)
    peers = read_peers(top.section("peers"))
    names = Names(models, peers)
    routing = read_routing(top, models, model_entries, names)
    ignore_paths = read_ignore_paths(top.section("upstream"))
    selectors = read_selectors(top.section("selectors"), names, routing)
    preload = read_preload(top.section("hooks"), names, selectors)
    profiles = read_profiles(top.section("profiles"), names, selectors)
    top.finish()

    check_names(findings, models, peers, model_entries, peer_entries)
    check_devices(findings, models, devices)
    check_engines(findings, models, model_entries)
    findings.raise_faults()
    estimates = estimate_claims(models, devices)
    for model_id, estimate in estimates.items():
        if estimate.unreadable:
            findings.warn(models[model_id].line, f"models.{model_id}: no memory estimate, its devices are claimed "
                                                 f"whole: {estimate.unreadable}")
    return Config(
        estimates=estimates,
        path=path,
        health_check_timeout=settings.health_check_timeout,
        log_level=settings.log_level,
        start_port=settings.start_port,
        global_ttl=settings.global_ttl,
        unload_timeout=settings.unload_timeout,
        api_keys=api_keys,
        include_aliases_in_list=settings.include_aliases_in_list,
        send_loading_state=settings.send_loading_state,
        heartbeat_interval=settings.heartbeat_interval,
        preload=preload,
        models=models,
        groups=routing.groups,
        peers=peers,
        devices=devices,
        host_memory=host_memory,
        kv_cache_store=kv_cache_store,
        router=routing.router,
        matrix=routing.matrix,
        priority=routing.priority,
        profiles=profiles,
        selectors=selectors,
        ignore_paths=ignore_paths,
        log_time_format=telemetry.log_time_format,
        log_to_stdout=telemetry.log_to_stdout,
        log_requests=telemetry.log_requests,
        metrics_max_in_memory=telemetry.metrics_max_in_memory,
        capture_buffer_mb=telemetry.capture_buffer_mb,
        store_path=telemetry.store_path,
        session_id_headers=telemetry.session_id_headers,
        performance_disabled=telemetry.performance_disabled,
        performance_every=telemetry.performance_every,
        macros=tuple((macro.name, macro.written) for macro in global_macros),
        warnings=findings.warnings,
        notes=settings.notes,
        security=security,
    )


KNOWN_TOP_LEVEL = (
    "healthCheckTimeout", "logRequests", "logLevel", "logTimeFormat", "logToStdout", "metricsMaxInMemory",
    "captureBuffer", "store", "ui", "performance", "globalTTL", "unloadTimeout", "profiles", "selectors",
    "routing", "groups", "matrix", "startPort", "hooks", "sendLoadingState", "includeAliasesInList",
    "apiKeys", "peers", "upstream",
    # swaplab's own
    "heartbeatInterval", "notes", "devices", "hostMemory", "kvCache", "security",
)  # fmt: skip
"""The top-level settings whose leftover `${...}` is a fault (llama-swap checks the ones it knows)."""


def _expand_top_level(
    root: Item, global_macros: list[Macro], chain: dict[str, Macro], findings: Findings, budget: ExpansionBudget
) -> Item:
    """Every top-level value but `models` and `macros` with the global macros expanded, as llama-swap
    does (`startPort: ${base}`, `hooks.on_startup.preload`, `peers`, `routing`, ...); a `${...}`
    left in a known setting is a fault."""
    entries = {}
    for key, entry in root.value.items():
        if key in ("models", "macros"):
            entries[key] = entry
            continue
        if key in KNOWN_TOP_LEVEL:
            item = macro_rules.expand_global(entry.item, key, global_macros, chain, findings.fault, budget)
        else:
            item = macro_rules.expand(entry.item, chain, budget)
        entries[key] = Entry(key, entry.key_line, item)
    return root.with_value(entries)


def _strip_command_comments(root: Item) -> None:
    """Drop comment lines from every model's cmd and cmdStop before anything reads them.

    The seed keeps dozens of notes inside `cmd`, with apostrophes and `${...}` that must
    never reach shlex or the macro expander.
    """
    models = root.value.get("models")
    if models is None or not models.item.is_mapping:
        return
    for model in models.item.value.values():
        if not model.item.is_mapping:
            continue
        for key in ("cmd", "cmdStop"):
            command = model.item.value.get(key)
            if command is not None and isinstance(command.item.value, str):
                command.item.value = strip_comment_lines(command.item.value)
                command.item.source = command.item.value
