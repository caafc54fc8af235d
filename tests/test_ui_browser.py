"""The router's web page in a real browser: Debian's headless Chromium driven by Playwright.

Every test starts a real router (`swaplab serve`) with real backends (`swaplab sim`, or
llama.cpp for the chat), drives the page and checks what it shows against what the
router did. Nothing waits by sleeping: Playwright's `expect` waits for what the page
must come to show.

Run as a script, it writes the screenshots of docs/ui.md:

    .venv/bin/python tests/test_ui_browser.py --screenshots [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from browser import ARTIFACTS, console_errors, launch, require_chromium
from procs import PYTHON, SIM, wait_until

require_chromium()

from playwright.sync_api import Page, expect, sync_playwright

WIDTHS = (1280, 390)
VIEWS = ("models", "model", "playground", "activity", "capture", "logs", "performance")
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
CHARTS_MISSING = "charting library not installed: run make ui-vendor"

CONFIG = f"""
healthCheckTimeout: 30
hostMemory: {{budgetGiB: 64}}
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
    description: the second sim, which sleeps
    cmd: {SIM} --port ${{PORT}} --model b --engine vllm --enable-sleep-mode
    env: [VLLM_SERVER_DEV_MODE=1]
    devices: [1]
    vramGiB: 10
    sleep: {{engine: vllm, level: 1, hostMemoryGiB: 4}}
  slow:
    description: two tokens a second
    cmd: {SIM} --port ${{PORT}} --model slow --tokens-per-second 2
    devices: [0]
    vramGiB: 2
peers:
  remote:
    proxy: http://127.0.0.1:9
    models: [big-model]
profiles:
  quick:
    description: pins the assistant to a
    pins: {{assistant: a}}
"""

# -- HTTP from outside the page ------------------------------------------------------


def post(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, method="POST", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read()


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def chat(url: str, model: str, content: str = "hi", max_tokens: int = 4, stream: bool = False) -> bytes:
    body = {"model": model, "max_tokens": max_tokens, "stream": stream, "messages": [{"role": "user", "content": content}]}
    status, answer = post(f"{url}/v1/chat/completions", body)
    assert status == 200
    return answer


def streamed_content(sse: bytes) -> str:
    """The answer text carried by a chat completion's event stream."""
    text = []
    for line in sse.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


# -- the browser -----------------------------------------------------------------------


@contextmanager
def chromium():
    expect.set_options(timeout=20_000)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, url: str, width: int = 1280, **options) -> tuple[Page, list[str]]:
    page = browser.new_page(viewport={"width": width, "height": 900}, **options)
    errors = console_errors(page)
    page.goto(url)
    return page, errors


def model_row(page: Page, model_id: str):
    return page.locator(f'.model-row[data-model="{model_id}"]')


def state_of(locator):
    return locator.locator(".model-state .state-label")


@contextmanager
def screenshot_on_exit(page: Page, name: str):
    """Also on failure: the picture shows what the page showed instead."""
    try:
        yield
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


# -- the tests -------------------------------------------------------------------------


def test_models_view_follows_the_router_live_and_its_buttons_act(router_factory):
    router = router_factory(CONFIG)
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/models")
        with screenshot_on_exit(page, "ui-models"):
            a, b = model_row(page, "a"), model_row(page, "b")
            expect(state_of(a)).to_have_text("stopped")
            expect(a).to_contain_text("Model A")
            expect(a).to_contain_text("alpha")
            expect(a).to_contain_text("the first sim")
            expect(page.locator('.peer-row[data-model="remote/big-model"]')).to_contain_text("available")
            page.evaluate("window.notReloaded = true")

            # A load from outside the page: the feed brings it, no reload, no poll.
            assert post(f"{router.url}/load?model=a")[0] == 200
            expect(state_of(a)).to_have_text("ready")
            expect(a).to_contain_text("pid ")
            device_0 = page.locator('.device[data-device="0"]')
            expect(device_0).to_contain_text("fake GPU 0")
            expect(device_0).to_contain_text("a · 6.0 GiB")
            assert page.evaluate("window.notReloaded") is True

            a.get_by_role("button", name="Unload", exact=True).click()
            expect(state_of(a)).to_have_text("stopped")
            expect(a.get_by_role("button", name="Load", exact=True)).to_be_enabled()

            # b sleeps: Sleep puts it to sleep, Wake (its Load) wakes it.
            expect(a.get_by_role("button", name="Sleep")).to_be_hidden()
            b.get_by_role("button", name="Load", exact=True).click()
            expect(state_of(b)).to_have_text("ready")
            b.get_by_role("button", name="Sleep", exact=True).click()
            expect(state_of(b)).to_have_text("sleeping")
            expect(b).to_contain_text("holds 4.0 GiB RAM")
            b.get_by_role("button", name="Wake", exact=True).click()
            expect(state_of(b)).to_have_text("ready")
            expect(b).to_contain_text("last wake")

            # The profile: chosen here, and changed elsewhere, as the feed tells.
            page.select_option('select[aria-label="Profile"]', "quick")
            wait_until(lambda: get_json(f"{router.url}/api/profiles")["active"] == "quick", 10, "the profile to be active")
            put_profile(router.url, None)
            expect(page.locator('select[aria-label="Profile"]')).to_have_value("")

            # Its own page: the entry as written and its backend's log.
            b.locator("a.model-id").click()
            detail = page.locator('.view-model[data-model="b"]')
            expect(detail.locator(".config-entry")).to_contain_text("sleep: {engine: vllm, level: 1, hostMemoryGiB: 4}")
            expect(detail.locator(".log")).to_contain_text("sim: model b listening")
            expect(detail.locator(".state-label").first).to_have_text("ready")
    assert errors == []


