"""The web page's files and routes, without a browser: what `/ui` serves, what it refuses,
and what its modules may and may not do."""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from swaplab.router.api.ui import STATIC_DIR, VENDOR_DIR, VENDOR_FILES, add_ui_routes

MODULES = sorted(path.name for path in STATIC_DIR.glob("*.js"))
# `import ... from "./x.js"`, `export ... from "./x.js"`, `import("./x.js")`
IMPORT = re.compile(r"""(?:\bfrom\s*|\bimport\s*\(\s*|^import\s+)["']([^"']+)["']""", re.MULTILINE)


async def ui_client() -> TestClient:
    app = web.Application()
    add_ui_routes(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def imports_of(name: str) -> list[str]:
    return IMPORT.findall((STATIC_DIR / name).read_text())


async def test_page_and_every_module_it_loads_are_served_uncached():
    client = await ui_client()
    try:
        for path in ("/ui", "/ui/"):
            response = await client.get(path)
            assert response.status == 200
            assert response.content_type == "text/html"
            assert response.headers["Cache-Control"] == "no-cache"
            page = await response.text()
        assert '<script type="module" src="/ui/static/ui.js">' in page
        assert '<link rel="stylesheet" href="/ui/static/ui.css">' in page
        # Nothing from another origin: the page works on a machine without internet.
        assert "http://" not in page and "https://" not in page
        # Every module is reachable from ui.js through its imports, and each import is served
        # as JavaScript (a module script with another content type does not run).
        seen, todo = set(), ["ui.js"]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            response = await client.get(f"/ui/static/{name}")
            assert response.status == 200, name
            assert response.content_type == "text/javascript", name
            assert response.headers["Cache-Control"] == "no-cache"
            assert await response.read() == (STATIC_DIR / name).read_bytes()
            for target in imports_of(name):
                if target.startswith("/ui/static/vendor/"):
                    continue  # loaded only when vendor.json lists it
                assert target.startswith("./") and "/" not in target[2:], f"{name} imports {target}"
                todo.append(target[2:])
        assert seen == set(MODULES), f"modules nothing imports: {set(MODULES) - seen}"
        response = await client.get("/ui/static/ui.css")
        assert response.status == 200 and response.content_type == "text/css"
    finally:
        await client.close()


async def test_vendor_manifest_lists_exactly_the_libraries_present():
    client = await ui_client()
    try:
        response = await client.get("/ui/static/vendor.json")
        assert response.status == 200
        listed = (await response.json())["files"]
        assert listed == [name for name in VENDOR_FILES if (VENDOR_DIR / name).is_file()]
        for name in VENDOR_FILES:
            response = await client.get(f"/ui/static/vendor/{name}")
            assert response.status == (200 if name in listed else 404), name
            if name in listed:
                assert await response.read() == (VENDOR_DIR / name).read_bytes()
    finally:
        await client.close()


async def test_nothing_outside_the_static_folders_is_served():
    client = await ui_client()
    try:
        for path in (
            "/ui/static/nope.js",
            "/ui/static/..",
            "/ui/static/%2e%2e%2fui.py",
            "/ui/static/../ui.py",
            "/ui/static/vendor/../ui.js",
            "/ui/static/vendor/..%2f..%2fui.py",
            "/ui/static/vendor/%2e%2e%2fui.js",
            "/ui/static/vendor/.fetched-uplot@1.6.32-ansi_up@6.0.6",
            "/ui/static/vendor/uPlot.LICENSE",
            "/ui/static/ui.html",
            "/ui/static/vendor/",
        ):
            # Sent as written: a client would otherwise resolve the dots itself.
            response = await client.session.get(URL(str(client.make_url("")) + path, encoded=True))
            assert response.status == 404, path
            assert "add_ui_routes" not in await response.text()
    finally:
        await client.close()


def test_only_ansi_output_is_ever_set_as_html():
    # A model's answer, a log line or a header could carry markup: the page builds text
    # nodes, except for ansi_up's output, which escapes the text before colouring it.
    for name in MODULES:
        text = (STATIC_DIR / name).read_text()
        uses = re.findall(r"\.(innerHTML|outerHTML|insertAdjacentHTML)\b|document\.write", text)
        assert uses == ([] if name != "ansi.js" else ["innerHTML"]), name
        assert "eval(" not in text and "new Function" not in text, name


def test_modules_fetch_only_the_routers_own_paths():
    # Every URL the page requests is a path on the router itself (no CDN, no other host).
    for name in MODULES:
        text = (STATIC_DIR / name).read_text().replace('"http://www.w3.org/2000/svg"', "")  # a name, not a fetch
        assert not re.search(r"""["'`]https?://""", text), name
