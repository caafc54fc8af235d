"""The web page's routes, without a browser: what `/ui` serves and what it refuses."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from swaplab.router.ui import STATIC_DIR, add_ui_routes


async def ui_client() -> TestClient:
    app = web.Application()
    add_ui_routes(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_page_and_its_assets_are_served_uncached():
    client = await ui_client()
    try:
        for path in ("/ui", "/ui/"):
            response = await client.get(path)
            assert response.status == 200
            assert response.content_type == "text/html"
            assert response.headers["Cache-Control"] == "no-cache"
            page = await response.text()
        # Every asset the page names is served, from the package's own files (no CDN).
        for name, content_type in (("ui.js", "javascript"), ("ui.css", "text/css")):
            assert f"/ui/static/{name}" in page
            response = await client.get(f"/ui/static/{name}")
            assert response.status == 200 and content_type in response.content_type
            assert await response.read() == (STATIC_DIR / name).read_bytes()
        assert "http://" not in page and "https://" not in page
    finally:
        await client.close()


async def test_nothing_outside_the_static_folder_is_served():
    client = await ui_client()
    try:
        for path in ("/ui/static/nope.js", "/ui/static/..", "/ui/static/%2e%2e%2fui.py", "/ui/static/../ui.py"):
            # Sent as written: a client would otherwise resolve the dots itself.
            response = await client.session.get(URL(str(client.make_url("")) + path, encoded=True))
            assert response.status == 404, path
            assert "add_ui_routes" not in await response.text()
    finally:
        await client.close()