def test_playground_chat_streams_an_answer_from_llamacpp(router_factory):
    router = router_factory(None)  # the built-in default: SmolLM2 through llama.cpp's server
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/playground")
        with screenshot_on_exit(page, "ui-playground"):
            expect(page.locator("#playground-model option[value=smollm2]")).to_have_count(1)
            # Chat opens on the chat model, not on the base model sorted before it.
            expect(page.locator("#playground-model")).to_have_value("smollm2")
            page.fill("#max-tokens", "24")
            page.fill("#temperature", "0")
            page.fill("#chat-input", "What is the capital of France?")
            # Count the answer's updates: a streamed answer grows piece by piece.
            page.evaluate("""() => {
                window.answerUpdates = 0;
                new MutationObserver((records) => {
                    window.answerUpdates += records.filter((r) => r.target.closest?.('.message[data-role="assistant"] .message-content')).length;
                }).observe(document.querySelector("#transcript"), {childList: true, subtree: true, characterData: true});
            }""")
            page.keyboard.press("Enter")
            answer = page.locator('.message[data-role="assistant"]').last
            expect(answer).to_have_attribute("data-status", "done", timeout=120_000)
            expect(answer.locator(".message-meta")).to_contain_text("tokens")
            expect(page.locator("#chat-stop")).to_be_hidden()
            shown = answer.locator(".message-content").inner_text()
            assert page.evaluate("window.answerUpdates") > 1

    # What the page showed is what llama.cpp streamed, as the router captured it.
    wait_until(lambda: newest_row_after(router.url, 0), 10, "the chat in the activity")  # written by a thread
    row = get_json(f"{router.url}/api/metrics/activity?limit=1")["data"][0]
    assert row["model"] == "smollm2" and "event-stream" in row["resp_content_type"]
    capture = get_json(f"{router.url}/api/captures/{row['id']}")
    assert json.loads(base64.b64decode(capture["req_body"]))["stream"] is True
    sent = streamed_content(base64.b64decode(capture["resp_body"]))
    assert sent.strip() and shown.strip() == sent.strip()
    assert errors == []


def test_the_live_feed_comes_back_after_the_router_restarts(router_factory):
    router = router_factory(CONFIG)
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/models")
        with screenshot_on_exit(page, "ui-reconnect"):
            connection = page.locator("#connection")
            expect(connection).to_have_attribute("data-state", "live")
            router.close()
            expect(connection).to_have_attribute("data-state", "reconnecting")
            again = router_factory(CONFIG, port=router.port)
            expect(connection).to_have_attribute("data-state", "live", timeout=30_000)
            # The new router's feed is the one heard now.
            assert post(f"{again.url}/load?model=a")[0] == 200
            expect(state_of(model_row(page, "a"))).to_have_text("ready")
    # Only the network failed while the router was away (its streams cut, then refused).
    assert errors and all("Failed to load resource: net::ERR_" in error for error in errors), errors


def llamacpp_config() -> str:
    """SmolLM2 through llama.cpp twice: as the built-in default serves it, and for embeddings."""
    from swaplab.builtin.models import smollm2_path

    command = f"{PYTHON} -m swaplab.builtin.llamacpp --model {smollm2_path()} --host 127.0.0.1 --port ${{PORT}} --ctx-size 2048 --threads 2"
    return f"""
healthCheckTimeout: 60
models:
  smollm2:
    cmd: {command}
    proxy: http://127.0.0.1:${{PORT}}
    timeouts: {{idleConn: 4}}
    capabilities: {{in: [text], out: [text]}}
  smollm2-embed:
    cmd: {command} --embedding --pooling mean
    proxy: http://127.0.0.1:${{PORT}}
    timeouts: {{idleConn: 4}}
    capabilities: {{in: [text]}}
"""


