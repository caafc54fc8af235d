"""The grill's lmeval suite (issue 27): lm-eval tasks through lm-eval's own library, against a router.

On the built-in SmolLM2 (llama.cpp): a local task's stored score is the one lm-eval reported
for the run and the mean of its own per-sample log; the `lm_eval` CLI, run on the same task
against the same router, scores the same. On a scripted sim: the grill's reasoning rule (the
answer after the last end-of-thinking marker; a thought never closed is a truncated failure).
The data is tests/fixtures/lmeval/two_digit_addition.jsonl (its origin is in the README beside it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from procs import SIM, Router

lm_eval = pytest.importorskip("lm_eval", reason="the lmeval extra is part of `make test`'s install")

from swaplab.grill import lmeval  # noqa: E402
from swaplab.grill.runner import GrillSettings, execute  # noqa: E402
from swaplab.results.runs import get_run  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "lmeval"
GENERATIVE = FIXTURES / "arithmetic_2da_gen.yaml"
LOGLIKELIHOOD = FIXTURES / "arithmetic_2da_local.yaml"
METRIC = "exact_match,last-number"
LIMIT = 12


def run_settings(router, tmp_path, **overrides) -> GrillSettings:
    values = dict(url=router.url, model="smollm2", suites=["lmeval"], tasks=[str(GENERATIVE)], limit=LIMIT, reps=1,
                  db=str(tmp_path / "grill.db"), transcripts=str(tmp_path / "transcripts"))
    values.update(overrides)
    return GrillSettings(**values)


def test_a_local_task_names_its_data_and_a_hub_task_is_refused_offline():
    (local,) = lmeval.sources([str(GENERATIVE)])
    assert local.name == "arithmetic_2da_gen" and local.local and local.output_type == "generate_until"
    assert local.origin == f"local: {FIXTURES / 'two_digit_addition.jsonl'}"
    assert local.config["dataset_kwargs"]["data_files"]["validation"] == str(FIXTURES / "two_digit_addition.jsonl")
    (hub,) = lmeval.sources(["arithmetic_2da"])  # lm-eval's own task: its data on the hub
    assert not hub.local and "EleutherAI/arithmetic" in hub.origin and hub.output_type == "loglikelihood"
    with pytest.raises(lmeval.LmevalError, match="Hugging Face hub, which this machine cannot reach: arithmetic_2da"):
        lmeval.check_sources([local, hub], online=lambda: False)
    lmeval.check_sources([local, hub], online=lambda: True)  # online, the hub task may go
    lmeval.check_sources([local], online=lambda: False)  # a local one never needs the network
    (by_folder,) = lmeval.sources(["arithmetic_2da_local"], include=[str(FIXTURES)])
    assert by_folder.output_type == "loglikelihood" and by_folder.local
    with pytest.raises(lmeval.LmevalError, match="lm-eval knows no task 'no_such_task'"):
        lmeval.sources(["no_such_task"])


def test_an_include_folder_runs_the_code_of_the_tasks_asked_for_only(tmp_path):
    """lm-eval's own index reads a folder's YAMLs without importing their `!function`s; so does
    --lmeval-include: a stray task's Python never runs, the asked task's does (issue 38)."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    for name, marker in (("stray_code", "stray-ran"), ("asked_code", "asked-ran")):
        (folder / f"{name}.py").write_text(
            f"from pathlib import Path\nPath({str(tmp_path / marker)!r}).touch()\n\ndef process(doc):\n    return doc\n"
        )
    asked = GENERATIVE.read_text().replace("validation: two_digit_addition.jsonl",
                                           f"validation: {FIXTURES / 'two_digit_addition.jsonl'}")
    (folder / "asked.yaml").write_text(asked + "process_docs: !function asked_code.process\n")
    (folder / "stray.yaml").write_text(asked.replace("task: arithmetic_2da_gen", "task: stray")
                                       + "process_docs: !function stray_code.process\n")
    (task,) = lmeval.sources(["arithmetic_2da_gen"], include=[str(folder)])
    assert task.name == "arithmetic_2da_gen" and callable(task.config["process_docs"])
    assert (tmp_path / "asked-ran").exists()
    assert not (tmp_path / "stray-ran").exists(), "the stray YAML's !function was imported"
    (folder / "broken.yaml").write_text("task: [unclosed\n")  # unreadable, and not asked for: skipped
    assert lmeval.sources(["arithmetic_2da_gen"], include=[str(folder)])[0].name == "arithmetic_2da_gen"
    with pytest.raises(lmeval.LmevalError, match=r"knows no task 'nowhere'.*unreadable there: .*broken.yaml"):
        lmeval.sources(["nowhere"], include=[str(folder)])
    assert not (tmp_path / "stray-ran").exists()


