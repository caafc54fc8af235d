"""The `lmeval` suite: lm-evaluation-harness tasks run through lm-eval's own library against the served model.

lm-eval does the benchmark (its task configs, prompts, filters, metrics and standard
errors); swaplab points it at the model through the router, runs it once per repetition,
applies the grill's reasoning rule to what the model answered (`extract.split_inline`: the
answer is what follows the last end-of-thinking marker, and a thought never closed is a
truncated answer, scored as a failure and counted), and keeps what lm-eval reported with
the run: per task and metric, the score of each repetition, lm-eval's standard error and
n, and lm-eval's own per-sample log as files beside the run.

Generative tasks (`generate_until`) go to `/v1/chat/completions` (`--lmeval-api chat`,
with the model's chat template) or `/v1/completions`; log-likelihood tasks (multiple
choice) need `/v1/completions` returning the prompt's logprobs (`echo`) and the server's
tokenizer (`/tokenizer_info`), which only vLLM serves, and only when started with
`--enable-tokenizer-info-endpoint` (vllm/entrypoints/serve/tokenize/api_router.py:87; SGLang
0.5.23 and llama.cpp's server have no such route): `check_loglikelihood` says so before anything runs.

A task is a name lm-eval knows (its data from the Hugging Face hub, which needs the
network) or a task YAML file (or a folder of them) whose `dataset_path: json` reads local
`data_files`, relative to the YAML's own folder. `sources` says which each task is, and a
hub task on a machine that cannot reach the hub is refused with that reason.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from swaplab.errors import SwaplabError
from swaplab.grill.extract import split_inline

LMEVAL_SUITE = "lmeval"
LOCAL_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow"})
HUB_HOST = ("huggingface.co", 443)
LOGLIKELIHOOD_TYPES = frozenset({"loglikelihood", "multiple_choice", "loglikelihood_rolling"})


class LmevalError(SwaplabError):
    """An lm-eval run that cannot go ahead: what is missing, and what to do instead."""


@dataclass(frozen=True)
class TaskSource:
    """One task as the run will give it to lm-eval: a name, or a config read from a YAML file."""

    name: str
    config: dict[str, Any] | None
    """The YAML's config with its local data paths made absolute (None: a task lm-eval knows by name)."""
    origin: str
    """Where its data comes from, as the run says it: `local: PATH` or `hub: DATASET`."""
    output_type: str = ""

    @property
    def local(self) -> bool:
        return self.origin.startswith("local:")


@dataclass
class LmevalReport:
    """What the repetitions gave: lm-eval's results per repetition, its samples, the reasoning counts."""

    results: list[dict[str, Any]] = field(default_factory=list)
    """lm-eval's `results` (per task: `metric,filter` and `metric_stderr,filter`), one per repetition."""
    n_samples: dict[str, int] = field(default_factory=dict)
    samples: list[dict[str, list[dict[str, Any]]]] = field(default_factory=list)
    """lm-eval's per-sample log per task, one per repetition."""
    configs: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    answers: int = 0
    truncated: int = 0
    """Answers whose thought never closed: scored as failures (an empty answer), counted here."""


# -- which tasks ---------------------------------------------------------------------


def sources(names: Sequence[str], include: Sequence[str] = ()) -> list[TaskSource]:
    """The tasks named (lm-eval task names, task YAML files, or names found in `include` folders), with where
    each one's data comes from; a YAML that is not a task, or a name nobody knows, raises LmevalError."""
    from lm_eval.tasks import TaskManager  # lm-eval and its datasets stack load only for this suite

    by_name: dict[str, Path] = {}
    unread: list[str] = []
    for folder in include:
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise LmevalError(f"--lmeval-include {folder}: no such folder")
        for yaml_file in sorted([*path.glob("*.yaml"), *path.glob("*.yml")]):
            try:
                task = _task_name(yaml_file)
            except Exception as error:  # as lm-eval's index does: a file nobody asked for is skipped
                unread.append(f"{yaml_file} ({type(error).__name__}: {error})")
                continue
            if task is not None:
                by_name.setdefault(task, yaml_file)
    found: list[TaskSource] = []
    manager: Any = None
    for name in names:
        if name.endswith((".yaml", ".yml")) or Path(name).is_file():
            found.append(_from_yaml(Path(name).expanduser()))
        elif name in by_name:
            found.append(_from_yaml(by_name[name]))
        else:
            manager = manager or TaskManager()
            if name not in manager.all_tasks:
                raise LmevalError(
                    f"lm-eval knows no task {name!r}: give a task name lm-eval lists (`lm_eval ls tasks`), a task "
                    "YAML file, or --lmeval-include FOLDER holding it"
                    + (f" (unreadable there: {'; '.join(unread)})" if unread else "")
                )
            found.append(_from_registry(manager, name))
    return found


