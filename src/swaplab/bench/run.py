"""One bench run from start to stored result: reach the target, prepare every prompt, run the warm-up
and the repetitions, summarise, save in one transaction.

Nothing is written until the run is over: an unreachable server, an unknown model, a
length beyond the context or an interrupted run leave the store as it was.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from swaplab.bench import workloads
from swaplab.bench.overhead import OverheadFigure, client_overhead
from swaplab.bench.workloads import Level, Workload
from swaplab.bench.runner import closed_loop, open_loop, poisson_offsets
from swaplab.bench.summary import stored_summary, summarize
from swaplab.bench.target import Target, describe_target, reach
from swaplab.client import OpenAIClient, RequestResult, WallClock
from swaplab.errors import SwaplabError
from swaplab.results.runs import RequestRow, Run, save_run, served_run

DEFAULT_PREFIX_TOKENS = 4096
ITL_DECIMALS = 3


@dataclass
class BenchSettings:
    """Everything a `swaplab bench throughput|prefill|prefix-cache` run is told."""

    kind: str
    url: str
    model: str | None = None
    endpoint: str = "chat"
    reps: int = 3
    warmup: int = 1
    seed: int = 0  # Poisson arrivals; prompts are always fresh random text
    api_key: str | None = None
    input_tokens: list[int] = field(default_factory=list)
    output_tokens: int | None = None
    concurrency: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    requests: int | None = None
    prefix_tokens: int | None = None
    suffix_tokens: int = 64
    db: str | None = None
    fresh_selftest: bool = False

    def parameters(self) -> dict[str, Any]:
        """The settings that shaped the run, as recorded with it (no credentials, nothing another kind uses)."""
        unused = {
            "throughput": ("prefix_tokens", "suffix_tokens"),
            "prefill": ("concurrency", "rates", "seed", "prefix_tokens", "suffix_tokens"),
            "prefix-cache": ("concurrency", "rates", "seed", "input_tokens"),
        }.get(self.kind, ())
        recorded = asdict(self)
        for name in ("api_key", "db", "url", "model", "kind", *unused):
            recorded.pop(name)
        return recorded


class Observer:
    """What a run tells whoever watches it (the CLI's progress bar); every method may be left as is."""

    def planned(self, total_requests: int) -> None: ...

    def phase(self, description: str) -> None: ...

    def request_done(self, result: RequestResult) -> None: ...

    def token(self) -> None: ...


@dataclass
class BenchOutcome:
    run: Run
    run_id: int
    summary: dict[str, Any]  # with each level's per-rep figures
    rows: list[RequestRow]
    overhead: OverheadFigure
    target: dict[str, Any]  # how prompts and answers were made


async def execute(settings: BenchSettings, observer: Observer | None = None) -> BenchOutcome:
    """Run the workload against the target and store it; raises SwaplabError for anything a user can fix."""
    observer = observer or Observer()
    if settings.reps < 1:
        raise SwaplabError(f"--reps must be at least 1, got {settings.reps}")
    if settings.warmup < 0:
        raise SwaplabError(f"--warmup must be 0 or more, got {settings.warmup}")
    prompt_seed = secrets.randbits(64)  # fresh text every run: a cache warmed by an earlier run can't help
    rng = random.Random(prompt_seed)
    started_at = time.time()
    async with OpenAIClient(settings.url, api_key=settings.api_key, on_token=observer.token) as client:
        observer.phase("reaching the target")
        target = await reach(client, settings.model, endpoint=settings.endpoint, rng=rng)
        workload = _workload(settings, target)
        for level in workload.levels:
            target.check_fits(level.input_tokens, level.output_tokens, flag=_length_flag(workload))
            target.content_tokens(level.input_tokens)
        if workload.prefix_tokens:
            target.content_tokens(workload.prefix_tokens)
        await target.check_longest(rng, max(level.input_tokens for level in workload.levels))

        overhead = await client_overhead(settings.db, fresh=settings.fresh_selftest, observer=observer)

        observer.phase("preparing prompts")
        runs = settings.warmup + settings.reps
        payloads = [await _payloads(target, workload, rng) for _ in range(runs)]
        observer.planned(sum(len(batch) for prepared in payloads for batch in prepared.values()))

        clock = WallClock()
        rows: list[RequestRow] = []
        for index in range(runs):
            warmup = index < settings.warmup
            rep = index + 1 if warmup else index - settings.warmup + 1
            label = f"warm-up {rep}/{settings.warmup}" if warmup else f"rep {rep}/{settings.reps}"
            for level in workload.levels:
                observer.phase(f"{label} {level.name}")
                prepared = payloads[index]
                if level.cached:
                    prime = await client.send(target.path, prepared[_prime(level)][0])
                    observer.request_done(prime)
                    rows.append(_row(prime, clock, rep=rep, level=_prime(level), seq=0, warmup=warmup))
                results = await _send_level(client, target, level, prepared[level.name], settings.seed, index, observer)
                rows += [_row(result, clock, rep=rep, level=level.name, seq=seq, warmup=warmup) for seq, result in enumerate(results)]
    ended_at = time.time()

    row_dicts = [asdict(row) for row in rows]
    summary = summarize(workload, row_dicts, reps=settings.reps, warmup=settings.warmup, client_overhead_ms=overhead.milliseconds)
    summary["client_overhead_source"] = overhead.source
    measured = [row for row in rows if not row.warmup]
    recorded_target = describe_target(target)
    run = served_run(
        workload.kind,
        target.info,
        parameters={**settings.parameters(), **recorded_target, "prompt_seed": prompt_seed,
                    "levels": [level.naming() | {"requests": level.requests} for level in workload.levels],
                    "prefix_tokens": workload.prefix_tokens or None},
        started_at=started_at,
        ended_at=ended_at,
        warmup_discarded=settings.warmup,
        summary=stored_summary(summary),
        all_failed=bool(measured) and all(row.error is not None for row in measured),
    )
    run_id = save_run(settings.db, run, rows)
    return BenchOutcome(run, run_id, summary, rows, overhead, recorded_target)


def _workload(settings: BenchSettings, target: Target) -> Workload:
    context = target.info.context_tokens
    if settings.kind == "throughput":
        if settings.rates and settings.concurrency:
            raise SwaplabError("--rate and --concurrency are alternatives: give one")
        if len(settings.input_tokens) > 1:
            raise SwaplabError("throughput takes one --input-tokens (prefill sweeps prompt lengths)")
        return workloads.throughput(
            input_tokens=settings.input_tokens[0] if settings.input_tokens else 1024,
            output_tokens=settings.output_tokens or 256,
            concurrency=settings.concurrency,
            rates=settings.rates,
            requests=settings.requests,
        )
    if settings.kind == "prefill":
        return workloads.prefill(
            input_tokens=settings.input_tokens, output_tokens=settings.output_tokens or 16,
            context_tokens=context, requests=settings.requests,
        )
    if settings.kind == "prefix-cache":
        output_tokens = settings.output_tokens or 16
        prefix = settings.prefix_tokens
        if prefix is None:
            # Capped at the context, like prefill's default lengths.
            prefix = DEFAULT_PREFIX_TOKENS
            if context is not None:
                prefix = min(prefix, context - settings.suffix_tokens - output_tokens)
        return workloads.prefix_cache(
            prefix_tokens=prefix, suffix_tokens=settings.suffix_tokens, output_tokens=output_tokens,
            requests=settings.requests,
        )
    raise SwaplabError(f"unknown bench kind {settings.kind!r}")


def _length_flag(workload: Workload) -> str:
    return "--prefix-tokens + --suffix-tokens =" if workload.kind == "prefix-cache" else "--input-tokens"


def _prime(level: Level) -> str:
    return f"{level.name}-prime"


async def _payloads(target: Target, workload: Workload, rng: random.Random) -> dict[str, list[bytes]]:
    """Every request of one run (warm-up or rep), as bytes: fresh random text first, except a shared prefix."""
    prepared: dict[str, list[bytes]] = {}
    for level in workload.levels:
        content_tokens = target.content_tokens(level.input_tokens)
        if level.cached:
            # One prefix per run, so the warm-up's cache can't serve a rep; the priming
            # request puts it in the cache, then every request reuses it.
            prefix = await target.prompts.fit(rng, target.content_tokens(workload.prefix_tokens))
            texts = await target.prompts.fit_many(rng, [content_tokens] * (level.requests + 1), prefix=prefix)
            prepared[_prime(level)] = [target.payload(texts[0], level.output_tokens)]
            texts = texts[1:]
        else:
            texts = await target.prompts.fit_many(rng, [content_tokens] * level.requests)
        prepared[level.name] = [target.payload(text, level.output_tokens) for text in texts]
    return prepared


async def _send_level(
    client: OpenAIClient, target: Target, level: Level, payloads: list[bytes], seed: int, run_index: int,
    observer: Observer,
) -> list[RequestResult]:
    if level.rate is not None:
        # Seeded per run and level: the same arrival schedule every time the run is repeated.
        offsets = poisson_offsets(random.Random(f"{seed}/{run_index}/{level.name}"), level.rate, len(payloads))
        return await open_loop(client, target.path, payloads, offsets, on_done=observer.request_done)
    return await closed_loop(client, target.path, payloads, level.concurrency or 1, on_done=observer.request_done)


def _row(result: RequestResult, clock: WallClock, *, rep: int, level: str, seq: int, warmup: bool) -> RequestRow:
    data: dict[str, Any] = {"itl_ms": [round(gap, ITL_DECIMALS) for gap in result.itl_ms]}
    if result.server_tokens_per_second is not None:
        data["server_tokens_per_second"] = result.server_tokens_per_second
    if result.status is not None:
        data["status"] = result.status
    if result.attempts > 1:
        data["attempts"] = result.attempts
    return RequestRow(
        rep=rep,
        level=level,
        seq=seq,
        sent_at=clock.unix(result.sent_at),
        first_token_at=clock.unix(result.first_token_at),
        end_at=clock.unix(result.end_at),
        ttft_ms=result.ttft_ms,
        tpot_ms=result.tpot_ms,
        e2e_ms=result.e2e_ms,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cached_tokens=result.cached_tokens,
        reasoning_tokens=result.reasoning_tokens,
        finish_reason=result.finish_reason,
        error=result.error,
        warmup=warmup,
        data=data,
    )
