"""One grill run from start to stored result: reach the model, ask every task of every
suite once per repetition, keep each transcript, summarise, save in one transaction.

Nothing is written to the store until the run is over: an unreachable server, an unknown
model, an unknown task name or an interrupted run leave it as it was. Transcripts are
files (a needle prompt alone can be a whole context), one per task attempt, in a folder
the summary's `log` names.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swaplab.client import OpenAIClient, WallClock
from swaplab.client.server import ServerInfo
from swaplab.errors import SwaplabError
from swaplab.grill.outcome import ERROR, Sampling, TaskOutcome
from swaplab.grill.summary import summarize
from swaplab.results.runs import RequestRow, Run, save_run, served_run
from swaplab.results.store import default_path

GRILL_KIND = "grill"
DEFAULT_TEMPERATURE = 0.2
DEFAULT_NEEDLE_DEPTHS = (0.1, 0.5, 0.9)
FIRST_NEEDLE_LENGTH = 1024
NEEDLE_LENGTH_STEP = 4  # 1k, 4k, 16k, 64k, 256k: one cell per step up to the context


@dataclass
class GrillSettings:
    """Everything a `swaplab grill run` is told."""

    url: str
    model: str | None = None
    suites: list[str] = field(default_factory=lambda: ["code", "agent", "needle"])
    reps: int = 3
    temperature: float | None = None  # None: the model's metadata, else DEFAULT_TEMPERATURE
    max_tokens: int = 2048
    tasks: list[str] = field(default_factory=list)  # only these (empty: all)
    needle_lengths: list[int] = field(default_factory=list)
    needle_depths: list[float] = field(default_factory=lambda: list(DEFAULT_NEEDLE_DEPTHS))
    transcripts: str | None = None
    limit: int | None = None  # lmeval: the first N samples of each task
    lmeval_api: str = "chat"  # lmeval: "chat" or "completions"
    lmeval_include: list[str] = field(default_factory=list)  # lmeval: folders of task YAML files
    api_key: str | None = None
    db: str | None = None

    def parameters(self) -> dict[str, Any]:
        """The settings recorded with the run (no credentials, no paths of this machine)."""
        recorded = asdict(self)
        for name in ("api_key", "db", "url", "model", "transcripts", "lmeval_include"):
            recorded.pop(name)
        if "lmeval" not in self.suites:
            for name in ("limit", "lmeval_api"):
                recorded.pop(name)
        return recorded


class Observer:
    """What a run tells whoever watches it (the CLI's progress bar); every method may be left as is."""

    def planned(self, total: int) -> None: ...

    def phase(self, description: str) -> None: ...

    def task_started(self, rep: int, suite: str, task: str) -> None: ...

    def task_done(self, rep: int, outcome: TaskOutcome) -> None: ...


@dataclass
class GrillOutcome:
    run: Run
    run_id: int
    summary: dict[str, Any]
    outcomes: list[tuple[int, TaskOutcome]]
    transcripts: Path
    notes: list[str]  # what the run left out and why (needle lengths beyond the context, ...)


@dataclass(frozen=True)
class Job:
    """One task of a suite, ready to ask: `ask(client, model, sampling)` grades one attempt."""

    suite: str
    round: str
    task: str
    ask: Callable[[OpenAIClient, str, Sampling], Awaitable[TaskOutcome]]


def split_tasks(suites: list[str], only: list[str]) -> tuple[list[str], list[str]]:
    """`--tasks` as (the grill's own task names, lm-eval's): with the lmeval suite, a name no other chosen
    suite has (or a YAML file) is an lm-eval task."""
    if "lmeval" not in suites:
        return only, []
    others = [suite for suite in suites if suite != "lmeval"]
    known = {job.task for job in suite_jobs(others, [])} if others else set()
    return [name for name in only if name in known], [name for name in only if name not in known]


def suite_jobs(suites: list[str], only: list[str]) -> list[Job]:
    """The tasks of the chosen suites (needle apart: it is a grid, asked in one go), in suite order."""
    jobs: list[Job] = []
    if "code" in suites:
        from swaplab.grill.code import ask_code, code_tasks

        jobs += [Job("code", task.round, task.name, _bound(ask_code, task)) for task in code_tasks()]
    if "agent" in suites:
        from swaplab.grill.agent import agent_tasks, run_agent

        jobs += [Job("agent", task.round, task.name, _bound(run_agent, task)) for task in agent_tasks()]
    if "humaneval" in suites:
        from swaplab.grill.humaneval import ask_humaneval, humaneval_tasks

        jobs += [Job("humaneval", task.round, task.name, _bound(ask_humaneval, task)) for task in humaneval_tasks()]
    if only:
        known = {job.task for job in jobs}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise SwaplabError(
                f"no task named {', '.join(unknown)} in the suites {', '.join(suites)} "
                "(`swaplab grill selfcheck` lists every task)"
            )
        jobs = [job for job in jobs if job.task in only]
    return jobs


def _bound(ask: Callable[..., Awaitable[TaskOutcome]], task: Any) -> Callable[[OpenAIClient, str, Sampling], Awaitable[TaskOutcome]]:
    async def bound(client: OpenAIClient, model: str, sampling: Sampling) -> TaskOutcome:
        return await ask(client, model, task, sampling)

    return bound


def needle_lengths(context_tokens: int | None) -> list[int]:
    """1k, 4k, 16k, ... up to the context (just 1k when the server doesn't say it)."""
    if context_tokens is None:
        return [FIRST_NEEDLE_LENGTH]
    lengths = []
    length = FIRST_NEEDLE_LENGTH
    while length < context_tokens:
        lengths.append(length)
        length *= NEEDLE_LENGTH_STEP
    return lengths


async def execute(settings: GrillSettings, observer: Observer | None = None) -> GrillOutcome:
    """Run the suites against the model and store the run; raises SwaplabError for what a user can fix."""
    observer = observer or Observer()
    _check(settings)
    own_tasks, lmeval_tasks = split_tasks(settings.suites, settings.tasks)
    grill_suites = [suite for suite in settings.suites if suite != "lmeval"]
    jobs = suite_jobs(grill_suites, own_tasks) if grill_suites and (own_tasks or not settings.tasks) else []
    run_needle_suite = "needle" in settings.suites and not settings.tasks
    lmeval_sources = _lmeval_sources(settings, lmeval_tasks, observer)
    if not jobs and not run_needle_suite and not lmeval_sources:
        raise SwaplabError("nothing to run: no task left after --suite and --tasks")
    started_at = time.time()
    clock = WallClock()
    notes: list[str] = []
    if "needle" in settings.suites and settings.tasks:
        notes.append("needle left out: --tasks picks tasks by name, and the needle grid has none")
    outcomes: list[tuple[int, TaskOutcome]] = []
    lmeval_report = None
    lmeval_temperature: float | None = None
    async with OpenAIClient(settings.url, api_key=settings.api_key) as client:
        observer.phase("reaching the model")
        info = await client.server_info(settings.model)
        temperature = settings.temperature
        configured = await metadata_temperature(client, info, default=None)
        if temperature is None:
            temperature = configured if configured is not None else DEFAULT_TEMPERATURE
        sampling = Sampling(temperature=temperature, max_tokens=settings.max_tokens)
        asked = settings.needle_lengths or needle_lengths(info.context_tokens)
        lengths: list[int] = []
        if run_needle_suite:
            from swaplab.grill.needle import lengths_that_fit

            # The same rule run_needle applies, here to plan the progress bar and say what is left out.
            lengths, left_out = lengths_that_fit(asked, info.context_tokens, settings.max_tokens, model=info.model)
            notes += left_out
            if not lengths:
                notes.append("needle left out: no haystack fits; lower --max-tokens or pass --needle-lengths")
        needle_cells = len(lengths) * len(settings.needle_depths)
        observer.planned((len(jobs) + needle_cells) * settings.reps)

        for rep in range(1, settings.reps + 1):
            for job in jobs:
                observer.task_started(rep, job.suite, job.task)
                outcome = await job.ask(client, info.model, sampling)
                outcomes.append((rep, outcome))
                observer.task_done(rep, outcome)
            if lengths:
                from swaplab.grill.needle import run_needle

                observer.task_started(rep, "needle", f"{needle_cells} cells")
                # Every length asked for: a cell's fact comes from the whole grid, fitting or not.
                for outcome in await run_needle(
                    client, info.model, sampling, depths=settings.needle_depths, lengths=asked
                ):
                    outcomes.append((rep, outcome))
                    observer.task_done(rep, outcome)
        if lmeval_sources:
            # lm-eval's tasks carry their own sampling; a temperature given here or in the model's config wins.
            lmeval_temperature = settings.temperature if settings.temperature is not None else configured
            lmeval_report = await _run_lmeval(settings, info.model, lmeval_sources, lmeval_temperature, observer)
    ended_at = time.time()

    transcripts = transcript_folder(settings, info, started_at)
    rows = [
        _row(rep, seq, outcome, write_transcript(transcripts, rep, outcome), clock)
        for seq, (rep, outcome) in enumerate(outcomes)
    ]
    lmeval_summary = None
    if lmeval_report is not None:
        from swaplab.grill import lmeval

        lmeval_summary = lmeval.summary_of(lmeval_report, lmeval_sources, api=settings.lmeval_api, limit=settings.limit)
        lmeval_summary["temperature"] = lmeval_temperature  # None: each task's own generation settings
        lmeval_summary["logs"] = lmeval.write_logs(transcripts, lmeval_report)
        rows += [_lmeval_row(rep, len(rows) + index, task, sample)
                 for index, (rep, task, sample) in enumerate(lmeval.sample_rows(lmeval_report))]
    summary = summarize(outcomes, suites=settings.suites, reps=settings.reps, log=str(transcripts),
                        lmeval=lmeval_summary)
    # An lmeval-only run asked at no grill temperature: what it records is the one lm-eval used.
    recorded_temperature = sampling.temperature if grill_suites else lmeval_temperature
    summary["temperature"] = recorded_temperature
    summary["max_tokens"] = sampling.max_tokens
    summary["isolation"] = _isolation(settings.suites)
    if notes:
        summary["notes"] = notes
    run = served_run(
        GRILL_KIND,
        info,
        parameters={**settings.parameters(), "temperature": recorded_temperature},
        started_at=started_at,
        ended_at=ended_at,
        summary=summary,
        all_failed=bool(outcomes) and all(outcome.status == ERROR for _, outcome in outcomes),
    )
    run_id = save_run(settings.db, run, rows)
    return GrillOutcome(run, run_id, summary, outcomes, transcripts, notes)


def _lmeval_sources(settings: GrillSettings, names: list[str], observer: Observer) -> list:
    """The lm-eval tasks to run, checked before the model is reached (a hub task offline is refused here)."""
    if "lmeval" not in settings.suites:
        return []
    if not names:
        raise SwaplabError(
            "the lmeval suite runs the lm-eval tasks --tasks names: lm-eval task names (their data from the Hugging "
            "Face hub) or task YAML files (e.g. --tasks tests/fixtures/lmeval/arithmetic_2da_gen.yaml)"
        )
    if settings.limit is not None and settings.limit < 1:
        raise SwaplabError(f"--limit must be at least 1, got {settings.limit}")
    try:
        from swaplab.grill import lmeval
    except ImportError as error:  # pragma: no cover - the optional dependency
        raise SwaplabError(f"the lmeval suite needs lm-eval: pip install 'swaplab[lmeval]' ({error})") from None
    observer.phase("reading the lm-eval tasks")
    try:
        found = lmeval.sources(names, settings.lmeval_include)
        lmeval.check_sources(found)
    except ImportError as error:
        raise SwaplabError(f"the lmeval suite needs lm-eval: pip install 'swaplab[lmeval]' ({error})") from None
    return found


async def _run_lmeval(settings: GrillSettings, model: str, found: list, temperature: float | None,
                      observer: Observer):
    from swaplab.grill import lmeval

    await asyncio.to_thread(lmeval.check_loglikelihood, settings.url, model, settings.api_key, found)
    for task in found:
        observer.phase(f"lm-eval {task.name}: {task.origin}")

    def announce(rep: int) -> None:
        observer.phase(f"rep {rep} · lmeval · {', '.join(task.name for task in found)}")

    gen_kwargs = {"temperature": temperature} if temperature is not None else None
    return await asyncio.to_thread(
        lmeval.run_reps, found, url=settings.url, model=model, api=settings.lmeval_api, api_key=settings.api_key,
        reps=settings.reps, limit=settings.limit, gen_kwargs=gen_kwargs, on_rep=announce,
    )


def _lmeval_row(rep: int, seq: int, task: str, sample: dict[str, Any]) -> RequestRow:
    """One lm-eval sample as a task row: its scores, what was asked for and what was answered."""
    scores = sample["scores"]
    binary = all(value in (0, 1) for value in scores.values())
    status = ("pass" if all(value == 1 for value in scores.values()) else "fail") if binary else "scored"
    return RequestRow(rep=rep, level=f"{task}/{sample['doc_id']}", seq=seq,
                      data={"suite": "lmeval", "round": f"lmeval:{task}", "status": status, **sample})


def _check(settings: GrillSettings) -> None:
    if settings.reps < 1:
        raise SwaplabError(f"--reps must be at least 1, got {settings.reps}")
    if settings.max_tokens < 1:
        raise SwaplabError(f"--max-tokens must be at least 1, got {settings.max_tokens}")
    if settings.temperature is not None and not (0 <= settings.temperature <= 2):
        raise SwaplabError(f"--temperature must be between 0 and 2, got {settings.temperature}")
    if any(not 0 <= depth <= 1 for depth in settings.needle_depths):
        raise SwaplabError("--needle-depths are fractions of the haystack, between 0 and 1")
    if any(length < 1 for length in settings.needle_lengths):
        raise SwaplabError("--needle-lengths must be positive token counts")


async def metadata_temperature(
    client: OpenAIClient, info: ServerInfo, default: float | None = DEFAULT_TEMPERATURE
) -> float | None:
    """The model's own sampling temperature from its config `metadata`, else `default` (0.2).

    A router lists it as llama-swap does, under `/v1/models` `meta.llamaswap`; swaplab before
    issue 13 put the metadata in `meta` itself, so that is read too.

    The seed's model card wanted 0.7 for tool calling: the config is where such a choice lives.
    """
    status, document = await client.get_json("/v1/models")
    entries = document.get("data") if status == 200 and isinstance(document, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("id") in (info.model_id, info.model):
            meta = entry.get("meta")
            meta = meta if isinstance(meta, dict) else {}
            llamaswap = meta.get("llamaswap")
            value = llamaswap.get("temperature") if isinstance(llamaswap, dict) else meta.get("temperature")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
                return float(value)
    return default


def transcript_folder(settings: GrillSettings, info: ServerInfo, started_at: float) -> Path:
    """`--transcripts`, else `grill/<time>-<model>/` next to the database."""
    if settings.transcripts:
        base = Path(settings.transcripts).expanduser()
    else:
        base = Path(settings.db or default_path()).expanduser().resolve().parent / "grill"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started_at))
    folder = base / f"{stamp}-{_safe(info.model)}"
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = base / f"{stamp}-{_safe(info.model)}-{suffix}"
    return folder.resolve()