def _task_name(path: Path) -> str | None:
    """The `task:` a YAML of an include folder names, read as lm-eval's own index reads it (its
    `_index.py`): `!function`s left as paths, never imported. Only the tasks asked for are loaded
    with their code (`_from_yaml`), so a stray YAML's Python never runs."""
    from lm_eval.tasks._yaml_loader import load_yaml

    config = load_yaml(path, resolve_func=False)
    task = config.get("task") if isinstance(config, dict) else None
    return task if isinstance(task, str) else None


def _yaml(path: Path) -> dict[str, Any]:
    from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own reader: `include`, `!function`

    if not path.is_file():
        raise LmevalError(f"{path}: no such task file")
    try:
        config = load_yaml(path)
    except Exception as error:  # yaml errors, a missing include, a !function that cannot import
        raise LmevalError(f"{path}: not a task lm-eval can read ({type(error).__name__}: {error})") from None
    if not isinstance(config, dict):
        raise LmevalError(f"{path}: a task file holds a mapping, not {type(config).__name__}")
    return config


def _from_yaml(path: Path) -> TaskSource:
    config = _yaml(path)
    name = config.get("task")
    if not isinstance(name, str) or not name:
        raise LmevalError(f"{path}: no `task:` name (a group file? name its tasks instead)")
    config = dict(config)
    origin = f"hub: {config.get('dataset_path')}"
    if config.get("dataset_path") in LOCAL_BUILDERS:
        kwargs = dict(config.get("dataset_kwargs") or {})
        files = kwargs.get("data_files")
        local = _local_files(files, path.parent)
        if local is not None:
            kwargs["data_files"] = local
            config["dataset_kwargs"] = kwargs
            shown = sorted({str(p) for p in (local.values() if isinstance(local, dict) else [local])})
            origin = "local: " + ", ".join(shown)
        else:
            origin = f"hub: {files}"
    return TaskSource(name, config, origin, str(config.get("output_type") or "generate_until"))


def _local_files(files: Any, folder: Path) -> Any:
    """`data_files` with paths relative to the YAML's folder made absolute; None if one is not a local file."""
    def one(value: Any) -> str | None:
        if not isinstance(value, str) or "://" in value:
            return None
        path = Path(value).expanduser()
        path = path if path.is_absolute() else folder / path
        return str(path.resolve()) if path.is_file() else None

    if isinstance(files, dict):
        resolved = {split: one(value) for split, value in files.items()}
        return None if any(value is None for value in resolved.values()) else resolved
    return one(files)


