"""The static catalogue: `swaplab site build` from the seed's entry, its note, and runs in a real store."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest
from catalogdata import (
    SEED_ALIAS, SEED_CONFIG, SEED_ID, SEED_NOTES, SEPTEMBER_4, grill_run, seed_bench_runs, throughput_run,
)

from swaplab.catalog.build import build_site
from swaplab.config import load_config
from swaplab.results.runs import save_run

# -- reading pages -------------------------------------------------------------------------


class _Text(HTMLParser):
    """The text inside the first element matching a tag and class, tags dropped and entities decoded."""

    def __init__(self, tag: str, css_class: str):
        super().__init__(convert_charrefs=True)
        self.tag, self.css_class = tag, css_class
        self.depth = 0
        self.parts: list[str] = []
        self.done = False

    def handle_starttag(self, tag, attrs):
        if self.done:
            return
        if self.depth:
            self.depth += tag == self.tag
        elif tag == self.tag and self.css_class in (dict(attrs).get("class") or "").split():
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth and tag == self.tag:
            self.depth -= 1
            self.done = self.depth == 0

    def handle_data(self, data):
        if self.depth and not self.done:
            self.parts.append(data)


def element_text(html: str, tag: str, css_class: str) -> str:
    parser = _Text(tag, css_class)
    parser.feed(html)
    return "".join(parser.parts)


def section(html: str, section_id: str) -> str:
    match = re.search(rf'<section id="{section_id}">(.*?)</section>', html, re.S)
    assert match, f"no section {section_id}"
    return match.group(1)


def swaplab(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swaplab", *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(autouse=True)
def no_default_store(tmp_path, monkeypatch):
    """A build without --db reads the default store: point it at a file that does not exist."""
    monkeypatch.setenv("SWAPLAB_DB", str(tmp_path / "default-store-absent.db"))


# -- the seed's page --------------------------------------------------------------------------


def test_the_seed_entry_page(tmp_path):
    result = swaplab("site", "build", "--config", str(SEED_CONFIG), "--notes", str(SEED_NOTES), "--out", str(tmp_path / "site"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Wrote 13 files to {tmp_path / 'site'}: 8 model pages, 2 note pages.")
    page = (tmp_path / "site" / "models" / f"{SEED_ID}.html").read_text()
    head = element_text(page, "header", "model-head")
    assert SEED_ALIAS in head
    assert "Active" in head and "Retired" not in head
    assert "seed-glm-flash.yaml, line 12" in re.sub(r"\s+", " ", head)

    assert "No runs recorded for this id or its aliases" in section(page, "history")
    assert "No bench runs recorded for this id or its aliases" in section(page, "performance")

    notes = section(page, "notes")
    assert "glm-4-7-flash" in notes and "glm-4.7-flash.md" in notes
    assert f"file name is a prefix of {SEED_ALIAS}" in notes  # matched through the alias's prefix
    assert "Glm4MoeLiteForCausalLM, which the local checkout" in notes
    assert "mid-&lt;think&gt; when it hit" in notes  # the note's text, not HTML
    # The note's two links: one to the other note, one broken (marked, and not a link).
    assert '<a class="wikilink" href="../notes/vram-spend-priority.html">vram-spend-priority</a>' in notes
    assert '<span class="wikilink broken" title="no note or model named gpt-oss-20b">[[gpt-oss-20b]]</span>' in notes
    assert not re.search(r'<a [^>]*href="[^"]*gpt-oss-20b', notes)

    # The entry verbatim, comments and all, and highlighted (Pygments spans).
    entry = load_config(str(SEED_CONFIG)).models[SEED_ID].raw_text
    assert "# *** FLASHINFER_USE_CUDA_NORM=1 IS MANDATORY AND NOT A TUNING KNOB ***" in entry
    assert element_text(page, "pre", "highlight") == entry
    assert '<span class="c1"># FIRST SGLANG ENTRY' in page

    # The sections in the seed's order, then the footer with its sources.
    order = [page.index(f'<section id="{name}">') for name in ("history", "performance", "notes", "entry")]
    assert order == sorted(order)
    footer = re.sub(r"\s+", " ", element_text(page, "footer", "site-footer"))
    assert str(SEED_CONFIG) in footer and str(SEED_NOTES) in footer and "no results store" in footer
    assert re.search(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d", footer)

    # The note's own page links back to the model and shows who links to it.
    note_page = (tmp_path / "site" / "notes" / "vram-spend-priority.html").read_text()
    assert '<a href="glm-4.7-flash.html">glm-4-7-flash</a>' in section(note_page, "backlinks")


def test_the_index_lists_local_and_peer_models_apart(tmp_path):
    build_site(str(SEED_CONFIG), tmp_path, notes=str(SEED_NOTES))
    index = (tmp_path / "index.html").read_text()
    local, peers = index.split('<section id="peers">')
    assert f'<tr data-model="{SEED_ID}">' in local
    assert f'href="models/{SEED_ID}.html"' in local
    assert "freetoken-driver/gpt-oss-20b-ft" not in local
    for peer_model in ("freetoken-driver/gpt-oss-20b-ft", "ollama/gemma4:31b-cloud", "ollama/kimi-k2.7-code:cloud"):
        assert f'<tr data-model="{peer_model}">' in peers
    # A peer's id holds `/` and `:`; its page's file name doesn't, and the link finds it.
    assert 'href="models/ollama_gemma4_31b-cloud.html"' in peers
    assert (tmp_path / "models" / "ollama_gemma4_31b-cloud.html").is_file()
    assert '<script src="catalog.js" defer></script>' in index  # sorting: optional
    assert '<link rel="stylesheet" href="catalog.css">' in index
    assert not re.search(r'(href|src)="(/|https?:)', index)  # relative links only: works from file://


# -- runs from the store --------------------------------------------------------------------------


def test_bench_runs_recorded_under_an_alias_chart_on_the_model_page(tmp_path):
    db = tmp_path / "runs.db"
    seed_bench_runs(db)
    save_run(db, throughput_run("ollama/glm-5.2:cloud", {1: (40.0, 39.0, 41.0)}, started=SEPTEMBER_4))
    build_site(str(SEED_CONFIG), tmp_path / "site", notes=str(SEED_NOTES), db=str(db))
    page = (tmp_path / "site" / "models" / f"{SEED_ID}.html").read_text()
    performance = section(page, "performance")
    # Three static SVG charts from matplotlib, inline: no script, no request.
    assert performance.count("<svg ") == 3
    for chart in ("throughput", "prefill", "prefix-cache"):
        assert f'<figure class="chart" id="chart-{chart}">' in performance
    assert "Output tok/s vs concurrency" in performance and "TTFT vs prompt length" in performance
    assert "Prefix-cache TTFT" in performance
    # ... and the same numbers as tables.
    tables = re.sub(r"<[^>]+>", " ", performance)
    for figure in ("78.2 (77.9–78.6)", "120.7", "187.0", "271.6 (271.5–271.8)", "3.47x",  # tok/s at c=1..8, scaling
                   "8192", "2370", "18166",  # TTFT by prompt length
                   "867.0 (847.0–882.0)", "269.0 (264.0–275.0)", "3.22x"):  # the prefix cache
        assert figure in tables, figure
    assert "#1 2026-09-04" in tables
    # The alias's runs belong to this model and to no other.
    assert "No runs recorded for this id or its aliases" in section(page, "history")
    peer_page = (tmp_path / "site" / "models" / "ollama_glm-5.2_cloud.html").read_text()
    assert section(peer_page, "performance").count("<svg ") == 1 and "271.6" not in peer_page
    index = (tmp_path / "site" / "index.html").read_text()
    row = re.search(rf'<tr data-model="{SEED_ID}">(.*?)</tr>', index, re.S).group(1)
    assert 'data-sort="271.6"' in row  # best measured tok/s


def test_grill_runs_fill_the_run_history_with_their_spread(tmp_path):
    db = tmp_path / "runs.db"
    save_run(db, grill_run(SEED_ALIAS, [22], started=SEPTEMBER_4 - 86400, r5_complete=[5], tok_per_step=[170.0]))
    save_run(db, grill_run(SEED_ID, [19, 21, 20], started=SEPTEMBER_4, tok_per_step=[150.0, 162.0, 174.0],
                           log="/srv/grill_out/n3-sglang/"))
    build_site(str(SEED_CONFIG), tmp_path / "site", db=str(db))
    page = (tmp_path / "site" / "models" / f"{SEED_ID}.html").read_text()
    history = section(page, "history")
    rows = re.findall(r"<tr>(.*?)</tr>", history.split("<tbody>")[1], re.S)
    assert len(rows) == 2
    first, second = (re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)) for row in rows)
    assert "#1" in first and f"as {SEED_ALIAS}" in first and "22/23" in first and "5/6 complete" in first
    assert "#2" in second and "20.0/23 (19–21)" in second and "n=3" in second and "r1 7/8 · r2 3/5" in second
    assert "162.0 (150.0–174.0)" in second and "6/6 complete, 0/6 looped" in second
    assert '<a href="file:///srv/grill_out/n3-sglang/">/srv/grill_out/n3-sglang/</a>' in history
    index = (tmp_path / "site" / "index.html").read_text()
    row = re.search(rf'<tr data-model="{SEED_ID}">(.*?)</tr>', index, re.S).group(1)
    assert "20.0/23 (19–21)" in row and 'data-sort="20.0"' in row  # the latest run's score


def test_ids_that_survive_only_in_results_or_notes_are_retired(tmp_path):
    db = tmp_path / "runs.db"
    # Asked for by an old alias through a router that resolved it to an id no config has now.
    save_run(db, grill_run("qwen3-retired", [15, 16, 17], started=SEPTEMBER_4, requested_model="old-alias"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "history.md").write_text("---\nmodels: [mellum-driver]\n---\nmellum used to be the driver; see [[qwen3-retired]].\n")
    build_site(str(SEED_CONFIG), tmp_path / "site", notes=str(notes), db=str(db))
    retired = (tmp_path / "site" / "models" / "qwen3-retired.html").read_text()
    head = element_text(retired, "header", "model-head")
    assert "Retired" in head and "old-alias" in head and "survives only in results" in head
    assert "16.0/23 (15–17)" in section(retired, "history")
    assert '<section id="entry">' not in retired
    mellum = (tmp_path / "site" / "models" / "mellum-driver.html").read_text()
    assert "survives only in notes" in element_text(mellum, "header", "model-head")
    assert "front matter lists mellum-driver" in section(mellum, "notes")
    # A wikilink that names no note but a (retired) model id goes to its page.
    assert '<a class="wikilink" href="../models/qwen3-retired.html">qwen3-retired</a>' in section(mellum, "notes")
    assert not (tmp_path / "site" / "models" / "old-alias.html").exists()


def test_two_builds_of_the_same_inputs_differ_only_in_the_timestamp(tmp_path):
    db = tmp_path / "runs.db"
    seed_bench_runs(db)
    save_run(db, grill_run(SEED_ALIAS, [19, 21, 20], started=SEPTEMBER_4))
    first = build_site(str(SEED_CONFIG), tmp_path / "one", notes=str(SEED_NOTES), db=str(db), generated_at=1_800_000_000)
    second = build_site(str(SEED_CONFIG), tmp_path / "two", notes=str(SEED_NOTES), db=str(db), generated_at=1_800_003_700)
    assert [path.relative_to(tmp_path / "one") for path in first] == [path.relative_to(tmp_path / "two") for path in second]
    stamp = re.compile(rb'<time datetime="[^"]*">[^<]*</time>')
    differing = []
    for one, two in zip(first, second):
        a, b = one.read_bytes(), two.read_bytes()
        if a != b:
            differing.append(one.name)
            assert stamp.sub(b"", a) == stamp.sub(b"", b), one.name
    assert f"{SEED_ID}.html" in differing  # the timestamps did differ, and nothing else did
    assert b"<svg " in (tmp_path / "two" / "models" / f"{SEED_ID}.html").read_bytes()


def test_a_rebuild_removes_the_page_of_a_model_no_longer_anywhere(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "gone.md").write_text("---\nmodels: [gone-model]\n---\nbye\n")
    build_site(str(SEED_CONFIG), tmp_path / "site", notes=str(notes))
    assert (tmp_path / "site" / "models" / "gone-model.html").is_file()
    (notes / "gone.md").unlink()
    build_site(str(SEED_CONFIG), tmp_path / "site", notes=str(notes))
    assert not (tmp_path / "site" / "models" / "gone-model.html").exists()
    assert not (tmp_path / "site" / "notes" / "gone.html").exists()


# -- bad input -------------------------------------------------------------------------------------


def test_bad_input_is_one_clear_line_and_exit_2(tmp_path):
    out = str(tmp_path / "site")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database, just bytes " * 200)
    cases = [
        (("--config", str(tmp_path / "missing.yaml"), "--out", out), f"{tmp_path / 'missing.yaml'}:1: no such file"),
        (("--config", str(SEED_CONFIG), "--notes", str(tmp_path / "no-notes"), "--out", out),
         f"swaplab: notes folder {tmp_path / 'no-notes'} does not exist"),
        (("--config", str(SEED_CONFIG), "--db", str(garbage), "--out", out),
         f"swaplab: cannot read {garbage}: file is not a database (is it a swaplab database?)"),
        (("--config", str(SEED_CONFIG), "--db", str(tmp_path / "absent.db"), "--out", out),
         f"swaplab: no swaplab database at {tmp_path / 'absent.db'}"),
        (("--config", str(SEED_CONFIG), "--out", str(SEED_CONFIG)), f"swaplab: --out {SEED_CONFIG} is a file, not a folder"),
    ]
    for args, message in cases:
        result = swaplab("site", "build", *args)
        assert (result.returncode, result.stderr, result.stdout) == (2, message + "\n", ""), args
    assert not (tmp_path / "absent.db").exists()  # reading never creates a store


# -- the built-in default, and what is no model ---------------------------------------------


def test_a_build_on_the_built_in_default_leaves_the_bench_selftest_sim_out(tmp_path):
    # `bench selftest` records a run against its own `swaplab sim`: no model, never retired.
    db = tmp_path / "runs.db"
    selftest = swaplab("bench", "selftest", "--streams", "2", "--rounds", "1", "--output-tokens", "4",
                       "--ttft-ms", "1", "--tokens-per-second", "1000", "--db", str(db))
    assert selftest.returncode == 0, selftest.stderr
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "smollm2.md").write_text("SmolLM2 is small and confidently wrong.\n")
    result = swaplab("site", "build", "--db", str(db), "--notes", str(notes), "--out", str(tmp_path / "site"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Wrote 7 files to {tmp_path / 'site'}: 3 model pages, 1 note page. Open ")
    pages = sorted(path.name for path in (tmp_path / "site" / "models").iterdir())
    assert pages == ["gemma3-270m.html", "smollm2-embed.html", "smollm2.html"]
    assert "selftest" not in (tmp_path / "site" / "index.html").read_text()
