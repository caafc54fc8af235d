"""The lm-eval section of a model's page: the latest grill run's score per lm-eval task and metric."""

from __future__ import annotations

import re

import pytest
from catalogdata import SEED_ALIAS, SEED_CONFIG, SEED_ID, SEPTEMBER_4, grill_run, lmeval_grill_run, lmeval_task
from test_catalog import section

from swaplab.catalog.build import build_site
from swaplab.catalog.figures import when
from swaplab.catalog.lmeval import lmeval_rows, metric_label, short_source
from swaplab.results.runs import save_run

ADDITION = "arithmetic_2da_gen"
GSM8K_SOURCE = "hub: openai/gsm8k"


def cells(table_html: str) -> list[list[str]]:
    """The body rows of a table as lists of cell texts, tags dropped and spaces collapsed."""
    body = table_html.split("<tbody>")[1]
    def text(cell: str) -> str:
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", cell)).strip()

    return [[text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def build(tmp_path, *runs) -> dict[str, str]:
    db = tmp_path / "runs.db"
    for run in runs:
        save_run(db, run)
    build_site(str(SEED_CONFIG), tmp_path / "site", db=str(db))
    return {path.stem: path.read_text() for path in (tmp_path / "site" / "models").glob("*.html")}


def test_the_section_shows_each_task_and_metric_from_the_latest_run_that_scored_it(tmp_path):
    pages = build(
        tmp_path,
        # Run 1, under the alias: the addition task at 0.100, and gsm8k's two filters through completions, no --limit.
        lmeval_grill_run(SEED_ALIAS, {
            ADDITION: lmeval_task({"exact_match,last-number": ([0.10], 0.0688)}),
            "gsm8k": lmeval_task({"exact_match,strict-match": ([0.62, 0.64, 0.60], None),
                                  "exact_match,flexible-extract": ([0.71, 0.71, 0.71], 0.0125)},
                                 n=1319, source=GSM8K_SOURCE),
        }, started=SEPTEMBER_4 - 86400, api="completions", limit=None),
        # Run 2: a grill run without lm-eval.
        grill_run(SEED_ID, [21], started=SEPTEMBER_4 - 3600),
        # Run 3: the addition task again, two repetitions, two answers of 40 truncated.
        lmeval_grill_run(SEED_ID, {ADDITION: lmeval_task({"exact_match,last-number": ([0.15, 0.15], 0.0819)})},
                         started=SEPTEMBER_4, truncated=2, log="/srv/grill_out/lmeval-3/"),
    )
    page = pages[SEED_ID]
    assert len(re.findall(r"<tr[^>]*>", section(page, "history").split("<tbody>")[1])) == 3  # every grill run
    lmeval = section(page, "lmeval")
    assert "<h2>lm-eval</h2>" in lmeval
    assert ("lm-evaluation-harness tasks run by <code>swaplab grill run --suite lmeval</code>; "
            "score ± lm-eval's standard error of one repetition") in lmeval
    assert cells(lmeval) == [
        [ADDITION + " local: two_digit_addition.jsonl", "exact_match (last-number)", "0.150 ± 0.082 was 0.100 in run #1",
         "20", "2 (0.150–0.150)", "chat", "20", f"#3 {when(SEPTEMBER_4)} samples 5.0% of answers truncated (2/40)"],
        ["gsm8k hub: openai/gsm8k", "exact_match (flexible-extract)", "0.710 ± 0.013", "1319", "3 (0.710–0.710)",
         "completions", "all", f"#1 {when(SEPTEMBER_4 - 86400)}"],
        ["gsm8k hub: openai/gsm8k", "exact_match (strict-match)", "0.620 ± -", "1319", "3 (0.600–0.640)",
         "completions", "all", f"#1 {when(SEPTEMBER_4 - 86400)}"],
    ]
    # The full source on hover; lm-eval's per-sample log of the task, in the run's log folder.
    assert 'title="local: /work/main/tests/fixtures/lmeval/two_digit_addition.jsonl"' in lmeval
    assert '<a href="file:///srv/grill_out/lmeval-3/lmeval-rep1-arithmetic_2da_gen.samples.jsonl">samples</a>' in lmeval
    # Right after the run history, and in the page's table of contents.
    assert re.findall(r'<section id="([^"]+)">', page)[:3] == ["history", "lmeval", "performance"]
    assert '<a href="#lmeval">lm-eval (3)</a>' in page


def test_no_section_for_a_model_without_lm_eval_runs(tmp_path):
    pages = build(
        tmp_path,
        grill_run("qwen3-retired", [15, 16, 17], started=SEPTEMBER_4),
        lmeval_grill_run(SEED_ID, {ADDITION: lmeval_task({"exact_match,last-number": ([0.15], 0.08)})},
                         started=SEPTEMBER_4),
    )
    for model in ("qwen3-retired", "ollama_glm-5.2_cloud"):  # grill runs without lm-eval; no runs at all
        assert "lmeval" not in pages[model] and "lm-eval" not in pages[model], model
    assert '<section id="lmeval">' in pages[SEED_ID]


def test_task_names_and_sources_from_files_are_text_not_html(tmp_path):
    hostile = "<script>alert(1)</script>"
    pages = build(tmp_path, lmeval_grill_run(SEED_ID, {
        hostile: lmeval_task({"acc,<b>": ([0.5], 0.1)}, source='hub: "><img src=x onerror=alert(2)>'),
    }, started=SEPTEMBER_4, log="/srv/out/"))
    lmeval = section(pages[SEED_ID], "lmeval")
    assert "<script>" not in lmeval and "<img" not in lmeval and "<b>" not in lmeval
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in lmeval
    assert 'title="hub: &#34;&gt;&lt;img src=x onerror=alert(2)&gt;"' in lmeval
    assert "acc (&lt;b&gt;)" in lmeval


# -- the rows as a pure function of the runs --------------------------------------------------


@pytest.mark.parametrize(
    ("key", "figure", "label"),
    [
        ("exact_match,last-number", {"metric": "exact_match", "filter": "last-number"}, "exact_match (last-number)"),
        ("acc,none", {"metric": "acc", "filter": "none"}, "acc"),
        ("acc_norm,none", {}, "acc_norm"),  # an older summary without the parts spelled out
        ("bleu", {}, "bleu"),
    ],
)
def test_metric_label(key, figure, label):
    assert metric_label(key, figure) == label


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("local: /work/main/tests/fixtures/lmeval/two_digit_addition.jsonl", "local: two_digit_addition.jsonl"),
        ("local: /data/train.jsonl, /data/test.jsonl", "local: train.jsonl, test.jsonl"),
        ("hub: EleutherAI/arithmetic", "hub: EleutherAI/arithmetic"),
        ("hub: json ({'test': 'https://example.org/a.jsonl'})", "hub: json ({'test': 'https://example.org/a.jsonl'})"),
    ],
)
def test_short_source(source, shown):
    assert short_source(source) == shown


def test_rows_read_only_grill_runs_and_what_they_hold():
    figure = {"metric": "acc", "filter": "none", "value": 0.5, "reps": [0.5], "stderr": None}
    task = {"source": "hub: x", "n": None, "metrics": {"acc,none": figure}}
    runs = [
        {"id": 1, "kind": "throughput", "summary": {"lmeval": {"tasks": {"bench-task": task}}}},
        {"id": 2, "kind": "grill", "summary": {"lmeval": {"tasks": "not a mapping"}}},
        {"id": 3, "kind": "grill", "summary": {"lmeval": {"tasks": {"broken": {"metrics": []}, "odd": "x"}}}},
        {"id": 4, "kind": "grill", "status": "interrupted", "started_at": None,
         "summary": {"lmeval": {"api": "chat", "limit": 5, "tasks": {"t": task}}}},
    ]
    [row] = lmeval_rows(runs)
    assert (row.task, row.metric, row.score, row.stderr, row.n, row.reps, row.limit, row.run_id, row.status) == (
        "t", "acc", "0.500", "-", "-", "1", "5", 4, "interrupted")
    assert (row.truncation, row.samples_href, row.previous, row.started) == (None, None, None, "-")