def _from_registry(manager: Any, name: str) -> TaskSource:
    entry = manager.task_index.get(name)
    config: Any = {}
    if entry is not None and entry.yaml_path is not None:
        try:
            from lm_eval.tasks._yaml_loader import load_yaml

            config = load_yaml(entry.yaml_path, resolve_func=False)
        except Exception:  # a group, or a config that reads only in lm-eval's own loader: its name is enough
            config = {}
    config = config if isinstance(config, dict) else {}
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    dataset = config.get("dataset_path") or "?"
    origin = f"hub: {dataset}" + (f" ({files})" if files and dataset in LOCAL_BUILDERS else "")
    return TaskSource(name, None, origin, str(config.get("output_type") or ""))


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether this machine can reach the Hugging Face hub (and is not told to stay offline)."""
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "TRUE") or os.environ.get("HF_DATASETS_OFFLINE") in ("1", "true"):
        return False
    try:
        socket.create_connection(HUB_HOST, timeout=timeout).close()
        return True
    except OSError:
        return False


def check_sources(found: Sequence[TaskSource], online: Callable[[], bool] = hub_reachable) -> None:
    """Hub tasks need the hub: refuse them, saying so, on a machine that cannot reach it."""
    hub = [task for task in found if not task.local]
    if hub and not online():
        listed = "; ".join(f"{task.name} ({task.origin})" for task in hub)
        raise LmevalError(
            f"these tasks read their data from the Hugging Face hub, which this machine cannot reach: {listed}. "
            "Offline, give a task YAML with `dataset_path: json` and local `data_files` (docs/grill.md, lm-eval)"
        )


# -- reaching the model ----------------------------------------------------------------


def check_loglikelihood(url: str, model: str, api_key: str | None, found: Sequence[TaskSource]) -> None:
    """Log-likelihood tasks need the prompt's logprobs and the server's tokenizer: say so before running
    when the model's server has neither (llama.cpp's)."""
    import requests

    scored = [task.name for task in found if task.output_type in LOGLIKELIHOOD_TYPES]
    if not scored:
        return
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = upstream_base(url, model)
    problems = []
    try:
        info = requests.get(f"{base}/tokenizer_info", headers=headers, timeout=300)
        if info.status_code != 200:
            problems.append(f"GET /tokenizer_info answered {info.status_code}")
        probe = requests.post(f"{base}/v1/completions", headers=headers, timeout=300, json={
            "model": model, "prompt": "The sky is", "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0,
        })
        choice = (probe.json().get("choices") or [{}])[0] if probe.status_code == 200 else {}
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        if not (isinstance(logprobs, dict) and isinstance(logprobs.get("token_logprobs"), list)
                and len(logprobs["token_logprobs"]) > 1):
            problems.append("/v1/completions with echo returns no logprobs of the prompt's tokens")
    except (requests.RequestException, ValueError) as error:
        problems.append(f"the probe failed ({error})")
    if problems:
        raise LmevalError(
            f"{', '.join(scored)} score answers by log-likelihood, which needs the model's server to give the "
            f"prompt's logprobs and its tokenizer; {model}'s does not ({'; '.join(problems)}). vLLM serves both when "
            "started with --enable-tokenizer-info-endpoint; SGLang and llama.cpp's server have no /tokenizer_info: "
            "run generative (generate_until) tasks on them instead"
        )


def upstream_base(url: str, model: str) -> str:
    """The model's own server through a swaplab router (`/upstream/MODEL`), where lm-eval's tokenizer calls
    (`/tokenizer_info`, `/tokenize`) reach it; a URL that is not a router's is the server itself."""
    parsed = urlparse(url.rstrip("/"))
    base = f"{parsed.scheme}://{parsed.netloc}{parsed.path}".removesuffix("/v1")
    return f"{base}/upstream/{model}"


def model_for(api: str, url: str, model: str, api_key: str | None, loglikelihood: bool, report: LmevalReport):
    """lm-eval's API model for the router, with the grill's reasoning rule on what the model answers."""
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    root = url.rstrip("/").removesuffix("/v1")

    def parse(parent: Callable[..., list[str]]) -> Callable[..., list[str]]:
        def parse_generations(self, outputs: Any, **kwargs: Any) -> list[str]:
            answers = []
            for text in parent(self, outputs, **kwargs):
                report.answers += 1
                answer, _, truncated = split_inline(text or "")
                if truncated:
                    report.truncated += 1
                    answers.append("")  # the budget ran out inside the thought: no answer
                elif answer != (text or "").strip():
                    answers.append(answer)  # thinking taken off the front
                else:
                    answers.append(text or "")  # nothing to take off: as the model said it
            return answers
        return parse_generations

    common = {"model": model, "num_concurrent": 1, "max_retries": 3, "auth_token": api_key, "timeout": 600}
    if api == "chat":
        chat_class = type("SwaplabChat", (LocalChatCompletion,), {
            "parse_generations": parse(LocalChatCompletion.parse_generations)})
        return chat_class(base_url=f"{root}/v1/chat/completions", **common)
    completion_class = type("SwaplabCompletions", (LocalCompletionsAPI,), {
        "parse_generations": parse(lambda self, outputs, **kwargs: LocalCompletionsAPI.parse_generations(outputs))})
    if loglikelihood:  # the server's own tokenizer, reached through /upstream/MODEL
        return completion_class(base_url=f"{upstream_base(url, model)}/v1/completions", tokenizer_backend="remote",
                                **common)
    return completion_class(base_url=f"{root}/v1/completions", tokenizer_backend=None, tokenized_requests=False,
                            **common)


