"""The needle suite against a real `swaplab sim --script`: sizing by /tokenize, scoring per cell."""

from __future__ import annotations

import re

import aiohttp

from swaplab.client import OpenAIClient
from swaplab.grill.needle import (
    compose,
    filler_sentences,
    found,
    lengths_that_fit,
    needle_cells,
    run_needle,
)
from swaplab.grill.outcome import FAIL, INCONCLUSIVE, PASS, Sampling

DEPTHS = [0.1, 0.5, 0.9]




def test_cells_are_deterministic_and_each_fact_unique():
    cells = needle_cells(DEPTHS, [400, 2000])
    assert cells == needle_cells(DEPTHS, [400, 2000])
    assert cells != needle_cells(DEPTHS, [400, 2000], seed=1)
    assert [(cell.depth, cell.context_tokens) for cell in cells] == [(d, n) for n in (400, 2000) for d in DEPTHS]
    assert len({cell.fact for cell in cells}) == len({cell.question for cell in cells}) == 6
    for cell in cells:
        assert re.fullmatch(r"[a-z]+-\d{4}", cell.fact) and cell.fact in cell.sentence
    # The filler never states a code, so only the needle can answer.
    stream = filler_sentences()
    filler = " ".join(next(stream) for _ in range(2000))
    assert "vault" not in filler and "code" not in filler


def test_the_fact_sits_at_its_depth():
    filler = [f"Sentence number {n} is here." for n in range(100)]
    for cell in needle_cells([0.0, 0.5, 1.0], [1000]):
        text = compose(cell, filler)
        haystack = text.split("\n\n")[1]
        position = haystack.index(cell.sentence) / len(haystack)
        assert abs(position - cell.depth) < 0.02, (cell.depth, position)
        assert text.endswith(f"Question: {cell.question}")


def test_matching_the_answer():
    assert found("dune-7071", "The code is DUNE - 7071.")
    assert found("dune-7071", "dune-7071")
    assert not found("dune-7071", "dune-70712")
    assert not found("dune-7071", "dune-7017")
    assert not found("dune-7071", "I could not find it.")


def test_lengths_beyond_the_context_are_left_out_with_a_note():
    fitting, notes = lengths_that_fit([1024, 4096, 16384], 8192, 2048, model="m")
    assert fitting == [1024, 4096]
    assert notes == ["needle length 16384 left out: with the 2048-token answer budget it is beyond m's context of 8192 tokens"]
    assert lengths_that_fit([1024, 1 << 20], None, 2048, model="m") == ([1024, 1 << 20], [])


async def test_the_sim_tokenizes_one_token_per_word(scripted):
    sim = scripted({"rules": []})
    body = {"content": "The access code\nis dune-7071."}
    async with aiohttp.ClientSession() as session, session.post(f"{sim.url}/tokenize", json=body) as response:
        tokens = (await response.json())["tokens"]
    assert len(tokens) == 5 and all(isinstance(token, int) for token in tokens)
    async with OpenAIClient(sim.url) as client:
        assert len(await client.tokenize("one two three", model="scripted")) == 3


async def test_only_the_cell_answered_at_depth_half_passes(scripted):
    lengths = [400, 900]
    cells = needle_cells(DEPTHS, lengths)
    answered = [cell for cell in cells if cell.depth == 0.5]
    sim = scripted({
        "rules": [{"match": re.escape(cell.fact), "replies": [f"The code is {cell.fact}."]} for cell in answered],
        "default": "I could not find it.",
    })
    notes: list[str] = []
    async with OpenAIClient(sim.url) as client:
        outcomes = await run_needle(
            client, "scripted", Sampling(max_tokens=64), depths=DEPTHS, lengths=lengths, notes=notes
        )
    assert notes == []  # the sim reports no context: nothing is left out
    grid = {(outcome.extra["depth"], outcome.extra["context_tokens"]): outcome.status for outcome in outcomes}
    assert grid == {(0.1, 400): FAIL, (0.5, 400): PASS, (0.9, 400): FAIL, (0.1, 900): FAIL, (0.5, 900): PASS, (0.9, 900): FAIL}
    for outcome in outcomes:
        extra = outcome.extra
        assert outcome.suite == outcome.round == "needle"
        # Sized with the sim's /tokenize; its chat usage counts the same words.
        assert extra["length_method"] == "tokenize"
        assert extra["prompt_tokens"] == extra["measured_tokens"] <= extra["context_tokens"]
        assert extra["context_tokens"] - extra["measured_tokens"] < 25  # short by less than one filler sentence
        prompt = outcome.transcript[0]["content"]
        assert extra["fact"] in prompt
        assert outcome.output_tokens == outcome.requests[0].completion_tokens > 0


async def test_still_thinking_at_the_budget_is_inconclusive_and_a_wrong_code_fails(scripted):
    first, second, third = needle_cells(DEPTHS, [300])
    sim = scripted({"rules": [
        {"match": re.escape(first.fact), "replies": [{"reasoning": "Let me scan the text for the", "finish_reason": "length"}]},
        {"match": re.escape(second.fact), "replies": [{"content": f"<think>It must be {second.fact}</think>The code is reef-0000."}]},
        {"match": re.escape(third.fact), "replies": [{"content": f"<think>found it</think>{third.fact}"}]},
    ]})
    async with OpenAIClient(sim.url) as client:
        outcomes = await run_needle(client, "scripted", Sampling(max_tokens=32), depths=DEPTHS, lengths=[300])
    assert [outcome.status for outcome in outcomes] == [INCONCLUSIVE, FAIL, PASS]
    assert "still thinking" in outcomes[0].detail
    # The fact in the thinking alone doesn't count: only the final answer is scored.
    assert outcomes[1].transcript[-1]["reasoning"] == f"It must be {second.fact}"


def test_a_needle_only_run_prints_the_needle_grid_and_no_empty_round_table(scripted, tmp_path):
    from procs import run_swaplab

    sim = scripted({"rules": [], "default": "I could not find it."})
    done = run_swaplab(
        "grill", "run", "--url", sim.url, "--model", "scripted", "--suite", "needle", "--reps", "1",
        "--needle-lengths", "300", "--needle-depths", "0.5", "--db", str(tmp_path / "grill.db"),
        "--transcripts", str(tmp_path / "transcripts"),
    )
    assert done.returncode == 0, done.stderr
    assert "needle (passes/reps)" in done.stdout and "depth 0.5" in done.stdout
    assert "┃ round" not in done.stdout  # no code or agent round ran: no table of rounds
