"""`swaplab config check | show | init` (thin skins over the loader and the built-in default),
and `swaplab fit` (config/fit.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from swaplab.argtypes import host_port
from swaplab.builtin.defaults import DEFAULT_CONFIG_NAME, SERVE_LISTEN, backend_start_port, default_config_text
from swaplab.config import fit
from swaplab.config.loader import load_config_sources, load_default_config
from swaplab.config.model import Config, ModelConfig
from swaplab.config.redact import REDACTED, redact_argv, redact_env
from swaplab.errors import ConfigError, SwaplabError, UnknownModelError


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab config check|show|init` and their arguments."""
    config = commands.add_parser("config", help="check, show or start a config file")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a config; one FILE:LINE: line per fault")
    _add_sources(check)
    check.add_argument(
        "--strict", action="store_true",
        help="warnings (unknown keys, values llama-swap would quietly replace) are faults too: exit 1",
    )
    show = actions.add_parser("show", help="print the resolved config as JSON")
    _add_sources(show)
    show.add_argument("--model", help="only this model (id or alias), with cmd as the final argv")
    _add_listen(show)
    init = actions.add_parser("init", help="write the built-in default out as a config to edit")
    init.add_argument("path", nargs="?", default=INIT_PATH, metavar="PATH", help=f"where to write it (default: {INIT_PATH})")
    init.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    _add_listen(init)
    fit.add_parser(commands)

# `swaplab config init`'s file when no PATH is given: in the current folder.
INIT_PATH = "swaplab.yaml"


def _add_listen(action: argparse.ArgumentParser) -> None:
    """`--listen`, as `swaplab serve` takes it: the built-in default's backend ports follow from it."""
    action.add_argument(
        "--listen", type=host_port, default=SERVE_LISTEN, metavar="HOST:PORT",
        help=f"the address `swaplab serve` listens on (default {SERVE_LISTEN[0]}:{SERVE_LISTEN[1]}, as there): "
        "the built-in default's backends get the ports after it, as serve gives them; a file's startPort stays",
    )


def _add_sources(action: argparse.ArgumentParser) -> None:
    action.add_argument("file", nargs="?", help="the config file (llama-swap's -config; default: the built-in default)")
    action.add_argument(
        "--config-dir", metavar="DIR",
        help="also every *.yml/*.yaml directly in DIR, merged after FILE in sorted order (llama-swap's -config-dir)",
    )


def main(args: argparse.Namespace) -> int:
    """Run `swaplab config check|show|init` or `swaplab fit`; returns the exit code."""
    if args.command == "fit":
        return fit.main(args)
    if args.config_command == "init":
        return _init(Path(args.path), force=args.force, listen=args.listen)
    if args.config_command == "check":
        return _check(args.file, args.config_dir, strict=args.strict)
    return _show(args.file, args.config_dir, model=args.model, listen=args.listen)


def _load(path: str | None, config_dir: str | None, listen_port: int = SERVE_LISTEN[1]) -> Config:
    """The config files given, or the built-in default as `swaplab serve` on `listen_port` runs it
    when none is."""
    if path is None and config_dir is None:
        return load_default_config(listen_port)
    return load_config_sources(path, config_dir)


def _serve_command(listen: tuple[str, int], path: Path | None = None) -> str:
    """The `swaplab serve` line that runs the built-in default (or `path`) on `listen`'s ports."""
    config = f" --config {path}" if path is not None else ""
    address = f" --listen {listen[0]}:{listen[1]}" if listen != SERVE_LISTEN else ""
    return f"swaplab serve{config}{address}"


def _init(path: Path, force: bool = False, listen: tuple[str, int] = SERVE_LISTEN) -> int:
    """Write the built-in default to `path` (refusing an existing file unless `force`), its
    backends on the ports `swaplab serve` on `listen` gives them, and say where."""
    if path.is_dir():
        raise SwaplabError(f"config init: {path} is a folder; give a file name, e.g. {path / INIT_PATH}")
    if path.exists() and not force:
        raise SwaplabError(f"config init: {path} exists; pass --force to overwrite it")
    start_port = backend_start_port(listen[1])
    text = (
        f"# Written by `swaplab config init` from the {DEFAULT_CONFIG_NAME}: edit it, then\n"
        f"# `swaplab config check {path}` and `{_serve_command(listen, path)}`.\n"
        f"# startPort {start_port} is the port after the router's ({listen[0]}:{listen[1]}), as\n"
        f"# `{_serve_command(listen)}` gives the built-in default's backends.\n"
        + default_config_text(start_port)
    )
    try:
        path.write_text(text)
    except OSError as error:
        raise SwaplabError(f"config init: cannot write {path}: {error.strerror or error}") from None
    print(
        f"Wrote the built-in default to {path}, its backends on ports from {start_port} "
        f"(after the router's {listen[1]}, as serve gives them); serve it with: {_serve_command(listen, path)}"
    )
    return 0


