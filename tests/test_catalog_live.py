"""The catalogue live at /catalog/ of a real router, rebuilt when its config, store or notes change."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from catalogdata import SEED_CONFIG, SEPTEMBER_4, grill_run, seed_bench_runs
from procs import SIM, free_port

from swaplab.catalog.live import LiveCatalog
from swaplab.config import load_config, load_config_text
from swaplab.results.runs import save_run

CONFIG = f"""
notes: notes
models:
  qwen-small:
    name: Qwen small (sim)
    cmd: {SIM} --port ${{PORT}} --model qwen-small
    aliases: [qwen-small-q4]
  other:
    cmd: {SIM} --port ${{PORT}} --model other
peers:
  cloud:
    proxy: http://127.0.0.1:9
    models: [big-model]
"""


def get(url: str) -> tuple[int, str, str, str]:
    """(status, content type, body, final URL after redirects)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode(), response.url
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode(), url


def touch_later(path: Path, text: str) -> None:
    """Rewrite `path` with a modification time certainly later than before (coarse clocks)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


def test_the_notes_key_is_relative_to_the_config_file():
    assert load_config_text("notes: memory\n", "/etc/swaplab/config.yaml").notes == "/etc/swaplab/memory"
    assert load_config_text("notes: /srv/notes\n", "/etc/swaplab/config.yaml").notes == "/srv/notes"
    assert load_config_text("models: {}\n", "/etc/swaplab/config.yaml").notes is None


def test_pages_are_rebuilt_only_when_a_source_changes(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    touch_later(notes / "qwen-small.md", "First impressions.\n")
    config = load_config_text(CONFIG.replace("notes: notes", f"notes: {notes}"), str(tmp_path / "config.yaml"))
    db = tmp_path / "swaplab.db"
    current = {"config": config}
    catalog = LiveCatalog(lambda: current["config"], db)

    index = catalog.page("").decode()
    assert '<tr data-model="qwen-small">' in index and '<tr data-model="cloud/big-model">' in index
    assert catalog.page("models/qwen-small.html") is catalog.page("models/qwen-small.html")  # rendered once
    assert catalog.page("models/nope.html") is None
    assert catalog.builds == 1

    touch_later(notes / "qwen-small.md", "Second thoughts.\n")
    assert b"Second thoughts." in catalog.page("models/qwen-small.html")
    assert catalog.builds == 2

    save_run(db, grill_run("qwen-small-q4", [11, 12, 13], started=SEPTEMBER_4))
    assert "12.0/23 (11–13)" in catalog.page("models/qwen-small.html").decode()
    assert catalog.builds == 3
    catalog.page("index.html")
    assert catalog.builds == 3

    current["config"] = load_config_text(CONFIG.replace("notes: notes", f"notes: {notes}").replace("other:", "renamed:"),
                                         str(tmp_path / "config.yaml"))
    assert b'<tr data-model="renamed">' in catalog.page("")
    assert catalog.builds == 4


def test_catalog_route_of_a_real_router(router_factory, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    touch_later(notes / "qwen-small.md", "Fast enough for [[other]]; see [[nowhere]].\n")
    router = router_factory(CONFIG)

    status, _, body, final = get(f"{router.url}/catalog")
    assert (status, final) == (200, f"{router.url}/catalog/")  # a folder, so relative links resolve
    assert '<tr data-model="qwen-small">' in body and '<tr data-model="cloud/big-model">' in body
    assert 'href="models/qwen-small.html"' in body and 'href="catalog.css"' in body
    assert str(router.db) in body and str(notes) in body  # the footer names the router's own store and notes

    status, content_type, page, _ = get(f"{router.url}/catalog/models/qwen-small.html")
    assert (status, content_type) == (200, "text/html; charset=utf-8")
    assert '<a class="wikilink" href="../models/other.html">other</a>' in page
    assert '<span class="wikilink broken"' in page
    assert "No runs recorded for this id or its aliases" in page

    # A bench run lands in the router's store: the next request shows it.
    seed_bench_runs(router.db, model="qwen-small-q4")
    page = get(f"{router.url}/catalog/models/qwen-small.html")[2]
    assert page.count("<svg ") == 3 and "271.6 (271.5–271.8)" in page

    touch_later(notes / "qwen-small.md", "Rewritten after the bench.\n")
    assert "Rewritten after the bench." in get(f"{router.url}/catalog/models/qwen-small.html")[2]

    assert get(f"{router.url}/catalog/catalog.css")[:2] == (200, "text/css; charset=utf-8")
    assert get(f"{router.url}/catalog/catalog.js")[:2] == (200, "text/javascript; charset=utf-8")
    assert get(f"{router.url}/catalog/models/nope.html")[0] == 404
    assert get(f"{router.url}/catalog/../config.yaml")[0] == 404


def test_serve_notes_overrides_the_config_and_must_exist(router_factory, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    touch_later(elsewhere / "other.md", "The note from --notes.\n")
    router = router_factory(CONFIG, "--notes", str(elsewhere))
    assert "The note from --notes." in get(f"{router.url}/catalog/models/other.html")[2]

    result = subprocess.run(
        [sys.executable, "-m", "swaplab", "serve", "--config", str(SEED_CONFIG), "--listen", f"127.0.0.1:{free_port()}",
         "--notes", str(tmp_path / "missing"), "--state-dir", str(tmp_path / "state"), "--db", str(tmp_path / "x.db")],
        capture_output=True, text=True, timeout=60,
    )
    assert (result.returncode, result.stderr) == (2, f"swaplab: --notes {tmp_path / 'missing'}: no such folder\n")


def test_a_missing_notes_folder_in_the_config_is_said_on_the_page(router_factory, tmp_path):
    router = router_factory(CONFIG)  # notes: notes, and no such folder
    status, _, body, _ = get(f"{router.url}/catalog/")
    assert status == 503
    assert body == f"the catalogue cannot be built: notes folder {tmp_path / 'notes'} does not exist\n"
    (tmp_path / "notes").mkdir()
    assert get(f"{router.url}/catalog/")[0] == 200
    assert load_config(str(tmp_path / "config.yaml")).notes == str(tmp_path / "notes")
