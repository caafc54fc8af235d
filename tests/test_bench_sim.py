"""`swaplab bench` as a real process against `swaplab sim`, whose timing and failures are known.

Stated tolerances (against the sim's configured figures, never wall-clock bounds):
TTFT is never below the configured TTFT and at most TTFT_SLACK_MS above it (p50);
TPOT and ITL are within GAP_TOLERANCE of 1 / tokens-per-second.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

import pytest
from aiohttp import web
from procs import Sim, free_port, run_swaplab

from swaplab.bench.runner import poisson_offsets
from swaplab.results.runs import get_run, list_runs

TTFT_MS = 100.0
TOKENS_PER_SECOND = 50.0
TTFT_SLACK_MS = 25.0  # p50 over many requests; a 2-core machine runs the sim, the bench and the test
GAP_TOLERANCE = 0.03


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-sim")


@pytest.fixture(scope="module")
def selftest(workdir):
    """`bench selftest` run once into the module's store: the store, its JSON report and the finished process.

    Only set up here: what the selftest reports is checked by its own test, so a failure
    there fails that test, not every test of the module.
    """
    path = workdir / "swaplab.db"
    report = workdir / "selftest.json"
    done = run_swaplab("bench", "selftest", "--db", str(path), "--rounds", "3", "--output-tokens", "32", "--json", str(report))
    return path, report, done


@pytest.fixture(scope="module")
def db(selftest):
    """A store holding one selftest run, which every bench run in this module quotes."""
    path, _, _ = selftest
    return path


def test_the_selftest_reports_the_client_overhead_and_its_verdict(selftest):
    _, report, done = selftest
    assert done.returncode == 0, done.stderr
    figures = json.loads(report.read_text())
    # The figures are there; whether they meet the spec's bar (<= 1 ms at 64 streams) is
    # benchmarks/client_overhead.py's to say: a timing bar in a test fails whenever the
    # shared machine is busy.
    assert figures["streams"] == 64 and figures["failed"] == 0
    assert isinstance(figures["client_overhead_ms"], float) and figures["client_stream_rate_ratio"] > 0
    assert "client adds" in done.stdout


@pytest.fixture(scope="module")
def sims(workdir):
    started: dict[str, Sim] = {}

    def start(name: str, *extra: str) -> Sim:
        if name not in started:
            started[name] = Sim(workdir, *extra, model=name)
        return started[name]

    yield start
    for sim in started.values():
        sim.close()


def bench(db, *args: str, json_path=None):
    extra = ["--json", str(json_path)] if json_path else []
    return run_swaplab("bench", *args, "--db", str(db), *extra)


def paced_sim(sims, name: str = "paced", rate: float = TOKENS_PER_SECOND) -> Sim:
    return sims(name, "--ttft-ms", str(TTFT_MS), "--tokens-per-second", str(rate))


@pytest.fixture(scope="module")
def timed_run(db, sims, workdir):
    """throughput at c=1 and c=4 against a sim at 100 ms TTFT and 50 tok/s: the report and the stored run."""
    sim = paced_sim(sims)
    report = workdir / "timed.json"
    done = bench(db, "throughput", "--url", sim.url, "--model", "paced", "--input-tokens", "32", "--output-tokens", "16",
                 "--concurrency", "1,4", "--reps", "2", json_path=report)
    assert done.returncode == 0, done.stderr
    document = json.loads(report.read_text())
    return done, document, get_run(db, document["run_id"])


def test_measured_ttft_tpot_and_itl_match_the_sims_settings(timed_run):
    _, document, _ = timed_run
    gap = 1000 / TOKENS_PER_SECOND
    for level in document["levels"]:
        assert level["error_rate"] == 0
        assert TTFT_MS <= level["ttft_ms"]["p50"] <= TTFT_MS + TTFT_SLACK_MS, level["level"]
        assert level["tpot_ms"]["p50"] == pytest.approx(gap, rel=GAP_TOLERANCE)
        assert level["itl_ms"]["p50"] == pytest.approx(gap, rel=GAP_TOLERANCE)
        assert level["e2e_ms"]["p50"] == pytest.approx(TTFT_MS + 15 * gap, rel=GAP_TOLERANCE)
        # Exact lengths: the sim counts one token per word and adds nothing around a chat prompt.
        assert level["achieved_input_tokens"] == {"mean": 32, "min": 32, "max": 32, "n": level["measured_requests"]}
        assert level["achieved_output_tokens"]["min"] == level["achieved_output_tokens"]["max"] == 16
        # Four requests per slot, each done in TTFT + 15 gaps: the sim's own rate, per rep.
        ideal = level["concurrency"] * 16 / ((TTFT_MS + 15 * gap) / 1000)
        assert level["output_tokens_per_second"]["mean"] == pytest.approx(ideal, rel=0.05)
        assert level["output_tokens_per_second"]["n"] == 2
    assert "flags" not in document


def test_the_report_carries_the_protocol(timed_run, db):
    done, document, run = timed_run
    assert document["reps"] == 2 and document["warmup_discarded"] == 1
    assert isinstance(document["client_overhead_ms"], float)
    selftest = list_runs(db, kind="selftest")[0]
    assert document["client_overhead_ms"] == selftest["summary"]["client_overhead_ms"]
    assert [level["concurrency"] for level in document["levels"]] == [1, 4]
    for key in ("output_tokens_per_second", "achieved_input_tokens", "achieved_output_tokens"):
        assert set(document["levels"][0][key]) >= {"mean", "min", "max"}
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(document["levels"][0][key]) >= {"p50", "p90", "p99", "mean"}
    assert document["scaling_ratio"]["mean"] == pytest.approx(4, rel=0.05)
    assert run["kind"] == "throughput" and run["backend_kind"] == "swaplab-sim" and run["status"] == "completed"
    assert f"Stored as run {run['id']}" in done.stdout and "c=4" in done.stdout


def test_the_warmup_run_is_discarded_and_recorded_as_such(timed_run):
    _, document, run = timed_run
    assert run["warmup_discarded"] == 1
    warmup = [request for request in run["requests"] if request["warmup"]]
    measured = [request for request in run["requests"] if not request["warmup"]]
    assert {request["level"] for request in warmup} == {"c=1", "c=4"}
    assert len(warmup) == 4 + 16 and len(measured) == 2 * (4 + 16)
    assert {request["rep"] for request in measured} == {1, 2}
    for level in document["levels"]:
        # Only measured requests are in the figures.
        assert level["ttft_ms"]["n"] == level["measured_requests"] == 2 * 4 * level["concurrency"]


def test_failed_requests_show_in_the_error_rate_and_not_in_latencies(db, sims, workdir):
    # The sim exits after 28 tokens: the probe and the first requests get theirs, one
    # stream breaks in the middle, the rest find nothing listening.
    sim = sims("crashing", "--ttft-ms", str(TTFT_MS), "--tokens-per-second", str(TOKENS_PER_SECOND),
               "--crash-after-tokens", "28")
    report = workdir / "crashing.json"
    done = bench(db, "throughput", "--url", sim.url, "--input-tokens", "8", "--output-tokens", "10",
                 "--concurrency", "1", "--requests", "6", "--reps", "1", "--warmup", "0", json_path=report)
    assert done.returncode == 0, done.stderr
    document = json.loads(report.read_text())
    level = document["levels"][0]
    requests = [request for request in document["requests"] if request["level"] == "c=1"]
    failed = [request for request in requests if request["error"]]
    succeeded = [request for request in requests if not request["error"]]
    assert len(failed) >= 2 and len(succeeded) >= 1
    assert level["error_rate"] == pytest.approx(len(failed) / len(requests))
    assert level["failed_requests"] == len(failed)
    # Latencies are the successful requests' only: the broken stream (shorter) and the
    # refused ones (near zero) would pull e2e down.
    assert level["e2e_ms"]["n"] == level["ttft_ms"]["n"] == len(succeeded)
    full = TTFT_MS + 9 * 1000 / TOKENS_PER_SECOND
    assert level["e2e_ms"]["p50"] == pytest.approx(full, rel=GAP_TOLERANCE)
    assert level["e2e_ms"]["p99"] == pytest.approx(full, rel=GAP_TOLERANCE)
    assert any(request["completion_tokens"] is None and request["data"]["itl_ms"] for request in failed)  # the broken one
    assert "errors" in done.stdout


@pytest.fixture(scope="module")
def compared_runs(db, sims):
    """Two runs of one sim at 50 tok/s and one of a sim at 60 tok/s: their run ids."""
    ids = {}
    for name, sim in (("a", paced_sim(sims, "paced")), ("a-again", paced_sim(sims, "paced")),
                      ("b", paced_sim(sims, "faster", rate=60.0))):
        done = bench(db, "throughput", "--url", sim.url, "--input-tokens", "16", "--output-tokens", "16",
                     "--concurrency", "2", "--requests", "4", "--reps", "3")
        assert done.returncode == 0, done.stderr
        ids[name] = list_runs(db, kind="throughput", limit=1)[0]["id"]
    return ids


def test_compare_separates_50_from_60_tok_s(db, compared_runs):
    done = run_swaplab("bench", "compare", str(compared_runs["a"]), str(compared_runs["b"]), "--db", str(db))
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("c=2"))
    assert ": different;" in line
    # Per request: 100 ms + 15 gaps of 20 ms vs of 16.7 ms: B/A = 400 / 350.
    ratio = float(line.split("B/A = ")[1].split()[0])
    assert ratio == pytest.approx(400 / 350, rel=0.02)
    assert done.stdout.strip().endswith("Verdict: different.")


def test_compare_finds_two_runs_of_one_config_indistinguishable(db, compared_runs):
    done = run_swaplab("bench", "compare", str(compared_runs["a"]), str(compared_runs["a-again"]), "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("Verdict: indistinguishable."), done.stdout


def test_poisson_arrivals_at_a_rate(db, sims, workdir):
    sim = paced_sim(sims)
    report = workdir / "rate.json"
    done = bench(db, "throughput", "--url", sim.url, "--input-tokens", "8", "--output-tokens", "4", "--rate", "20",
                 "--requests", "10", "--reps", "1", "--warmup", "0", json_path=report)
    assert done.returncode == 0, done.stderr
    document = json.loads(report.read_text())
    level = document["levels"][0]
    assert level["rate"] == 20 and level["level"] == "rate=20" and level["error_rate"] == 0
    sent = sorted(request["sent_at"] for request in document["requests"])
    # Seeded: the same schedule as the bench computes it, to the millisecond.
    expected = poisson_offsets(random.Random("0/0/rate=20"), 20, 10)
    assert [round(moment - sent[0], 2) for moment in sent] == pytest.approx(expected, abs=0.01)


# -- servers the sim can't imitate, scripted here: no streaming usage, no /tokenize, a small context ----


class ScriptedServer:
    """An OpenAI-compatible server in the test's own event loop: one token per word, `overhead`
    tokens of template around each prompt, no /tokenize, a context of `context` tokens that it
    enforces with a 400 (and does not report), and usage in its streams only when `usage`."""

    def __init__(self, *, usage: bool = True, context: int = 10_000, overhead: int = 3):
        self.usage, self.context, self.overhead = usage, context, overhead

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "someone"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = self.overhead + len(body["messages"][0]["content"].split())
        answer = body.get("max_tokens") or 4
        if prompt + answer > self.context:
            message = f"This model's maximum context length is {self.context} tokens; you asked for {prompt + answer}"
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(answer):
            chunk = {"choices": [{"index": 0, "delta": {"content": f" w{index}"}, "finish_reason": None}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        await response.write(b"data: " + json.dumps(finish).encode() + b"\n\n")
        if self.usage:
            usage = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": answer}}
            await response.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response


async def bench_against(server: ScriptedServer, db, *args: str):
    """Serve `server` on a free port while `swaplab bench ... --url` runs against it; returns (code, stdout, stderr)."""
    runner = web.AppRunner(server.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "swaplab", "bench", *args, "--url", f"http://127.0.0.1:{port}", "--db", str(db),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    finally:
        await runner.cleanup()
    return process.returncode, stdout.decode(), stderr.decode()


async def test_without_a_tokenizer_lengths_are_calibrated_from_usage(db, workdir):
    report = workdir / "calibrated.json"
    code, _, stderr = await bench_against(
        ScriptedServer(), db, "throughput", "--input-tokens", "50", "--output-tokens", "4", "--concurrency", "1",
        "--requests", "2", "--reps", "1", "--json", str(report),
    )
    assert code == 0, stderr
    document = json.loads(report.read_text())
    assert document["parameters"]["length_method"] == "calibrated from usage.prompt_tokens"
    assert document["parameters"]["prompt_overhead_tokens"] == 3
    assert document["levels"][0]["achieved_input_tokens"]["min"] == document["levels"][0]["achieved_input_tokens"]["max"] == 50


@pytest.mark.parametrize("case", ["no-streaming-usage", "beyond-an-unreported-context"])
async def test_servers_that_cannot_be_measured_are_one_line_exit_2_and_no_run(db, case):
    before = len(list_runs(db, limit=1000))
    server = ScriptedServer(usage=False) if case == "no-streaming-usage" else ScriptedServer(context=100)
    code, _, stderr = await bench_against(
        server, db, "throughput", "--input-tokens", "200", "--output-tokens", "4", "--concurrency", "1", "--reps", "1",
    )
    expected = "without usage" if case == "no-streaming-usage" else "maximum context length is 100 tokens"
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swaplab: ") and expected in lines[0], stderr
    assert len(list_runs(db, limit=1000)) == before
