"""The built catalogue in a real browser, from file://: sort the index, follow a model link and a wikilink."""

from __future__ import annotations

import os
from pathlib import Path

from catalogdata import (
    SEED_ALIAS, SEED_CONFIG, SEED_ID, SEED_NOTES, SEPTEMBER_4, grill_run, lmeval_grill_run, lmeval_task, seed_bench_runs,
    throughput_run,
)
from browser import ARTIFACTS, console_errors, launch, require_chromium

from swaplab.catalog.build import build_site
from swaplab.results.runs import save_run

require_chromium()

from playwright.sync_api import expect, sync_playwright  # noqa: E402

SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"

# The seed's entry among three more models on two declared GPUs (names from the seed's comments).
EXTRA = """\
devices:
  0: {name: RTX 5060 Ti, vramGiB: 16}
  1: {name: RTX 4060 Ti, vramGiB: 16}

models:
  glm-flash-awq:
    name: GLM-4.7-Flash AWQ (vLLM)
    description: The incumbent agent driver; same weights as glm-flash-sglang, served by vLLM.
    aliases: [glm-4.7-flash-awq]
    # fp8 KV, 163840 context: the driver for agent clients.
    cmd: vllm serve QuantTrio/GLM-4.7-Flash-AWQ --port ${PORT} --tensor-parallel-size 2
      --served-model-name glm-flash-awq glm-4.7-flash-awq
    devices: [0, 1]
    vramGiB: 14.5
  qwen3-coder:
    name: Qwen3-Coder 30B-A3B
    cmd: llama-server --port ${PORT} -m /models/qwen3-coder-30b-a3b-q4_k_m.gguf
    devices: [1]
    vramGiB: 15
  gemma-awq:
    name: Gemma 3 27B AWQ
    cmd: vllm serve gemma-3-27b-awq --port ${PORT} --served-model-name gemma-awq
    devices: [0]
"""


def write_config(tmp_path: Path) -> Path:
    seed = SEED_CONFIG.read_text()
    extra_devices, extra_models = EXTRA.split("models:\n")
    text = seed.replace("models:\n", extra_devices + "models:\n" + extra_models, 1)
    path = tmp_path / "llama-swap.yaml"
    path.write_text(text)
    return path


