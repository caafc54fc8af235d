"""`swaplab grill run` on the real default (SmolLM2-135M through `swaplab serve`), into the store
and onto the catalogue's run history.

A 135M model scores low; what this proves is the harness: every task asked, answered,
extracted, run in the sandbox and scored, twice, and the run recorded whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from procs import Router, run_swaplab

from swaplab.builtin.defaults import default_config_text
from swaplab.catalog.build import build_site
from swaplab.results.runs import get_run

pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")
pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("grill-llamacpp")


@pytest.fixture(scope="module")
def router(workdir):
    router = Router(None, workdir)
    yield router
    router.close()


def test_the_code_suite_on_smollm2_twice_is_stored_with_rounds_and_transcripts(router, workdir):
    db = workdir / "grill.db"
    report = workdir / "grill.json"
    done = run_swaplab(
        "grill", "run", "--url", router.url, "--model", "smollm2", "--suite", "code", "--reps", "2",
        "--max-tokens", "192", "--db", str(db), "--json", str(report), timeout=1200,
    )
    assert done.returncode == 0, done.stderr
    run = get_run(db, json.loads(report.read_text())["run_id"])
    assert (run["kind"], run["model"], run["backend_kind"], run["status"]) == ("grill", "smollm2", "llama.cpp", "completed")
    assert run["config_hash"]  # through the router: the entry's fingerprint is recorded
    summary = run["summary"]
    assert summary["reps"] == 2 and summary["total"] == 18
    assert [(round_["round"], round_["total"], round_["score"]["n"]) for round_ in summary["rounds"]] == [
        ("r1", 8, 2), ("r2", 5, 2), ("r3", 5, 2),
    ]
    assert 0 <= summary["score"]["min"] <= summary["score"]["max"] <= 18
    assert summary["temperature"] == 0.2 and summary["isolation"]
    # 36 attempts, each answered by the model (no request errors), each with its transcript.
    assert len(run["requests"]) == 36
    assert all(request["error"] is None and request["completion_tokens"] for request in run["requests"])
    log = summary["log"]
    for request in run["requests"]:
        transcript = json.loads((Path(log) / request["data"]["transcript"]).read_text())
        assert transcript["transcript"][-1]["role"] in ("assistant", "sandbox"), request["level"]
    assert "r1" in done.stdout and "/18" in done.stdout

    # The catalogue's run history shows it, with the score and a link to the transcripts.
    config = workdir / "default.yaml"
    config.write_text(default_config_text())
    build_site(str(config), workdir / "site", db=str(db))
    page = (workdir / "site" / "models" / "smollm2.html").read_text()
    history = page.split('id="history"')[1].split("</section>")[0]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", history))
    assert "/18" in text and "n=2" in text, text
    assert f'href="file://{log}' in history
