"""The router's web page at `/ui`: plain ES modules and CSS that read the router's own endpoints.

Nothing is built: the files in `static/` are what the browser runs. Two libraries,
uPlot (charts) and ansi_up (log colours), are fetched by `make ui-vendor` into
`static/vendor/`; the page asks `/ui/static/vendor.json` which of them are there
and works without them (it says charts need `make ui-vendor`), so a missing file is
never requested and never shows as an error in the browser's console.
"""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).with_name("static")
VENDOR_DIR = STATIC_DIR / "vendor"
VENDOR_FILES = ("uPlot.iife.min.js", "uPlot.min.css", "ansi_up.js")
"""What `make ui-vendor` puts in `VENDOR_DIR` for the page."""

# The page and its assets are small and change with each release: the browser must ask
# again each time (a 304 when unchanged) rather than run an old module against a newer router.
NO_CACHE = {"Cache-Control": "no-cache"}
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css"}
# One plain file name (no folder, no leading dot) of a kind the page loads.
ASSET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.(js|css)\Z")


async def _page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "ui.html", headers={**NO_CACHE, "Content-Type": "text/html"})


def _asset_in(folder: Path, name: str, shown_as: str) -> web.FileResponse:
    """The file `name` directly inside `folder`, never a path that climbs out of it."""
    path = folder / name
    if not ASSET_NAME.match(name) or not path.is_file() or path.resolve().parent != folder.resolve():
        raise web.HTTPNotFound(text=f"no such file: {shown_as}{name}")
    return web.FileResponse(path, headers={**NO_CACHE, "Content-Type": CONTENT_TYPES[path.suffix]})


async def _asset(request: web.Request) -> web.FileResponse:
    return _asset_in(STATIC_DIR, request.match_info["name"], "/ui/static/")


async def _vendor_asset(request: web.Request) -> web.FileResponse:
    return _asset_in(VENDOR_DIR, request.match_info["name"], "/ui/static/vendor/")


def vendored() -> list[str]:
    """The vendor files present (`make ui-vendor` has run, or not)."""
    return [name for name in VENDOR_FILES if (VENDOR_DIR / name).is_file()]


async def _vendor_manifest(request: web.Request) -> web.Response:
    return web.json_response({"files": vendored()}, headers=NO_CACHE)


def add_ui_routes(app: web.Application) -> None:
    """Serve the web page at `/ui` and its assets under `/ui/static/` (the libraries under `vendor/`)."""
    app.router.add_get("/ui", _page)
    app.router.add_get("/ui/", _page)
    app.router.add_get("/ui/static/vendor.json", _vendor_manifest)
    app.router.add_get("/ui/static/vendor/{name}", _vendor_asset)
    app.router.add_get("/ui/static/{name}", _asset)
