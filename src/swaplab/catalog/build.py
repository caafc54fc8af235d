"""The whole catalogue written to a folder of static files (what `swaplab site build` calls)."""

from __future__ import annotations

from pathlib import Path

from swaplab.catalog.render import SiteRenderer
from swaplab.catalog.site import read_site
from swaplab.config import load_config, load_default_config
from swaplab.errors import SwaplabError
from swaplab.results.store import existing_store

# Folders of generated pages: a page left from an earlier build (a model since removed) is deleted.
PAGE_FOLDERS = ("models", "notes")


def build_site(config_path: str | None, out: str | Path, *, notes: str | None = None, db: str | None = None,
               generated_at: float | None = None) -> list[Path]:
    """Build the site from the config at `config_path` (None: the built-in default), the notes
    folder (else the config's `notes:`) and the store; returns the files written."""
    config = load_config(config_path) if config_path is not None else load_default_config()
    site = read_site(config, notes or config.notes, existing_store(db))
    renderer = SiteRenderer(site, generated_at)
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise SwaplabError(f"--out {folder} is a file, not a folder")
    written = []
    try:
        for path in renderer.paths():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            content = renderer.render(path)
            assert content is not None
            target.write_bytes(content)
            written.append(target)
        for name in PAGE_FOLDERS:
            for stale in sorted((folder / name).glob("*.html")):
                if stale not in written:
                    stale.unlink()
    except OSError as error:
        raise SwaplabError(f"cannot write the site to {folder}: {error.strerror or error}") from None
    return written
