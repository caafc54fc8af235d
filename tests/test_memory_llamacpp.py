"""The memory estimator against what the real llama.cpp server reports when it loads.

On the shipped models (SmolLM2: GQA; Gemma-3-270M: sliding window) under the settings
that move each term, and on GGUF files of other families built by tests/ggufs.py (llama and
qwen3 GQA, deepseek2 MLA with MoE layers, gemma3 SWA, qwen3moe, lfm2 hybrid): weights and KV
within 2% of llama.cpp's own figures, compute buffers within 15%. xllamacpp.memory (the
port of Ollama's estimator that the wheel ships) is measured on the same loads and printed
beside, as docs/memory.md shows it; its errors are not asserted.
"""

from __future__ import annotations

import memorycases
import pytest
from ggufs import BUILDERS

pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")
pytestmark = pytest.mark.llamacpp

BARS = {"weights": 0.02, "kv": 0.02, "compute": 0.15}


def check(rows: list[memorycases.Row]) -> None:
    print("\n" + memorycases.table(rows))
    misses = [
        f"{row.case.name} {' '.join(row.case.flags)}: {term} {row.error(term):+.1%} (bar {BARS[term]:.0%})"
        for row in rows for term in memorycases.TERMS if abs(row.error(term)) > BARS[term]
    ]
    assert not misses, "\n".join(misses)


def test_the_shipped_models_estimates_match_llama_cpps_own_buffers():
    rows = [memorycases.measure(case) for case in memorycases.shipped_cases()]
    check(rows)
    # What the kinds of attention change, in llama.cpp's own figures: Gemma 3's
    # sliding-window layers keep a window, not the context (111 MiB at 32k, not 576).
    gemma_32k = next(r for r in rows if r.case.name == "gemma3-270m" and r.case.flags == ("-c", "32768"))
    gemma_full = next(r for r in rows if r.case.name == "gemma3-270m" and "--swa-full" in r.case.flags)
    assert gemma_32k.reported["kv"] * 5 < gemma_full.reported["kv"]


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_constructed_families_estimates_match_llama_cpps_own_buffers(family, tmp_path):
    check([memorycases.measure(case) for case in memorycases.constructed_cases(tmp_path, [family])])
