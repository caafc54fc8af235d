"""The bench's pure decisions, as tables: which levels a run has, what is flagged, what compare may claim."""

from __future__ import annotations

import pytest

from swaplab.bench import workloads
from swaplab.bench.compare import compare_level
from swaplab.bench.summary import length_flags, level_figures, per_rep
from swaplab.errors import SwaplabError


@pytest.mark.parametrize(
    ("given", "context", "lengths"),
    [
        ([], None, [1024, 8192, 32768]),
        ([], 40_000, [1024, 8192, 32768]),
        ([], 16_384, [1024, 8192, 16_368]),  # the defaults capped, ending with the longest that fits
        ([], 2048, [1024, 2032]),
        ([512, 64], 2048, [64, 512]),  # given lengths are kept (the target refuses what can't fit)
    ],
)
def test_prefill_lengths(given, context, lengths):
    workload = workloads.prefill(input_tokens=given, output_tokens=16, context_tokens=context)
    assert [level.input_tokens for level in workload.levels] == lengths


@pytest.mark.parametrize(
    ("concurrency", "rates", "requests", "expected"),
    [
        ([], [], None, [("c=1", 4), ("c=2", 8), ("c=4", 16), ("c=8", 32)]),
        ([1, 16], [], 10, [("c=1", 10), ("c=16", 10)]),
        ([], [0.5, 8], None, [("rate=0.5", 8), ("rate=8", 32)]),
    ],
)
def test_throughput_levels(concurrency, rates, requests, expected):
    workload = workloads.throughput(input_tokens=128, output_tokens=64, concurrency=concurrency, rates=rates, requests=requests)
    assert [(level.name, level.requests) for level in workload.levels] == expected


def test_nonsense_settings_are_user_errors():
    with pytest.raises(SwaplabError, match="--concurrency must be at least 1"):
        workloads.throughput(input_tokens=128, output_tokens=64, concurrency=[0])
    with pytest.raises(SwaplabError, match="twice"):
        workloads.throughput(input_tokens=128, output_tokens=64, concurrency=[2, 2])
    with pytest.raises(SwaplabError, match="--rate must be above 0"):
        workloads.throughput(input_tokens=128, output_tokens=64, rates=[0])


def row(rep, sent, end, *, tokens=64, prompt=128, ttft=100.0, error=None, warmup=False):
    return {
        "rep": rep, "level": "c=1", "seq": 0, "sent_at": sent, "end_at": end, "ttft_ms": None if error else ttft,
        "tpot_ms": None if error else 10.0, "e2e_ms": (end - sent) * 1000, "prompt_tokens": None if error else prompt,
        "completion_tokens": None if error else tokens, "cached_tokens": None, "error": error, "warmup": warmup,
        "data": {"itl_ms": [10.0] * (tokens - 1)} if not error else {"itl_ms": []},
    }


def test_per_rep_rates_count_the_time_failures_took_but_not_their_tokens():
    rows = [row(1, 0.0, 1.0), row(1, 1.0, 2.0, error="HTTP 503: busy"), row(2, 10.0, 11.0), row(2, 11.0, 12.0)]
    figures = per_rep(rows)
    assert figures["output_tokens_per_second"] == [32.0, 64.0]  # 64 tokens over 2 s, 128 over 2 s
    assert figures["requests_per_second"] == [0.5, 1.0]


def test_warmup_rows_never_count_and_lengths_off_by_more_than_5_percent_are_flagged():
    level = workloads.Level("c=1", input_tokens=128, output_tokens=64, requests=2)
    rows = [
        row(1, 0.0, 1.0, tokens=1, warmup=True),  # a warm-up: would be flagged if it counted
        row(1, 1.0, 2.0, tokens=64), row(1, 2.0, 3.0, tokens=61),  # 61 is 4.7% short: fine
    ]
    figures = level_figures(level, rows)
    assert figures["measured_requests"] == 2 and figures["achieved_output_tokens"]["min"] == 61
    assert length_flags(figures) == []
    figures = level_figures(level, [*rows, row(1, 3.0, 4.0, tokens=60)])  # 6.25% short
    assert length_flags(figures) == ["c=1: output lengths 60-64 tokens, asked for 64 (off by more than 5%)"]


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        ([100.0, 100.01, 100.02], [100.30, 100.31, 100.32], "indistinguishable"),  # significant, but 0.3%
        ([100.0, 100.01, 100.02], [110.0, 110.01, 110.02], "different"),
        ([100.0, 104.0, 98.0], [101.0, 99.0, 103.0], "indistinguishable"),  # spreads overlap
    ],
)
def test_compare_claims_no_difference_under_one_percent(a, b, verdict):
    result = compare_level("c=1", "output tok/s", a, b, 0.01)
    assert result.comparison.verdict == verdict
    if a[0] == 100.0 and b[0] == 100.30:
        assert "too small to claim" in result.comparison.reason