def write_transcript(folder: Path, rep: int, outcome: TaskOutcome) -> str:
    """One JSON file per task attempt; returns its path relative to the run's folder."""
    relative = Path(f"rep{rep}") / f"{_safe(outcome.round)}-{_safe(outcome.task)}.json"
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "suite": outcome.suite, "round": outcome.round, "task": outcome.task, "rep": rep,
        "status": outcome.status, "detail": outcome.detail, "steps": outcome.steps,
        "output_tokens": outcome.output_tokens, "wall_seconds": round(outcome.wall_seconds, 3),
        "extra": outcome.extra, "transcript": outcome.transcript,
    }
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    return relative.as_posix()


def _row(rep: int, seq: int, outcome: TaskOutcome, transcript: str, clock: WallClock) -> RequestRow:
    requests = outcome.requests
    first, last = (requests[0], requests[-1]) if requests else (None, None)
    prompt_tokens = [result.prompt_tokens for result in requests if result.prompt_tokens is not None]
    reasoning_tokens = [result.reasoning_tokens for result in requests if result.reasoning_tokens is not None]
    data = {
        "suite": outcome.suite, "round": outcome.round, "status": outcome.status, "detail": outcome.detail,
        "steps": outcome.steps, "wall_seconds": round(outcome.wall_seconds, 3), "requests": len(requests),
        "transcript": transcript, **({"extra": outcome.extra} if outcome.extra else {}),
    }
    return RequestRow(
        rep=rep,
        level=outcome.task,
        seq=seq,
        sent_at=clock.unix(first.sent_at) if first else None,
        first_token_at=clock.unix(first.first_token_at) if first else None,
        end_at=clock.unix(last.end_at) if last and last.end_at else None,
        ttft_ms=first.ttft_ms if first else None,
        e2e_ms=outcome.wall_seconds * 1000,
        prompt_tokens=sum(prompt_tokens) if prompt_tokens else None,
        completion_tokens=outcome.output_tokens,
        reasoning_tokens=sum(reasoning_tokens) if reasoning_tokens else None,
        finish_reason=last.finish_reason if last else None,
        error=outcome.detail or "request failed" if outcome.status == ERROR else None,
        data=data,
    )


def _isolation(suites: list[str]) -> str | None:
    if not {"code", "agent", "humaneval"} & set(suites):
        return None
    from swaplab.grill.sandbox import isolation

    return isolation()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
