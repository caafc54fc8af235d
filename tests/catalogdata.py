"""The seed's catalogue inputs and runs as the bench and the grill store them: what the catalogue tests share."""

from __future__ import annotations

from pathlib import Path

from swaplab.results.runs import Run, save_run

FIXTURES = Path(__file__).parent / "fixtures"
SEED_CONFIG = FIXTURES / "seed-glm-flash.yaml"
SEED_NOTES = FIXTURES / "notes"
SEED_ID, SEED_ALIAS = "glm-flash-sglang", "glm-4.7-flash-sglang-tp2"
SEPTEMBER_4 = 1788516000.0  # 2026-09-04, the day of the seed's head-to-head


# -- runs as the bench and the grill store them (docs/results.md) -------------------------


def spread(mean: float, low: float | None = None, high: float | None = None, n: int = 3) -> dict:
    return {"mean": mean, "min": mean if low is None else low, "max": mean if high is None else high, "n": n}


def latency(mean: float, p50: float | None = None) -> dict:
    p50 = mean if p50 is None else p50
    return {"n": 24, "p50": p50, "p90": p50 * 1.1, "p99": p50 * 1.2, "mean": mean}


def throughput_run(model: str, rates: dict[int, tuple[float, float, float]], *, started: float, requested_model: str | None = None,
                   backend: str = "sglang") -> Run:
    levels = [
        {
            "level": f"c={concurrency}", "concurrency": concurrency, "input_tokens": 1024, "output_tokens": 256,
            "output_tokens_per_second": spread(*rate), "ttft_ms": latency(90 + 4 * concurrency),
            "tpot_ms": latency(12.5), "error_rate": 0.0,
        }
        for concurrency, rate in rates.items()
    ]
    first, last = min(rates), max(rates)
    summary = {
        "reps": 3, "warmup_discarded": 1, "levels": levels, "scaling": f"c={last} / c={first}",
        "scaling_ratio": spread(rates[last][0] / rates[first][0]),
    }
    return Run(kind="throughput", target_url="http://127.0.0.1:8080", model=model, requested_model=requested_model, started_at=started,
               backend_kind=backend, backend_version="0.5.2", summary=summary)


def prefill_run(model: str, ttft: dict[int, float], *, started: float) -> Run:
    levels = [
        {"level": f"in={length}", "concurrency": 1, "input_tokens": length, "output_tokens": 16,
         "ttft_ms": latency(mean), "prefill_tokens_per_second": spread(length / mean * 1000), "error_rate": 0.0}
        for length, mean in ttft.items()
    ]
    return Run(kind="prefill", target_url="http://127.0.0.1:8080", model=model, started_at=started,
               backend_kind="sglang", summary={"reps": 3, "levels": levels})


def prefix_cache_run(model: str, uncached: float, cached: float, *, started: float) -> Run:
    summary = {
        "reps": 3,
        "levels": [
            {"level": "uncached", "concurrency": 1, "input_tokens": 4160, "ttft_ms": latency(uncached)},
            {"level": "cached", "concurrency": 1, "input_tokens": 4160, "ttft_ms": latency(cached)},
        ],
        "uncached_ttft_ms": spread(uncached, uncached - 20, uncached + 15),
        "cached_ttft_ms": spread(cached, cached - 5, cached + 6),
        "cache_ttft_ratio": spread(uncached / cached),
    }
    return Run(kind="prefix-cache", target_url="http://127.0.0.1:8080", model=model, started_at=started,
               backend_kind="sglang", summary=summary)


def grill_run(model: str, scores: list[int], *, started: float, r5_complete: list[int] = (6, 6, 6),
              tok_per_step: list[float] = (162.0,), requested_model: str | None = None, log: str = "") -> Run:
    """A grill run in the shape docs/results.md ("Grill runs") defines."""
    summary = {
        "suites": ["code", "agent"], "reps": len(scores),
        "score": spread(sum(scores) / len(scores), min(scores), max(scores), len(scores)), "total": 23,
        "rounds": [{"round": "r1", "score": spread(7), "total": 8}, {"round": "r2", "score": spread(3), "total": 5}],
        "tok_per_step": spread(sum(tok_per_step) / len(tok_per_step), min(tok_per_step), max(tok_per_step)),
        "r5": {"complete": spread(sum(r5_complete) / len(r5_complete), min(r5_complete), max(r5_complete)),
               "looped": spread(0), "total": 6},
        "log": log,
        "headline": f"{sum(scores) / len(scores):.1f}/23",
    }
    return Run(kind="grill", target_url="http://127.0.0.1:8080", model=model, requested_model=requested_model, started_at=started,
               backend_kind="sglang", summary=summary)


def seed_bench_runs(db: Path, model: str = SEED_ALIAS) -> None:
    """The seed's own numbers for the SGLang entry, recorded under the alias."""
    save_run(db, throughput_run(model, {1: (78.2, 77.9, 78.6), 2: (120.7, 120.1, 121.0), 4: (187.0, 186.2, 187.9),
                                        8: (271.6, 271.5, 271.8)}, started=SEPTEMBER_4))
    save_run(db, prefill_run(model, {8192: 2370.0, 32768: 18166.0}, started=SEPTEMBER_4 + 600))
    save_run(db, prefix_cache_run(model, 867.0, 269.0, started=SEPTEMBER_4 + 1200))


LMEVAL_SOURCE = "local: /work/main/tests/fixtures/lmeval/two_digit_addition.jsonl"


def lmeval_task(metrics: dict[str, tuple[list[float], float | None]], *, n: int = 20, source: str = LMEVAL_SOURCE) -> dict:
    """A task of the grill's `lmeval` summary: `metric,filter` -> (the score of each repetition, lm-eval's stderr)."""
    figures = {}
    for key, (reps, stderr) in metrics.items():
        metric, _, filter_name = key.partition(",")
        mean = sum(reps) / len(reps)
        figures[key] = {"metric": metric, "filter": filter_name, "value": mean, "reps": reps,
                        "spread": spread(mean, min(reps), max(reps), len(reps)), "stderr": stderr}
    return {"source": source, "output_type": "generate_until", "n": n, "version": 1.0, "metrics": figures}


def lmeval_grill_run(model: str, tasks: dict[str, dict], *, started: float, api: str = "chat", limit: int | None = 20,
                     answers: int = 40, truncated: int = 0, log: str = "") -> Run:
    """A grill run of the `lmeval` suite alone, its summary as `grill.summary.summarize` writes it."""
    figures = [(name, next(iter(task["metrics"].values()))) for name, task in tasks.items()]  # each task's first metric
    summary = {
        "suites": ["lmeval"], "reps": max(len(figure["reps"]) for _, figure in figures), "rounds": [],
        "lmeval": {
            "api": api, "limit": limit, "temperature": None, "answers": answers, "truncated": truncated,
            "truncation_rate": truncated / answers if answers else 0.0,
            "logs": [f"lmeval-rep1-{name}.samples.jsonl" for name in tasks] + ["lmeval-rep1-results.json"],
            "tasks": tasks,
        },
        "log": log,
        "headline": ", ".join(f"{name} {figure['metric']} {figure['value']:.3f}" for name, figure in figures),
    }
    return Run(kind="grill", target_url="http://127.0.0.1:8080", model=model, started_at=started, backend_kind="sglang",
               summary=summary)