# -- the reasoning rule, on a scripted sim ---------------------------------------------------------

SCRIPT = {
    "rules": [
        {"match": "98 plus 45", "replies": [{"content": "<think>98 and 45 make 143</think>The answer is 143."}]},
        {"match": "95 plus 58", "replies": [{"content": "<think>Let me add 95 and 58 carefully, digit by",
                                              "finish_reason": "length"}]},
    ],
    "default": {"content": "0"},
}


async def test_answers_after_thinking_are_scored_and_an_unfinished_thought_is_a_counted_failure(
    router_factory, tmp_path
):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    router = router_factory(f"""
models:
  smollm2:
    cmd: {SIM} --port ${{PORT}} --model smollm2 --script {script}
""")
    outcome = await execute(run_settings(router, tmp_path, limit=3))
    task = outcome.summary["lmeval"]["tasks"]["arithmetic_2da_gen"]
    # doc 0: 143 after the thought (a pass, though the thought holds numbers too); doc 1: truncated; doc 2: wrong
    assert task["metrics"][METRIC]["value"] == pytest.approx(1 / 3)
    assert outcome.summary["lmeval"]["truncated"] == 1 and outcome.summary["lmeval"]["answers"] == 3
    rows = [request for request in get_run(str(tmp_path / "grill.db"), outcome.run_id)["requests"]]
    assert [(row["data"]["doc_id"], row["data"]["status"], row["data"]["answer"]) for row in rows] == [
        (0, "pass", "143"), (1, "fail", "[invalid]"), (2, "fail", "0")]