def _check(path: str | None, config_dir: str | None, strict: bool = False) -> int:
    """Validate the config (`path`, and the files of `config_dir` merged after it): 0 when valid
    (warnings on stderr), else 2 with one `FILE:LINE: message` per fault on stdout. With
    `strict`, a valid config with warnings exits 1, each warning on stdout as a fault."""
    try:
        config = _load(path, config_dir)
    except ConfigError as error:
        if strict:
            for warning in error.warnings:
                print(warning)
        else:
            _print_warnings(error.warnings)
        for fault in error.faults:
            print(fault)
        return 2
    if strict and config.warnings:
        for warning in config.warnings:
            print(warning)
        return 1
    _print_warnings(config.warnings)
    _print_claims(config)
    return 0


def _print_claims(config: Config) -> None:
    """Each llama-server, vLLM or SGLang model's device claim beside its estimate, on stderr (docs/memory.md)."""
    from swaplab.config.estimates import claim_estimate
    from swaplab.memory.flags import engine_of, runs_llama_server

    if not config.devices:
        return
    for model_id, model in config.models.items():
        if not (runs_llama_server(model.cmd) or engine_of(model.cmd)):
            continue
        estimate = config.estimates.get(model_id) or claim_estimate(model, config.devices)
        if model.vram_gib:
            declared = ", ".join(f"{amount:g} GiB on device {device}" for device, amount in model.vram_gib.items())
            print(f"models.{model_id}: declares {declared}; {estimate.detail}", file=sys.stderr)
        elif estimate.claim is not None:
            print(f"models.{model_id}: claims {estimate.detail}", file=sys.stderr)
        else:
            print(f"models.{model_id}: claims its devices whole: {estimate.detail}", file=sys.stderr)


def _show(
    path: str | None, config_dir: str | None, model: str | None = None, listen: tuple[str, int] = SERVE_LISTEN
) -> int:
    """Print the resolved config (or one model's settings, by id or alias) as JSON, secrets
    redacted; the built-in default with the ports `swaplab serve` on `listen` gives it (said on stderr)."""
    try:
        config = _load(path, config_dir, listen[1])
    except ConfigError as error:
        _print_warnings(error.warnings)
        for fault in error.faults:
            print(fault, file=sys.stderr)
        return 2
    _print_warnings(config.warnings)
    if path is None and config_dir is None:
        print(
            f"{DEFAULT_CONFIG_NAME}: backends on ports from {config.start_port} (after the router's "
            f"{listen[1]}), as `{_serve_command(listen)}` runs it",
            file=sys.stderr,
        )
    if model is None:
        document = resolved_document(config)
    else:
        model_id = config.resolve_alias(model)
        if model_id is None:
            raise UnknownModelError(model, sorted(config.models))
        document = model_document(config.models[model_id])
    print(json.dumps(document, indent=2))
    return 0


def _print_warnings(warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        print(warning, file=sys.stderr)


def resolved_document(config: Config) -> dict[str, Any]:
    """The config as JSON-ready data: secrets redacted, each model's raw text left out."""
    document = dataclasses.asdict(config)
    document["api_keys"] = [REDACTED for _ in config.api_keys]
    document["models"] = {model_id: model_document(model) for model_id, model in config.models.items()}
    for peer in document["peers"].values():
        if peer["api_key"]:
            peer["api_key"] = REDACTED
    if config.matrix is not None:  # each set as written and the models it names, not its parsed tree
        document["matrix"] = {
            "vars": config.matrix.vars,
            "evict_costs": config.matrix.evict_costs,
            "sets": [
                {"name": matrix_set.name, "expression": matrix_set.expression, "models": sorted(matrix_set.models)}
                for matrix_set in config.matrix.sets
            ],
        }
    return document


def model_document(model: ModelConfig) -> dict[str, Any]:
    document = dataclasses.asdict(model)
    del document["raw_text"]  # the source, not a setting; the catalogue shows it
    document["cmd"] = list(redact_argv(model.cmd))
    if model.cmd_stop is not None:
        document["cmd_stop"] = list(redact_argv(model.cmd_stop))
    document["env"] = [list(entry) for entry in redact_env(model.env)]
    if model.api_key:
        document["api_key"] = REDACTED
    return document
