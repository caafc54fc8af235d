"""The router's web page in a real browser: Debian's headless Chromium driven by Playwright."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from procs import SIM

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists() and not os.environ.get("CI"):
    pytest.skip(
        "the browser test needs Debian's chromium at /usr/bin/chromium (`make system-deps`, as root)",
        allow_module_level=True,
    )

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

# Playwright's own browser download cannot work offline: it drives Debian's Chromium, with
# the flags that keep Chromium from reaching for the network at every start.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

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
    console_errors: list[str] = []
    expect.set_options(timeout=20_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
            page.on("pageerror", lambda error: console_errors.append(f"uncaught: {error}"))
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
    assert console_errors == []