async def test_a_loglikelihood_task_runs_where_the_server_gives_prompt_logprobs_and_its_tokenizer(
    router_factory, tmp_path
):
    """vLLM's API (`echo` logprobs, /tokenizer_info, /tokenize, /detokenize), as the sim answers it: lm-eval's
    own multiple-choice path, its tokenizer reached through the router's /upstream/MODEL/."""
    router = router_factory(f"""
models:
  smollm2:
    cmd: {SIM} --port ${{PORT}} --model smollm2
""")
    outcome = await execute(run_settings(router, tmp_path, tasks=[str(LOGLIKELIHOOD)], lmeval_api="completions",
                                         limit=8))
    task = outcome.summary["lmeval"]["tasks"]["arithmetic_2da_local"]
    assert task["output_type"] == "loglikelihood" and task["n"] == 8
    reported = json.loads((outcome.transcripts / "lmeval-rep1-results.json").read_text())["results"]
    assert task["metrics"]["acc,none"]["value"] == reported["arithmetic_2da_local"]["acc,none"]
    samples = [json.loads(line) for line in
               (outcome.transcripts / "lmeval-rep1-arithmetic_2da_local.samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(len(sample["resps"][0][0]) == 2 for sample in samples)  # (logprob, greedy)
    assert task["metrics"]["acc,none"]["value"] == pytest.approx(sum(sample["acc"] for sample in samples) / 8)
    with pytest.raises(lmeval.LmevalError, match="chat completions cannot: use --lmeval-api completions"):
        await execute(run_settings(router, tmp_path, tasks=[str(LOGLIKELIHOOD)], limit=2))


# -- on llama.cpp ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_router(tmp_path_factory):
    pytest.importorskip("xllamacpp")
    router = Router(None, tmp_path_factory.mktemp("lmeval-router"))
    yield router
    router.close()


@pytest.mark.llamacpp
async def test_the_stored_score_is_what_lm_eval_reported_and_its_own_samples_say(default_router, tmp_path):
    outcome = await execute(run_settings(default_router, tmp_path))
    stored = get_run(str(tmp_path / "grill.db"), outcome.run_id)
    figure = stored["summary"]["lmeval"]["tasks"]["arithmetic_2da_gen"]["metrics"][METRIC]
    reported = json.loads((outcome.transcripts / "lmeval-rep1-results.json").read_text())["results"]
    assert figure["value"] == reported["arithmetic_2da_gen"][METRIC]
    assert figure["stderr"] == reported["arithmetic_2da_gen"]["exact_match_stderr,last-number"]
    samples = [json.loads(line) for line in
               (outcome.transcripts / "lmeval-rep1-arithmetic_2da_gen.samples.jsonl").read_text().splitlines()]
    assert len(samples) == LIMIT == stored["summary"]["lmeval"]["tasks"]["arithmetic_2da_gen"]["n"]
    assert figure["value"] == pytest.approx(sum(sample["exact_match"] for sample in samples) / LIMIT)
    assert len(stored["requests"]) == LIMIT  # a task row per sample, for `grill compare`
    assert stored["summary"]["headline"].startswith("arithmetic_2da_gen exact_match ")


@pytest.mark.llamacpp
async def test_the_lm_eval_cli_on_the_same_task_and_router_scores_the_same(default_router, tmp_path):
    outcome = await execute(run_settings(default_router, tmp_path))
    ours = outcome.summary["lmeval"]["tasks"]["arithmetic_2da_gen"]["metrics"][METRIC]["value"]
    output = tmp_path / "cli"
    command = [
        str(Path(sys.executable).with_name("lm_eval")), "--model", "local-chat-completions",
        "--model_args", f"base_url={default_router.url}/v1/chat/completions,model=smollm2,num_concurrent=1",
        "--tasks", "arithmetic_2da_gen", "--include_path", str(FIXTURES), "--limit", str(LIMIT),
        "--apply_chat_template", "--output_path", str(output), "--log_samples",
    ]
    done = subprocess.run(command, cwd=FIXTURES, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = output.glob("**/results_*.json")
    theirs = json.loads(results_file.read_text())["results"]["arithmetic_2da_gen"][METRIC]
    assert ours == theirs
    (samples_file,) = output.glob("**/samples_arithmetic_2da_gen_*.jsonl")
    cli_answers = [json.loads(line)["resps"] for line in samples_file.read_text().splitlines()]
    our_answers = [json.loads(line)["resps"] for line in
                   (outcome.transcripts / "lmeval-rep1-arithmetic_2da_gen.samples.jsonl").read_text().splitlines()]
    assert cli_answers == our_answers  # the same model said the same things to both


@pytest.mark.llamacpp
async def test_a_loglikelihood_task_on_llama_cpp_says_why_it_cannot_run(default_router, tmp_path):
    with pytest.raises(lmeval.LmevalError) as refused:
        await execute(run_settings(default_router, tmp_path, tasks=[str(LOGLIKELIHOOD)], lmeval_api="completions"))
    message = str(refused.value)
    assert "arithmetic_2da_local score answers by log-likelihood" in message
    assert "GET /tokenizer_info answered 404" in message and "echo" in message
    assert "vLLM serves both when started with --enable-tokenizer-info-endpoint" in message
    assert get_run(str(tmp_path / "grill.db"), 1) is None  # nothing stored
