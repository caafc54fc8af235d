"""The catalogue served live at `/catalog/` of a running router: the same pages as `swaplab site build`.

Pages are rebuilt on request when their sources changed, and only then: the config in
force (compared by identity, so a reload counts), the notes folder's file times and the
store's file times (its WAL included). A page is rendered the first time it is asked for
after a change; charts are kept by their numbers, so a new run redraws only its own.

It knows nothing of the router: `swaplab serve` adds these routes to the router's app,
with a way to read the config in force and the store's path.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from swaplab.config import Config
from swaplab.errors import SwaplabError

if TYPE_CHECKING:
    # The renderer (jinja2, markdown-it, pygments, matplotlib) is imported on the first page asked for,
    # not by every router: a router whose catalogue nobody opens keeps its memory.
    from swaplab.catalog.render import ChartCache, SiteRenderer

# Charts kept across rebuilds; past this many the cache starts afresh.
MAX_CACHED_CHARTS = 512
NO_CACHE = {"Cache-Control": "no-cache"}


def _file_stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


def notes_stamp(folder: str | None) -> Any:
    """Changes when a note is added, removed or edited."""
    if not folder:
        return None
    directory = Path(folder)
    try:
        entries = sorted(directory.glob("*.md"))
    except OSError:
        return "unreadable"
    return _file_stamp(directory), tuple((entry.name, _file_stamp(entry)) for entry in entries)


def store_stamp(database: Path) -> Any:
    """Changes when anything is written to the store (a commit lands in the WAL first)."""
    return tuple(_file_stamp(Path(f"{database}{suffix}")) for suffix in ("", "-wal"))


class LiveCatalog:
    """Owns the rendered pages of a running router's catalogue; `page` is blocking (call it from a thread)."""

    def __init__(self, current_config: Callable[[], Config], database: Path):
        self.current_config = current_config
        self.database = database
        self.builds = 0
        """How many times the site was gathered afresh (the tests count them)."""
        self._lock = threading.Lock()
        self._config: Config | None = None
        self._stamps: Any = None
        self._renderer: SiteRenderer | None = None
        self._pages: dict[str, bytes] = {}
        self._charts: ChartCache = {}

    def page(self, path: str) -> bytes | None:
        """The site's file at `path` (`""` is the index), rebuilt first if a source changed; None if there is none."""
        config = self.current_config()
        stamps = (notes_stamp(config.notes), store_stamp(self.database))
        with self._lock:
            if self._renderer is None or config is not self._config or stamps != self._stamps:
                self._rebuild(config, stamps)
            if path not in self._pages:
                page = self._renderer.render(path)
                if page is None:
                    return None
                self._pages[path] = page
            return self._pages[path]

    def _rebuild(self, config: Config, stamps: Any) -> None:
        from swaplab.catalog.render import SiteRenderer
        from swaplab.catalog.site import read_site

        database = self.database if self.database.is_file() else None
        site = read_site(config, config.notes, database)
        if len(self._charts) > MAX_CACHED_CHARTS:
            self._charts.clear()
        self._renderer = SiteRenderer(site, charts=self._charts)
        self._config, self._stamps, self._pages = config, stamps, {}
        self.builds += 1


CATALOG_KEY = web.AppKey("catalog", LiveCatalog)


async def _redirect(request: web.Request) -> web.Response:
    # The pages link relatively, so the index must be addressed as a folder.
    raise web.HTTPFound("/catalog/")


async def _page(request: web.Request) -> web.Response:
    path = request.match_info.get("path", "")
    if ".." in path.split("/"):
        raise web.HTTPNotFound(text=f"no such page: /catalog/{path}")
    try:
        body = await asyncio.to_thread(request.app[CATALOG_KEY].page, path)
    except SwaplabError as error:
        return web.Response(status=503, text=f"the catalogue cannot be built: {error}\n", headers=NO_CACHE)
    if body is None:
        raise web.HTTPNotFound(text=f"no such page: /catalog/{path}")
    from swaplab.catalog.render import content_type

    return web.Response(body=body, headers={**NO_CACHE, "Content-Type": content_type(path or "index.html")})


def add_catalog_routes(app: web.Application, current_config: Callable[[], Config], database: Path) -> None:
    """Serve at `/catalog/` the catalogue of the config in force (`current_config()`), its notes and `database`."""
    app[CATALOG_KEY] = LiveCatalog(current_config, database)
    app.router.add_get("/catalog", _redirect)
    app.router.add_get("/catalog/", _page)
    app.router.add_get("/catalog/{path:.+}", _page)
