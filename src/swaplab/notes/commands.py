"""`swaplab notes check` and `swaplab notes show`: the library calls behind the CLI, printing what they find."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`swaplab notes check|show` and their arguments."""
    notes = commands.add_parser("notes", help="check a notes folder's wikilinks or show a model's notes")
    actions = notes.add_subparsers(dest="notes_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="list broken [[wikilinks]] as FILE:LINE; exit 1 if any")
    check.add_argument("folder", metavar="DIR")
    check.add_argument("--config", help="a config whose model ids and aliases are valid link targets too")
    show = actions.add_parser("show", help="print the notes that belong to a model")
    show.add_argument("model", metavar="MODEL", help="model id or alias")
    show.add_argument("--notes", required=True, metavar="DIR", help="the notes folder")
    show.add_argument("--config", help="the config, so the model's aliases match too")


def main(args: argparse.Namespace) -> int:
    """Run `swaplab notes check|show`; returns the exit code."""
    if args.notes_command == "check":
        return _check(args.folder, config_path=args.config)
    return _show(args.model, args.notes, config_path=args.config)


def _check(folder: str, config_path: str | None) -> int:
    """Print every broken wikilink; exit 1 when there are any, else 0."""
    from swaplab.config import load_config
    from swaplab.notes.folder import load_notes
    from swaplab.notes.matching import LinkTargets, broken_links
    from swaplab.notes.names import config_model_names, name_index

    notes = load_notes(folder)
    models = config_model_names(load_config(config_path)) if config_path else {}
    broken = broken_links(notes, LinkTargets(notes, name_index(models)))
    for link in broken:
        print(link)
    return 1 if broken else 0


def _show(model: str, folder: str, config_path: str | None) -> int:
    """Print the notes of a model (known by all its names when a config is given)."""
    from swaplab.config import load_config
    from swaplab.notes.folder import load_notes
    from swaplab.notes.matching import notes_for
    from swaplab.notes.names import config_model_names, name_index

    notes = load_notes(folder)
    names: tuple[str, ...] = (model,)
    if config_path:
        models = config_model_names(load_config(config_path))
        model_id = name_index(models).get(model)
        if model_id is not None:
            names = models[model_id]
    matches = notes_for(names, notes)
    if not matches:
        print(f"No notes in {folder} belong to {' / '.join(names)}.")
        return 0
    for number, match in enumerate(matches):
        if number:
            print()
        note = match.note
        heading = f"{note.title} ({note.file_name}): {match.reason}"
        print(heading)
        print("=" * len(heading))
        print(note.body.strip("\n"))
    return 0