# -- running -------------------------------------------------------------------------


def run_reps(
    found: Sequence[TaskSource], *, url: str, model: str, api: str, api_key: str | None, reps: int,
    limit: int | None, gen_kwargs: dict[str, Any] | None, seed: int = 1234,
    on_rep: Callable[[int], None] | None = None,
) -> LmevalReport:
    """lm-eval's `simple_evaluate` once per repetition (synchronous: run it off the event loop)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    report = LmevalReport()
    loglikelihood = any(task.output_type in LOGLIKELIHOOD_TYPES for task in found)
    if loglikelihood and api == "chat":
        names = ", ".join(task.name for task in found if task.output_type in LOGLIKELIHOOD_TYPES)
        raise LmevalError(f"{names} score by log-likelihood, which chat completions cannot: use --lmeval-api completions")
    lm = model_for(api, url, model, api_key, loglikelihood, report)
    tasks: list[Any] = [task.config if task.config is not None else task.name for task in found]
    for rep in range(1, reps + 1):
        if on_rep is not None:
            on_rep(rep)
        outcome = lm_eval.simple_evaluate(
            model=lm, tasks=tasks, limit=limit, task_manager=TaskManager(), log_samples=True,
            apply_chat_template=api == "chat", gen_kwargs=gen_kwargs or None,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
        )
        if outcome is None:
            raise LmevalError("lm-eval returned no results (a run on a worker rank?)")
        report.results.append(outcome["results"])
        report.samples.append(outcome.get("samples") or {})
        report.n_samples = {task: counts.get("effective", 0) for task, counts in outcome.get("n-samples", {}).items()}
        report.configs = outcome.get("configs") or {}
        report.versions = outcome.get("versions") or {}
    return report


def summary_of(report: LmevalReport, found: Sequence[TaskSource], *, api: str, limit: int | None) -> dict[str, Any]:
    """The run summary's `lmeval`: per task and metric, each repetition's score, lm-eval's standard error and n."""
    from swaplab.results.stats import spread

    tasks: dict[str, Any] = {}
    for task in found:
        metrics: dict[str, Any] = {}
        per_rep = [results.get(task.name, {}) for results in report.results]
        for key in per_rep[0] if per_rep else ():
            if "," not in key or "_stderr," in key or not isinstance(per_rep[0][key], (int, float)):
                continue
            metric, _, filter_name = key.partition(",")
            values = [float(results[key]) for results in per_rep if isinstance(results.get(key), (int, float))]
            stderrs = [results.get(f"{metric}_stderr,{filter_name}") for results in per_rep]
            stderrs = [float(value) for value in stderrs if isinstance(value, (int, float))]
            metrics[key] = {
                "metric": metric, "filter": filter_name, "value": sum(values) / len(values), "reps": values,
                "spread": spread(values), "stderr": sum(stderrs) / len(stderrs) if stderrs else None,
            }
        tasks[task.name] = {
            "source": task.origin, "output_type": task.output_type, "n": report.n_samples.get(task.name),
            "version": report.versions.get(task.name), "metrics": metrics,
        }
    return {
        "api": api, "limit": limit, "tasks": tasks, "answers": report.answers, "truncated": report.truncated,
        "truncation_rate": report.truncated / report.answers if report.answers else 0.0,
    }


def write_logs(folder: Path, report: LmevalReport) -> list[str]:
    """lm-eval's own per-sample log (a JSON line per sample) and its results, per repetition and task."""
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for rep, (results, samples) in enumerate(zip(report.results, report.samples, strict=True), start=1):
        for task, rows in samples.items():
            path = folder / f"lmeval-rep{rep}-{_safe(task)}.samples.jsonl"
            with path.open("w") as out:
                for row in rows:
                    out.write(json.dumps(row, default=str, ensure_ascii=False) + "\n")
            written.append(path.name)
        path = folder / f"lmeval-rep{rep}-results.json"
        path.write_text(json.dumps({"results": results, "configs": report.configs, "versions": report.versions,
                                    "n-samples": report.n_samples, "written_at": time.time()},
                                   indent=1, default=str) + "\n")
        written.append(path.name)
    return written