def test_playground_completion_and_embeddings_from_llamacpp(router_factory):
    router = router_factory(llamacpp_config())
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/playground")
        with screenshot_on_exit(page, "ui-playground-tabs"):
            expect(page.locator("#playground-model option[value=smollm2]")).to_have_count(1)
            page.get_by_role("tab", name="Completion").click()
            expect(page.locator("#system-prompt")).to_be_hidden()  # a chat's parameter only
            page.select_option("#playground-model", "smollm2")
            page.fill("#max-tokens", "16")
            page.fill("#completion-prompt", "The capital of France is")
            page.locator("#completion-send").click()
            output = page.locator("#completion-output")
            expect(output).to_have_attribute("data-status", "done", timeout=120_000)
            expect(output.locator(".completion-prompt")).to_have_text("The capital of France is")
            assert output.locator(".completion-text").inner_text().strip()

            # The tab moves off the chat model, which serves no embeddings, to the one whose
            # capabilities say text in and nothing out (as the built-in default's smollm2-embed).
            page.get_by_role("tab", name="Embeddings").click()
            expect(page.locator("#playground-model")).to_have_value("smollm2-embed")
            page.fill("#embedding-input", "swaplab swaps models")
            page.locator("#embedding-send").click()
            expect(page.locator("#embedding-result .embedding-dimensions")).to_have_text("576", timeout=120_000)
            page.get_by_role("tab", name="Chat").click()
            expect(page.locator("#playground-model")).to_have_value("smollm2")
    assert not errors, errors


def test_an_activity_row_opens_its_capture(router_factory):
    router = router_factory(CONFIG)
    chat(router.url, "a", content="show me in the capture")
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/activity")
        with screenshot_on_exit(page, "ui-capture"):
            # The header names the store the rows come from: what `swaplab activity --db` reads.
            expect(page.locator(".view-activity .view-head #activity-store")).to_have_text(str(router.db))
            row = page.locator('.activity-table tbody tr[data-model="a"]').first
            expect(row).to_contain_text("/v1/chat/completions")
            row.click()
            dialog = page.locator("#capture")
            expect(dialog).to_be_visible()
            expect(dialog.locator(".dialog-title")).to_contain_text("/v1/chat/completions")
            request_body = dialog.locator(".capture-part").first.locator("pre")
            expect(request_body).to_contain_text('"content": "show me in the capture"')  # JSON, indented
            expect(dialog).to_contain_text("Content-Type")
            dialog.get_by_role("tab", name="Response").click()
            response_body = dialog.locator(".capture-part").nth(1).locator("pre")
            expect(response_body).to_contain_text('"object": "chat.completion"')
            page.keyboard.press("Escape")
            expect(dialog).to_be_hidden()

            # A new request shows without a reload: the feed says a row was written.
            chat(router.url, "a", content="second")
            rows = page.locator(".view-activity .activity-table tbody tr")
            expect(rows).to_have_count(2)
            expect(rows.first).to_have_attribute("data-id", "2")
            # The router sorts: oldest first.
            page.locator('.view-activity button.sort[data-sort="id"]').click()
            expect(rows.first).to_have_attribute("data-id", "1")
            # The export holds every row of the filter, as CSV.
            with page.expect_download() as download:
                page.get_by_role("button", name="CSV").click()
            lines = Path(download.value.path()).read_text().splitlines()
            assert lines[0].startswith("id,timestamp,model,") and len(lines) == 3
            assert [line.split(",")[2] for line in lines[1:]] == ["a", "a"]
    assert errors == []


def test_cancelling_an_inflight_request_from_the_page_reaches_the_model(router_factory):
    router = router_factory(CONFIG)
    assert post(f"{router.url}/load?model=slow")[0] == 200
    proxy = next(entry["proxy"] for entry in get_json(f"{router.url}/running")["running"] if entry["model"] == "slow")
    answer: list[bytes] = []
    # 200 tokens at 2 a second: it would take 100 s.
    client = threading.Thread(target=lambda: answer.append(chat(router.url, "slow", max_tokens=200, stream=True)), daemon=True)
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/activity")
        with screenshot_on_exit(page, "ui-cancel"):
            expect(page.locator("#inflight")).to_be_hidden()  # nothing in flight yet
            client.start()
            row = page.locator('#inflight tr[data-model="slow"]')
            expect(row).to_contain_text("POST /v1/chat/completions")
            expect(row.locator('[data-label="Stage"]')).to_have_text("answering")
            expect(page.locator("#inflight-count")).to_have_text("1")
            row.get_by_role("button", name="Cancel").click()
            expect(row).to_have_count(0)
            expect(page.locator("#inflight-count")).to_be_hidden()
    client.join(30)
    assert answer and b"cancelled" in answer[0]  # the client's stream ended with the router's error event
    wait_until(lambda: get_json(f"{proxy}/sim/stats")["cancelled"] == 1, 10, "the sim to count the request cancelled")
    assert errors == []


def test_every_view_at_both_widths_without_console_errors(router_factory, tmp_path):
    router = router_factory(demo_config(tmp_path))
    demo_traffic(router.url)
    with chromium() as browser:
        for width in WIDTHS:
            for theme in ("light", "dark"):
                errors = capture_views(browser, router.url, ARTIFACTS / "ui-views", width, theme)
                assert errors == [], (width, theme)


