"""The router's web page at `/ui`: static files that read the router's own JSON endpoints."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).with_name("static")

# The page and its assets are small and change with each release: the browser must ask
# again each time rather than run an old ui.js against a newer router.
NO_CACHE = {"Cache-Control": "no-cache"}


async def _page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "ui.html", headers=NO_CACHE)


async def _asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    # Only the files that ship beside ui.html, never a path that climbs out of it.
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise web.HTTPNotFound(text=f"no such file: /ui/static/{name}")
    return web.FileResponse(path, headers=NO_CACHE)


def add_ui_routes(app: web.Application) -> None:
    """Serve the web page at `/ui` and its assets under `/ui/static/`."""
    app.router.add_get("/ui", _page)
    app.router.add_get("/ui/", _page)
    app.router.add_get("/ui/static/{name}", _asset)
