"""`swaplab config check` and `swaplab config show`: thin skins over the loader."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from swaplab.config.loader import load_config
from swaplab.config.model import Config, ModelConfig
from swaplab.errors import ConfigError, UnknownModelError

REDACTED = "***"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab config check|show` and their arguments."""
    config = commands.add_parser("config", help="check or show a config file")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a config; one FILE:LINE: line per fault")
    check.add_argument("file")
    show = actions.add_parser("show", help="print the resolved config as JSON")
    show.add_argument("file")
    show.add_argument("--model", help="only this model (id or alias), with cmd as the final argv")


def main(args: argparse.Namespace) -> int:
    """Run `swaplab config check|show`; returns the exit code."""
    if args.config_command == "check":
        return _check(args.file)
    return _show(args.file, model=args.model)


def _check(path: str) -> int:
    """Validate the config at `path`: 0 when valid (warnings on stderr), else 2 with one `FILE:LINE: message` per fault on stdout."""
    try:
        config = load_config(path)
    except ConfigError as error:
        _print_warnings(error.warnings)
        for fault in error.faults:
            print(fault)
        return 2
    _print_warnings(config.warnings)
    return 0


def _show(path: str, model: str | None = None) -> int:
    """Print the resolved config (or one model's settings, by id or alias) as JSON, secrets redacted."""
    try:
        config = load_config(path)
    except ConfigError as error:
        _print_warnings(error.warnings)
        for fault in error.faults:
            print(fault, file=sys.stderr)
        return 2
    _print_warnings(config.warnings)
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
    return document


def model_document(model: ModelConfig) -> dict[str, Any]:
    document = dataclasses.asdict(model)
    del document["raw_text"]  # the source, not a setting; the catalogue shows it
    return document