def test_logs_show_ansi_colours_and_filter(router_factory, tmp_path):
    router = router_factory(demo_config(tmp_path))
    assert post(f"{router.url}/load?model=embedder")[0] == 200
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/logs")
        with screenshot_on_exit(page, "ui-logs"):
            log = page.locator(".view-logs .log")
            expect(log.locator(".ansi-green-fg", has_text="INFO")).to_be_visible()
            expect(log).not_to_contain_text("\x1b[")
            page.fill(".view-logs .log-filter", "warming")
            expect(log.locator(".log-line:visible")).to_have_count(1)
            expect(log.locator(".log-line:visible")).to_contain_text("embedder warming up")
    assert errors == []


def test_the_page_works_without_the_vendored_libraries(router_factory):
    router = router_factory(CONFIG)
    chat(router.url, "a")
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = console_errors(page)
        # As on a clone where `make ui-vendor` never ran: the router lists no library.
        page.route("**/ui/static/vendor.json", lambda route: route.fulfill(json={"files": []}))
        page.goto(f"{router.url}/ui#/activity")
        with screenshot_on_exit(page, "ui-no-vendor"):
            duration = page.locator('[data-histogram="duration_histogram"]')
            expect(duration.locator(".chart-missing")).to_have_text(CHARTS_MISSING)
            expect(page.locator('.activity-table tbody tr[data-model="a"]')).to_have_count(1)
            page.goto(f"{router.url}/ui#/logs")
            expect(page.locator(".view-logs .log")).to_contain_text("sim: model a listening")
            page.goto(f"{router.url}/ui#/performance")
            expect(page.locator(".chart-missing").first).to_have_text(CHARTS_MISSING)
    assert errors == []


def test_a_router_with_api_keys_asks_for_one_once(router_factory):
    router = router_factory("apiKeys: [sesame]\n" + CONFIG)
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/models")
        with screenshot_on_exit(page, "ui-key"):
            dialog = page.locator("#key-dialog")
            expect(dialog).to_be_visible()
            expect(page.locator("#connection")).to_have_attribute("data-state", "unauthorized")
            page.fill("#key-input", "sesame")
            page.get_by_role("button", name="Use this key").click()
            # The page starts again with the key: the feed (a fetch with the header) goes live.
            expect(page.locator("#connection")).to_have_attribute("data-state", "live")
            expect(state_of(model_row(page, "a"))).to_have_text("stopped")
            assert post_with_key(f"{router.url}/load?model=a", "sesame") == 200
            expect(state_of(model_row(page, "a"))).to_have_text("ready")
            expect(dialog).to_be_hidden()
        # Before the key, the router's 401s were the only errors.
        assert errors and all("401" in error for error in errors), errors

        # `?key=` is taken once, kept, and dropped from the address.
        page, errors = open_page(browser, f"{router.url}/ui?key=sesame#/models")
        expect(page.locator("#connection")).to_have_attribute("data-state", "live")
        assert "key=" not in page.url
    assert errors == []


def test_gpus_on_the_performance_view_and_their_memory_on_the_devices(tmp_path):
    # No GPU here: the router runs in this process with NVML's readings handed in, through
    # the same hooks the sampler's and the fleet's own tests use.
    from swaplab.fleet.devices import DeviceActivity, DeviceReading

    gib = 1024**3
    activity = [
        DeviceActivity(index=index, name=name, uuid=f"GPU-{index}", utilisation_percent=load, memory_used_bytes=used * gib,
                       memory_total_bytes=80 * gib, temperature_celsius=55 + index, power_watts=300.0 + index, fan_percent=None)
        for index, name, load, used in ((0, "H100 80GB", 87.0, 61), (1, "H100 80GB", 12.0, 9))
    ]
    readings = {0: DeviceReading(index=0, name="NVIDIA H100 80GB", total_gib=80.0, used_gib=61.0, free_gib=19.0)}
    config = "devices:\n  0: {name: H100, vramGiB: 80}\nmodels:\n  a: {cmd: " + f"'{SIM} --port ${{PORT}} --model a'" + ", devices: [0], vramGiB: 40}\n"
    with in_process_router(tmp_path, config, gpus=lambda: activity, readings=lambda: readings) as url:
        with chromium() as browser:
            page, errors = open_page(browser, f"{url}/ui#/models")
            with screenshot_on_exit(page, "ui-gpus"):
                expect(page.locator('.device[data-device="0"] .device-nvml')).to_have_text("in use 61.0 GiB · free 19.0 GiB (NVML)")
                page.goto(f"{url}/ui#/performance")
                gpus = page.locator(".view-performance .section", has_text="GPUs")
                for title in ("Utilisation", "Memory used", "Power", "Temperature"):
                    card = gpus.locator(".card", has_text=title)
                    expect(card.locator("canvas").first).to_be_visible()
                    expect(card.locator(".u-legend")).to_contain_text("GPU 0 H100 80GB")
                    expect(card.locator(".u-legend")).to_contain_text("GPU 1 H100 80GB")
        assert errors == []


