"""The web page's two libraries (uPlot for charts, ansi_up for coloured logs) from the npm registry.

One script for both places that need them: `make ui-vendor` (which only warns when it
cannot fetch them: the page works without them) and the wheel's build hook in setup.py
(which fails instead, so that no wheel without charts is made unnoticed). `npm pack`
downloads the published tarballs, nothing is built or installed, and only the files the
page loads (and their licences) are kept, with a VERSIONS file naming what they are.
Standard library only: it runs before any venv exists, and inside a build.

    python3 tools/ui_vendor.py [--warn-only]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGES = ("uplot@1.6.32", "ansi_up@6.0.6")
VENDOR_DIR = Path(__file__).resolve().parent.parent / "src" / "swaplab" / "router" / "api" / "static" / "vendor"
STAMP = "VERSIONS"
# (package, file in its tarball, name in VENDOR_DIR)
FILES = (
    ("uplot", "dist/uPlot.iife.min.js", "uPlot.iife.min.js"),
    ("uplot", "dist/uPlot.min.css", "uPlot.min.css"),
    ("uplot", "LICENSE", "uPlot.LICENSE"),
    ("ansi_up", "ansi_up.js", "ansi_up.js"),
    ("ansi_up", "LICENSE", "ansi_up.LICENSE"),
)


class VendorUnavailable(Exception):
    """npm is missing or could not fetch the packages."""


def present(folder: Path = VENDOR_DIR) -> bool:
    """The files are there, and they are the versions pinned here."""
    stamp = folder / STAMP
    return (
        stamp.is_file() and stamp.read_text().split() == list(PACKAGES)
        and all((folder / name).is_file() for _, _, name in FILES)
    )


def fetch(folder: Path = VENDOR_DIR) -> None:
    """The pinned packages' files into `folder`, unless they are there already."""
    if present(folder):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise VendorUnavailable("npm not found")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        result = subprocess.run([npm, "pack", "--silent", *PACKAGES], cwd=work, capture_output=True, text=True)
        if result.returncode != 0:
            raise VendorUnavailable(f"npm pack {' '.join(PACKAGES)} failed (offline?): {result.stderr.strip()}")
        tarballs = {package.split("@")[0]: next(work.glob(f"{package.split('@')[0]}-*.tgz")) for package in PACKAGES}
        folder.mkdir(parents=True, exist_ok=True)
        for package, member, name in FILES:
            # Only the named members are read (npm puts them under package/): nothing else lands on disk.
            with tarfile.open(tarballs[package]) as archive, archive.extractfile(f"package/{member}") as source:
                (folder / name).write_bytes(source.read())
    (folder / STAMP).write_text("\n".join(PACKAGES) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warn-only", action="store_true", help="exit 0 when npm cannot fetch them (make ui-vendor)")
    args = parser.parse_args(argv)
    shown = VENDOR_DIR.relative_to(Path.cwd()) if VENDOR_DIR.is_relative_to(Path.cwd()) else VENDOR_DIR
    try:
        fetch()
    except VendorUnavailable as error:
        print(f"ui-vendor: {error}; the web page runs without charts and log colours", file=sys.stderr)
        return 0 if args.warn_only else 1
    (VENDOR_DIR / STAMP).touch()  # newer than this script, so make is satisfied
    print(f"ui-vendor: {' and '.join(PACKAGES)} in {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