def test_the_catalogue_in_chromium_from_file_urls(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPLAB_DB", str(tmp_path / "absent.db"))
    db = tmp_path / "swaplab.db"
    seed_bench_runs(db)
    save_run(db, throughput_run("glm-flash-awq", {1: (79.9, 79.1, 80.4), 2: (121.0, 120.2, 121.5), 4: (182.7, 181.9, 183.0),
                                                  8: (263.7, 263.6, 263.8)}, started=SEPTEMBER_4 + 3600, backend="vllm"))
    save_run(db, throughput_run("qwen3-coder", {1: (61.0, 60.0, 62.0), 2: (98.5, 97.0, 99.0)}, started=SEPTEMBER_4,
                                backend="llama.cpp"))
    save_run(db, grill_run(SEED_ALIAS, [22], started=SEPTEMBER_4 - 86400, r5_complete=[6], tok_per_step=[171.0]))
    save_run(db, grill_run(SEED_ID, [19, 21, 20], started=SEPTEMBER_4, tok_per_step=[150.0, 162.0, 174.0],
                           log="/srv/grill_out/n3-sglang/"))
    save_run(db, grill_run("glm-flash-awq", [18, 20, 21], started=SEPTEMBER_4, r5_complete=[6, 5, 6]))
    site = tmp_path / "site"
    build_site(str(write_config(tmp_path)), site, notes=str(SEED_NOTES), db=str(db))

    ARTIFACTS.mkdir(exist_ok=True)
    expect.set_options(timeout=10_000)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = console_errors(page)
        try:
            page.goto((site / "index.html").as_uri())
            rows = page.locator("#models-table tbody tr")
            expect(rows).to_have_count(4)  # the config's order: the awq entry, qwen, gemma, then the seed's

            def order() -> list[str]:
                return rows.evaluate_all("rows => rows.map(row => row.dataset.model)")

            assert order() == ["glm-flash-awq", "qwen3-coder", "gemma-awq", SEED_ID]
            best = page.locator("#models-table thead th").nth(6)
            best.get_by_role("button").click()
            expect(best).to_have_attribute("aria-sort", "ascending")
            assert order() == ["qwen3-coder", "glm-flash-awq", SEED_ID, "gemma-awq"]  # 98.5, 263.7, 271.6, none last
            best.get_by_role("button").click()
            expect(best).to_have_attribute("aria-sort", "descending")
            assert order() == [SEED_ID, "glm-flash-awq", "qwen3-coder", "gemma-awq"]
            page.locator("#models-table thead th").nth(5).get_by_role("button").click()  # grill score
            assert order()[:2] == ["glm-flash-awq", SEED_ID]  # 19.7 before 20.0
            expect(page.locator("#peers-table tbody tr")).to_have_count(7)

            # The filter hides what does not match, in every table.
            page.get_by_placeholder("Filter models").fill("glm")
            expect(page.locator("#models-table tbody tr:visible")).to_have_count(2)
            expect(page.locator("#peers-table tbody tr:visible")).to_have_count(1)  # ollama/glm-5.2:cloud
            page.get_by_placeholder("Filter models").fill("")

            # A model link, then the wikilink in its note to the other note.
            page.locator(f'#models-table tr[data-model="{SEED_ID}"] a').click()
            expect(page).to_have_url((site / "models" / f"{SEED_ID}.html").as_uri())
            expect(page.locator("h1")).to_contain_text(SEED_ID)
            expect(page.locator(".model-head")).to_contain_text(SEED_ALIAS)
            expect(page.locator("#performance svg")).to_have_count(3)
            expect(page.locator("#history tbody tr")).to_have_count(2)
            broken = page.locator("#notes .wikilink.broken")
            expect(broken).to_have_text("[[gpt-oss-20b]]")
            assert broken.evaluate("element => element.tagName") == "SPAN"
            page.screenshot(path=str(ARTIFACTS / "catalog-model.png"), full_page=True)

            page.locator("#notes a.wikilink", has_text="vram-spend-priority").click()
            expect(page).to_have_url((site / "notes" / "vram-spend-priority.html").as_uri())
            expect(page.locator("h1")).to_have_text("vram-spend-priority")  # the note's title; its own headings below it
            expect(page.locator(".prose h2")).to_have_text("Spend spare VRAM on KV precision")
            expect(page.locator("#backlinks")).to_contain_text("glm-4-7-flash")
            page.locator("#backlinks a").click()
            expect(page).to_have_url((site / "notes" / "glm-4.7-flash.html").as_uri())
            page.locator("a.wikilink", has_text="vram-spend-priority").click()
            page.go_back()
            # The note belongs to both GLM entries, each by its alias's prefix.
            expect(page.locator(".belongs a")).to_have_text(["glm-flash-awq", SEED_ID])
            page.locator(".belongs a", has_text=SEED_ID).click()
            expect(page).to_have_url((site / "models" / f"{SEED_ID}.html").as_uri())

            # Without JavaScript, every page still reads: the index lists everything, unsorted.
            plain = browser.new_context(java_script_enabled=False).new_page()
            plain.goto((site / "index.html").as_uri())
            expect(plain.locator("#models-table tbody tr")).to_have_count(4)
            expect(plain.locator("#models-table thead button")).to_have_count(0)
            expect(plain.locator(".filter")).to_have_count(0)
        finally:
            browser.close()
    assert errors == []


def test_the_lmeval_section_in_chromium(tmp_path):
    db = tmp_path / "swaplab.db"
    save_run(db, grill_run(SEED_ID, [19, 21, 20], started=SEPTEMBER_4 - 86400, tok_per_step=[150.0, 162.0, 174.0],
                           log="/srv/grill_out/n3-sglang/"))
    save_run(db, lmeval_grill_run(SEED_ALIAS, {
        "arithmetic_2da_gen": lmeval_task({"exact_match,last-number": ([0.10], 0.0688)}),
        "gsm8k": lmeval_task({"exact_match,strict-match": ([0.62, 0.64, 0.60], 0.0134),
                              "exact_match,flexible-extract": ([0.71, 0.70, 0.72], 0.0125)},
                             n=1319, source="hub: openai/gsm8k"),
    }, started=SEPTEMBER_4 - 3600, api="completions", limit=None, log="/srv/grill_out/lmeval-2/"))
    save_run(db, lmeval_grill_run(SEED_ID, {
        "arithmetic_2da_gen": lmeval_task({"exact_match,last-number": ([0.15, 0.15], 0.0819)}),
    }, started=SEPTEMBER_4, truncated=2, log="/srv/grill_out/lmeval-3/"))
    site = tmp_path / "site"
    build_site(str(SEED_CONFIG), site, notes=str(SEED_NOTES), db=str(db))

    expect.set_options(timeout=10_000)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = console_errors(page)
        try:
            page.goto((site / "models" / f"{SEED_ID}.html").as_uri())
            page.locator('.toc a[href="#lmeval"]').click()
            section = page.locator("#lmeval")
            expect(section.locator("h2")).to_have_text("lm-eval")
            rows = section.locator("tbody tr")
            expect(rows).to_have_count(3)
            expect(rows.first).to_be_in_viewport()
            expect(rows.nth(0).locator("td").nth(0)).to_contain_text("local: two_digit_addition.jsonl")
            score = rows.nth(0).locator("td").nth(2)
            expect(score).to_contain_text("0.150 ± 0.082")
            expect(score).to_contain_text("was 0.100 in run #2")
            expect(rows.nth(2).locator("td").nth(4)).to_have_text("3 (0.600–0.640)")
            expect(section.locator("table")).to_be_visible()
            if os.environ.get("SWAPLAB_SCREENSHOTS"):
                # The section across the page's whole width, as a reader scrolled to it sees it.
                page.mouse.move(0, 0)  # no row highlighted under the pointer
                box = section.bounding_box()
                top = box["y"] + page.evaluate("window.scrollY")
                page.screenshot(path=str(SCREENSHOTS / "catalog-lmeval-1280.png"), full_page=True,
                                clip={"x": 0, "y": top - 16, "width": 1280, "height": box["height"] + 32})
        finally:
            browser.close()
    assert errors == []