@contextmanager
def in_process_router(folder: Path, config_text: str, *, gpus, readings):
    """swaplab's router on a loopback port in a thread of this process, NVML replaced by `gpus` and `readings`."""
    import asyncio

    from aiohttp import web
    from configtext import load
    from procs import free_port, free_port_block

    from swaplab.fleet.performance import PerformanceSampler
    from swaplab.router.app import Router

    class Probe:
        def read(self):
            return readings()

        def activity(self):
            return gpus()

        def close(self):
            pass

    router = Router(load(f"startPort: {free_port_block()}\n" + config_text), state_dir=folder / "state", db=folder / "swaplab.db")
    router.fleet.device_probe = Probe()
    router.performance = PerformanceSampler(5.0, False, read_gpus=gpus)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(router.app())
    loop.run_until_complete(runner.setup())
    port = free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def put_profile(url: str, name: str | None) -> None:
    request = urllib.request.Request(
        f"{url}/api/profiles/active", method="PUT", data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_stop_in_the_playground_cancels_the_request_at_the_model(router_factory):
    router = router_factory(CONFIG)
    assert post(f"{router.url}/load?model=slow")[0] == 200
    proxy = next(entry["proxy"] for entry in get_json(f"{router.url}/running")["running"] if entry["model"] == "slow")
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/playground")
        with screenshot_on_exit(page, "ui-stop"):
            expect(page.locator("#playground-model option[value=slow]")).to_have_count(1)
            page.select_option("#playground-model", "slow")
            page.fill("#max-tokens", "200")  # 100 s at 2 tokens a second
            page.fill("#chat-input", "take your time")
            page.keyboard.press("Enter")
            answer = page.locator('.message[data-role="assistant"]').last
            expect(answer.locator(".message-content")).to_contain_text("tok0")  # it streams
            page.locator("#chat-stop").click()
            expect(answer).to_have_attribute("data-status", "stopped")
            expect(page.locator("#chat-send")).to_be_enabled()
    wait_until(lambda: get_json(f"{proxy}/sim/stats")["cancelled"] == 1, 10, "the sim to count the request cancelled")
    assert errors == []


def test_performance_view_says_when_sampling_is_off(router_factory):
    router = router_factory("performance: {disabled: true}\n" + CONFIG)
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/performance")
        with screenshot_on_exit(page, "ui-performance-off"):
            expect(page.locator(".view-performance")).to_contain_text("Performance sampling is off")
            expect(page.locator(".view-performance canvas")).to_have_count(0)
            expect(page.locator(".view-performance .facts")).to_contain_text("CPU")  # the hardware still
    # The router's 503 {"enabled": false} is the only console error.
    assert len(errors) == 1 and "503" in errors[0], errors


def test_the_pages_pure_functions_in_the_browser(router_factory):
    # What end-to-end runs rarely meet: a CRLF split across two chunks, a formula in a CSV
    # cell, a binary body, llama-swap's -1 for "not reported".
    router = router_factory(CONFIG)
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/models")
        results = page.evaluate("""async () => {
            const { readEvents, parseEvent } = await import("/ui/static/sse.js");
            const { toCsv } = await import("/ui/static/activity.js");
            const { describeBody } = await import("/ui/static/capture.js");
            const { count, rate, ms, duration } = await import("/ui/static/format.js");
            const { dedent } = await import("/ui/static/model.js");
            const { contextText, describeModel, modelChips, modelFacts } = await import("/ui/static/modelparts.js");
            const savedAt = Date.now() / 1000 - 90;
            const saved = [{ slot: 1, tokens: 1150, bytes: 26514856, saved_at: savedAt }, { slot: 0, tokens: 9, bytes: 40, saved_at: 1, stale: true }];
            const chunks = ["data: one\\r", "\\n\\r\\n: a comment\\n\\nevent: x\\ndata: two\\ndata: lines\\n\\ndata: cut"];
            const body = new ReadableStream({ start(controller) {
                for (const chunk of chunks) controller.enqueue(new TextEncoder().encode(chunk));
                controller.close();
            } });
            const events = [];
            for await (const event of readEvents(body)) events.push(event);
            const row = { id: 1, timestamp: "t", model: "=HYPERLINK(1)", req_path: "/v1/x", resp_status_code: 200,
                          resp_content_type: "a, b", tokens: { input_tokens: 3, output_tokens: -1 }, duration_ms: 5, error_msg: 'say "hi"' };
            return {
                events,
                comment: parseEvent(": only a comment"),
                csv: toCsv([row]).split("\\r\\n")[1],
                json: describeBody(btoa('{"a":1}'), "application/json"),
                sse: describeBody(btoa('data: {"a":1}\\n\\n'), "text/event-stream"),
                binary: describeBody(btoa(String.fromCharCode(0xff, 0xfe, 0x00)), "image/png"),
                none: describeBody(null, ""),
                formats: [count(-1), count(1234), rate(-1), rate(0), ms(999), ms(1500), duration(125)],
                dedent: dedent("  a:\\n    b: 1\\n"),
                estimated: (() => {
                    const detail = "estimated from m.gguf at context 8192: device 0: weights 0.09 + kv 0.18 + compute 0.02 = 0.29 GiB";
                    const model = describeModel({ id: "m", state: "ready", claim_estimate: detail }, { devices: { "0": 0.29 } }, null, 0);
                    const chip = modelChips(model).find((node) => node.textContent.startsWith("GPU"));
                    return { chip: chip.textContent, title: chip.title, facts: modelFacts(model).map((fact) => fact.text) };
                })(),
                context: [
                    contextText({ min_tokens: 1024, saved, saved_tokens: 1150, saved_bytes: 26514856 }, "stopped"),
                    contextText({ min_tokens: 1024, saved, saved_tokens: 1150, saved_bytes: 26514856, restored_tokens: 1150, last_restore_seconds: 0.012 }, "ready"),
                    contextText({ min_tokens: 1024, saved: [saved[1]], saved_tokens: 0, saved_bytes: 0 }, "stopped"),
                ],
            };
        }""")
    assert results["events"] == [{"event": "message", "data": "one"}, {"event": "x", "data": "two\nlines"}]
    assert results["comment"] is None
    assert results["csv"] == "1,t,'=HYPERLINK(1),,/v1/x,200,\"a, b\",,3,-1,,,,,,5,,,\"say \"\"hi\"\"\""
    assert results["json"] == {"text": '{\n  "a": 1\n}', "note": "7 B · JSON"}
    assert results["sse"]["text"] == 'data: {"a":1}\n\n'  # as it was sent, not re-indented
    assert results["binary"]["text"] == "" and "binary" in results["binary"]["note"]
    assert results["none"] == {"text": "", "note": "No body captured."}
    assert results["formats"][0] == "–" and results["formats"][2:5] == ["–", "–", "999 ms"]
    assert results["formats"][5:] == ["1.50 s", "2:05"]
    assert results["dedent"] == "a:\n  b: 1"
    # kvCache: what is saved (a stale slot not counted), what a running model restored.
    assert results["context"][0] == "context saved: 1,150 tokens in 1 slot · 25 MiB · 2 min ago"
    assert results["context"][1].startswith("restored 1,150 tokens in ") and "context saved: 1,150 tokens" in results["context"][1]
    assert results["context"][2] == "keeps its context across swaps (slots of 1,024+ tokens)"
    # A claim estimated from the model file (issue 24): marked on its chip, the arithmetic shown.
    assert results["estimated"]["chip"].endswith(" est.") and "weights 0.09 + kv 0.18" in results["estimated"]["title"]
    assert any(text.startswith("memory estimated from m.gguf") for text in results["estimated"]["facts"])
    assert errors == []


VLLM_STARTUP = Path(__file__).parent / "fixtures" / "startup" / "vllm.log"


def test_a_loading_model_shows_its_stage_and_eta_as_a_bar(router_factory):
    # A sim that starts like vLLM (its real startup lines, replayed over 8 s). The first start
    # gives the history; the second one shows a bar with the share done and the time left.
    router = router_factory(f"""
models:
  qwen3-32b:
    name: Qwen3 32B
    cmd: {SIM} --port ${{PORT}} --model qwen3-32b --startup-log {VLLM_STARTUP} --startup-seconds 8
""")
    chat(router.url, "qwen3-32b")
    post(f"{router.url}/api/models/unload/qwen3-32b")
    loading = threading.Thread(target=chat, args=(router.url, "qwen3-32b"), daemon=True)
    loading.start()
    with chromium() as browser:
        page, errors = open_page(browser, f"{router.url}/ui#/models")
        with screenshot_on_exit(page, "ui-load-progress"):
            row = model_row(page, "qwen3-32b")
            bar = row.locator(".load-progress")
            expect(bar).to_be_visible()
            expect(bar.locator(".load-text")).to_contain_text("left (usually")
            expect(bar.locator(".load-text")).to_contain_text("capturing CUDA graphs", timeout=20_000)
            assert int(bar.get_attribute("aria-valuenow")) > 0
            if os.environ.get("SWAPLAB_SCREENSHOTS"):
                row.screenshot(path=str(SCREENSHOTS / "model-loading-1280.png"))
            loading.join(60)
            expect(state_of(row)).to_have_text("ready")
            expect(bar).to_be_hidden()
    assert errors == [], errors


def post_with_key(url: str, key: str) -> int:
    request = urllib.request.Request(url, method="POST", data=b"", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status


# -- every view, and the screenshots of docs/ui.md -----------------------------------------

COLOUR_SIM = """\
import os, sys
print("\\x1b[32mINFO\\x1b[0m embedder warming up \\x1b[2m(sim)\\x1b[0m", flush=True)
print("\\x1b[33mWARN\\x1b[0m no GPU here: swaplab sim stands in for the engine", flush=True)
os.execv(sys.executable, [sys.executable, "-m", "swaplab", "sim", *sys.argv[1:]])
"""

THINKING_SCRIPT = {
    "rules": [
        {
            "match": "capital of France",
            "replies": [
                {
                    "reasoning": "The user wants the capital of France. That is Paris, on the Seine. One sentence will do.",
                    "content": "The capital of France is Paris.",
                }
            ],
        }
    ],
    "default": "Swapping models is cheap when the one leaving the GPU falls asleep instead of stopping: "
    "its process, CUDA graphs and compiled kernels stay, and only the weights move.",
}


def demo_config(folder: Path) -> str:
    """A fleet that shows every state the page draws: GPUs, a sleeper, a crash, a peer, a profile,
    and a real llama.cpp model for real prefill and decode speeds."""
    from swaplab.builtin.models import smollm2_path

    colour = folder / "colour_sim.py"
    colour.write_text(COLOUR_SIM)
    script = folder / "thinking.json"
    script.write_text(json.dumps(THINKING_SCRIPT))
    return f"""
healthCheckTimeout: 30
hostMemory: {{budgetGiB: 64}}
devices:
  0: {{name: RTX 5060 Ti, vramGiB: 16}}
  1: {{name: RTX 4060 Ti, vramGiB: 16}}
models:
  qwen3-8b:
    name: Qwen3 8B
    description: Chat and tool use. Sleeps instead of stopping.
    cmd: {SIM} --port ${{PORT}} --model qwen3-8b --served-model-name qwen3-8b qwen assistant --tokens-per-second 80
      --engine vllm --enable-sleep-mode --wake-seconds 0.4 --script {script}
    env: [VLLM_SERVER_DEV_MODE=1]
    aliases: [qwen, assistant]
    devices: [0]
    vramGiB: 9
    capabilities: {{in: [text, image], out: [text], tools: true, context: 32768}}
    sleep: {{engine: vllm, level: 1, hostMemoryGiB: 18}}
  embedder:
    description: Embeddings for retrieval.
    cmd: {PYTHON} {colour} --port ${{PORT}} --model embedder --tokens-per-second 400
    devices: [0]
    vramGiB: 2.5
  gemma3-12b:
    name: Gemma 3 12B
    description: Long documents.
    cmd: {SIM} --port ${{PORT}} --model gemma3-12b --load-seconds 1 --tokens-per-second 40
    aliases: [gemma]
    devices: [1]
    capabilities: {{context: 131072}}
  smollm2:
    name: SmolLM2 135M
    description: llama.cpp on the CPU, for real prefill and decode speeds.
    cmd: {PYTHON} -m swaplab.builtin.llamacpp --model {smollm2_path()} --port ${{PORT}} --ctx-size 2048 --threads 2
    proxy: http://127.0.0.1:${{PORT}}
    timeouts: {{idleConn: 4}}
    devices: [0]
    vramGiB: 0.5
  mistral-small:
    name: Mistral Small 3.2
    description: Exits while loading, to show a failed start.
    cmd: >-
      {PYTHON} -c "raise SystemExit('CUDA error: out of memory')" --port ${{PORT}}
    devices: [0]
    vramGiB: 1
profiles:
  coding:
    description: the coding assistant
    pins: {{assistant: qwen3-8b}}
peers:
  cloud:
    proxy: http://127.0.0.1:9
    models: [gpt-oss-120b]
"""


def demo_traffic(url: str) -> None:
    """Requests that leave something to see in every view: cold starts, a wake, a failure, two sleepers."""
    for words in (12, 40, 90):
        chat(url, "qwen", content=f"write {words} words", max_tokens=words, stream=True)
    chat(url, "qwen", content="What is the capital of France?", stream=True)
    for size in (8, 30, 60, 120):
        chat(url, "embedder", max_tokens=size)
    chat(url, "gemma", content="summarise this", max_tokens=80, stream=True)  # stops nothing: GPU 1
    for question in ("Name three colours.", "What is a GPU?", "Say hello in French.", "Count to five."):
        chat(url, "smollm2", content=question, max_tokens=24)
    put_to_sleep(url, "qwen3-8b")
    chat(url, "qwen", content="are you awake?", max_tokens=20, stream=True)  # a wake
    try:
        post(f"{url}/load?model=mistral-small")
    except urllib.error.HTTPError as error:
        assert error.code == 503
    put_to_sleep(url, "qwen3-8b")


def put_to_sleep(url: str, model: str) -> None:
    """Sleep now; a 409 (the request just answered is still being let go) is asked again."""

    def asleep() -> bool:
        try:
            post(f"{url}/api/models/sleep/{model}")
        except urllib.error.HTTPError as error:
            assert error.code == 409, error
        return model_state(url, model) in ("falling_asleep", "sleeping")

    wait_until(asleep, 30, f"{model} to fall asleep", interval=0.2)
    wait_until(lambda: model_state(url, model) == "sleeping", 30, f"{model} to be asleep")


def newest_row_after(url: str, total: int) -> int | None:
    """The id of the newest activity row once there are more than `total`."""
    page = get_json(f"{url}/api/metrics/activity?limit=1")
    return page["data"][0]["id"] if page["total"] > total else None


def model_state(url: str, model: str) -> str:
    return next((entry["state"] for entry in get_json(f"{url}/running")["running"] if entry["model"] == model), "stopped")


def capture_views(browser, url: str, folder: Path, width: int, theme: str = "light") -> list[str]:
    """Open every view at `width`, check it drew, save `VIEW-WIDTH[-dark].png`; the console's errors."""
    folder.mkdir(parents=True, exist_ok=True)
    page, errors = open_page(browser, f"{url}/ui#/models", width=width, color_scheme=theme)
    suffix = f"{width}" if theme == "light" else f"dark-{width}"

    def shot(name: str) -> None:
        page.screenshot(path=str(folder / f"{name}-{suffix}.png"), full_page=True)

    if width < 860:  # a phone: the views are behind the menu
        expect(page.locator(".nav")).to_be_hidden()
        page.get_by_role("button", name="Menu").click()
        page.locator(".nav").get_by_role("link", name="Logs").click()
        expect(page.locator(".view-logs")).to_be_visible()
        expect(page.locator(".nav")).to_be_hidden()
        page.goto(f"{url}/ui#/models")

    expect(state_of(model_row(page, "qwen3-8b"))).to_have_text("sleeping")
    expect(page.locator(".device").first).to_be_visible()
    shot("models")

    page.goto(f"{url}/ui#/models/qwen3-8b")
    expect(page.locator(".view-model .log")).to_contain_text("sim: model qwen3-8b listening")
    expect(page.locator(".view-model .activity-table tbody tr").first).to_be_visible()
    shot("model")

    page.goto(f"{url}/ui#/playground")
    expect(page.locator("#playground-model option[value=qwen3-8b]")).to_have_count(1)
    page.select_option("#playground-model", "qwen3-8b")
    page.fill("#chat-input", "What is the capital of France?")
    rows_before = get_json(f"{url}/api/metrics/activity?limit=1")["total"]
    page.keyboard.press("Enter")
    answer = page.locator('.message[data-role="assistant"]').last
    expect(answer).to_have_attribute("data-status", "done")
    expect(answer.locator(".reasoning summary")).to_contain_text("Thought for")
    chat_row = wait_until(lambda: newest_row_after(url, rows_before), 10, "the playground's request in the activity")
    answer.locator(".reasoning summary").click()  # unfold the thinking for the picture
    shot("playground")
    put_to_sleep(url, "qwen3-8b")  # as it was: the next width's models view shows it asleep

    page.goto(f"{url}/ui#/activity")
    expect(page.locator('.view-activity .activity-table [data-waited="wake"]').first).to_be_visible()
    expect(page.locator('[data-histogram="duration_histogram"] canvas').first).to_be_visible()
    shot("activity")
    page.locator(f'.view-activity .activity-table tbody tr[data-id="{chat_row}"]').click()  # the playground's chat
    page.locator("#capture").get_by_role("tab", name="Response").click()
    expect(page.locator("#capture .capture-part").nth(1).locator("pre")).to_contain_text("reasoning_content")
    page.screenshot(path=str(folder / f"capture-{suffix}.png"))  # a dialog: the window, not the page under it
    page.keyboard.press("Escape")

    page.goto(f"{url}/ui#/logs")
    expect(page.locator(".view-logs .log .ansi-green-fg").first).to_be_visible()
    shot("logs")

    page.goto(f"{url}/ui#/performance")
    expect(page.locator(".view-performance .facts")).to_contain_text("CPU")
    expect(page.locator(".view-performance canvas").first).to_be_visible()
    shot("performance")
    page.close()
    return errors


def write_screenshots(folder: Path) -> None:
    """Start the demo fleet, give it traffic and a minute of performance samples, photograph every view."""
    from conftest import write_config
    from procs import Router

    with tempfile.TemporaryDirectory(prefix="swaplab-ui-") as workdir:
        router = Router(write_config(Path(workdir), demo_config(Path(workdir))), Path(workdir))
        try:
            demo_traffic(router.url)

            def a_minute_of_samples() -> bool:
                chat(router.url, "embedder", max_tokens=200)  # something for the CPU chart to show
                return len(get_json(f"{router.url}/api/performance")["sys_stats"] or []) >= 12

            wait_until(a_minute_of_samples, 120, "a minute of performance samples (one each 5 s)", interval=4)
            with chromium() as browser:
                for width in WIDTHS:
                    errors = capture_views(browser, router.url, folder, width)
                    assert errors == [], errors
                page, errors = open_page(browser, f"{router.url}/ui#/models", width=1280, color_scheme="dark")
                expect(state_of(model_row(page, "qwen3-8b"))).to_have_text("sleeping")
                page.screenshot(path=str(folder / "models-dark-1280.png"), full_page=True)
                assert errors == [], errors
        finally:
            router.close()
    for path in sorted(folder.glob("*.png")):
        print(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", action="store_true", help="write the screenshots of docs/ui.md")
    parser.add_argument("--out", type=Path, default=SCREENSHOTS)
    arguments = parser.parse_args()
    if not arguments.screenshots:
        parser.error("nothing to do: pass --screenshots (the tests run under pytest)")
    write_screenshots(arguments.out)
    sys.exit(0)
