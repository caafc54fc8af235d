"""The router's web page in a real browser: Debian's headless Chromium driven by Playwright."""

from __future__ import annotations

import json
import urllib.request

from browser import ARTIFACTS, console_errors, launch, require_chromium
from procs import SIM

require_chromium()

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

CONFIG = f"""
healthCheckTimeout: 30
devices:
  0: {{name: fake GPU 0, vramGiB: 16}}
  1: {{name: fake GPU 1, vramGiB: 16}}
models:
  a:
    name: Model A
    description: the first sim
    cmd: {SIM} --port ${{PORT}} --model a
    aliases: [alpha, first]
    devices: [0]
    vramGiB: 6
  b:
    name: Model B
    description: the second sim
    cmd: {SIM} --port ${{PORT}} --model b
    devices: [1]
    vramGiB: 10
peers:
  remote:
    proxy: http://127.0.0.1:9
    models: [big-model]
"""


def post_json(url: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


def chat(url: str, model: str) -> None:
    body = json.dumps({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def model_row(page: Page, model_id: str):
    return page.locator(f'#models tr[data-model="{model_id}"]')


def test_page_shows_state_and_its_buttons_load_and_unload(router_factory):
    router = router_factory(CONFIG)
    assert post_json(f"{router.url}/load?model=a") == (200, {"loaded": "a"})
    ARTIFACTS.mkdir(exist_ok=True)
    expect.set_options(timeout=20_000)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = console_errors(page)
        try:
            page.goto(f"{router.url}/ui")

            a, b = model_row(page, "a"), model_row(page, "b")
            expect(a.locator(".state")).to_have_text("ready")
            expect(b.locator(".state")).to_have_text("stopped")
            expect(a).to_contain_text("Model A")
            expect(a).to_contain_text("alpha")
            expect(a).to_contain_text("the first sim")
            device_0 = page.locator('#devices tr[data-device="0"]')
            expect(device_0).to_contain_text("fake GPU 0")
            expect(device_0).to_contain_text("a · 6.0 GiB")  # a's claim on it
            expect(device_0).to_contain_text("16.0 GiB")  # its size
            expect(page.locator('#peers tr[data-model="remote/big-model"]')).to_contain_text("available")
            # The live log pane streamed the backend's own output.
            expect(page.locator("#log")).to_contain_text("sim: model a listening")

            a.get_by_role("button", name="Unload", exact=True).click()
            expect(a.locator(".state")).to_have_text("stopped")
            expect(a.get_by_role("button", name="Load", exact=True)).to_be_enabled()

            b.get_by_role("button", name="Load", exact=True).click()
            expect(b.locator(".state")).to_have_text("ready")
            expect(page.locator("#log")).to_contain_text("sim: model b listening")

            chat(router.url, "b")
            expect(page.locator('#activity tr[data-model="b"]').first).to_contain_text("/v1/chat/completions")
        finally:
            # Also on failure: the picture shows what the page showed instead.
            page.screenshot(path=str(ARTIFACTS / "ui.png"), full_page=True)
            browser.close()
    assert errors == []