def sample_rows(report: LmevalReport) -> list[tuple[int, str, dict[str, Any]]]:
    """(rep, task, the sample's scores) for every sample: the run's task rows, which `grill compare` reads."""
    rows = []
    for rep, samples in enumerate(report.samples, start=1):
        for task, entries in samples.items():
            for entry in entries:
                scores = {name: entry[name] for name in entry.get("metrics") or () if isinstance(entry.get(name), (int, float))}
                rows.append((rep, task, {"doc_id": entry.get("doc_id"), "filter": entry.get("filter") or "none",
                                         "scores": scores,
                                         "target": str(entry.get("target"))[:200],
                                         "answer": str((entry.get("filtered_resps") or [""])[0])[:200]}))
    return rows


def _safe(name: str) -> str:
    return "".join(character if character.isalnum() or character in "._-" else "_" for character in name)


# -- comparing two runs --------------------------------------------------------------------

Z95 = 1.959963984540054


@dataclass(frozen=True)
class TaskComparison:
    """B against A on one lm-eval task and metric, over the samples both ran (paired) or each ran."""

    figure: str  # "arithmetic_2da_gen exact_match (last-number)"
    a: float
    b: float
    difference: float
    low: float
    high: float
    n: int
    paired: bool

    @property
    def different(self) -> bool:
        return self.low > 0 or self.high < 0


def per_sample(requests: Sequence[dict[str, Any]], task: str, metric: str, filter_name: str) -> dict[Any, float]:
    """A run's score of each sample on one task and metric, averaged over its repetitions."""
    sums: dict[Any, list[float]] = {}
    for request in requests:
        data = request.get("data") or {}
        if data.get("round") != f"lmeval:{task}" or (data.get("filter") or "none") != filter_name:
            continue
        value = (data.get("scores") or {}).get(metric)
        if isinstance(value, (int, float)):
            sums.setdefault(data.get("doc_id"), []).append(float(value))
    return {doc: sum(values) / len(values) for doc, values in sums.items()}


def compare_tasks(a: dict[str, Any], b: dict[str, Any]) -> list[TaskComparison]:
    """Every task and metric both runs scored: B - A with its 95% interval (normal approximation), paired over
    the samples both ran when they ran the same ones, else from each side's own standard error."""
    a_tasks = ((a.get("summary") or {}).get("lmeval") or {}).get("tasks") or {}
    b_tasks = ((b.get("summary") or {}).get("lmeval") or {}).get("tasks") or {}
    found = []
    for task in [name for name in a_tasks if name in b_tasks]:
        for key, figure in (a_tasks[task].get("metrics") or {}).items():
            if key not in (b_tasks[task].get("metrics") or {}):
                continue
            metric, filter_name = figure["metric"], figure.get("filter") or "none"
            a_values = per_sample(a.get("requests") or [], task, metric, filter_name)
            b_values = per_sample(b.get("requests") or [], task, metric, filter_name)
            if not a_values or not b_values:
                continue
            shown = f"{task} {metric}" + (f" ({filter_name})" if filter_name != "none" else "")
            found.append(_difference(shown, a_values, b_values))
    return found


def _difference(figure: str, a: dict[Any, float], b: dict[Any, float]) -> TaskComparison:
    mean_a, mean_b = sum(a.values()) / len(a), sum(b.values()) / len(b)
    shared = [doc for doc in a if doc in b]
    if len(shared) == len(a) == len(b) and len(shared) > 1:
        diffs = [b[doc] - a[doc] for doc in shared]
        mean = sum(diffs) / len(diffs)
        variance = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
        half = Z95 * (variance / len(diffs)) ** 0.5
        return TaskComparison(figure, mean_a, mean_b, mean, mean - half, mean + half, len(shared), True)
    half = Z95 * (_variance_of_mean(list(a.values())) + _variance_of_mean(list(b.values()))) ** 0.5
    difference = mean_b - mean_a
    return TaskComparison(figure, mean_a, mean_b, difference, difference - half, difference + half,
                          min(len(a), len(b)), False)


def _variance_of_mean(values: list[float]) -> float:
    if len(values) < 2:
        return float("inf")
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)
