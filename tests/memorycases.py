"""The estimator against llama.cpp's own figures, beside xllamacpp.memory's (Ollama's port).

Each case loads a GGUF with the real llama.cpp server (the xllamacpp wheel, `-lv 4`) and
compares the model, KV (+ recurrent state) and compute buffers it reports with
`swaplab.memory.estimate` and with `xllamacpp.memory.graph_size`. Used by
tests/test_memory_llamacpp.py; run it to print the table docs/memory.md shows:

    .venv/bin/python tests/memorycases.py
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE)]

from swaplab.builtin.models import GEMMA3, SMOLLM2, model_path
from swaplab.memory.estimate import LoadSettings, estimate
from swaplab.memory.facts import read_gguf
from swaplab.memory.flags import llama_load
from swaplab.memory.reported import report_of_load

TERMS = ("weights", "kv", "compute")
# Each shipped model under the settings that move each term: context, slots, cache types,
# flash attention, ubatch, a unified cache, a full-size sliding-window cache.
SHIPPED_FLAGS = (
    ("-c", "4096"),
    ("-c", "32768"),
    ("-c", "16384", "-np", "3"),
    ("-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"),
    ("-c", "8192", "-ctk", "q4_0", "-ctv", "q4_0"),
    ("-c", "8192", "-fa", "off", "-np", "2"),
    ("-c", "8192", "-ub", "128"),
    ("-c", "8192", "-kvu", "-np", "4"),
)
GEMMA_ONLY = (("-c", "32768", "--swa-full"), ("-c", "32768", "-np", "2"))
# The families tests/ggufs.py builds, under the settings that change their terms most.
CONSTRUCTED_FLAGS = (
    ("-c", "4096"),
    ("-c", "16384", "-np", "4"),
    ("-c", "8192", "-fa", "off"),
    ("-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"),
)


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Row:
    case: Case
    reported: dict[str, int]
    ours: dict[str, int]
    theirs: dict[str, int]

    def error(self, term: str, which: str = "ours") -> float:
        got = self.reported[term]
        value = (self.ours if which == "ours" else self.theirs)[term]
        return (value - got) / got if got else 0.0


def shipped_cases() -> list[Case]:
    cases = []
    for model, extra in ((SMOLLM2, ()), (GEMMA3, GEMMA_ONLY)):
        for flags in (*SHIPPED_FLAGS, *extra):
            cases.append(Case(model.name, model_path(model), flags))
    return cases


def constructed_cases(folder: Path, families: Sequence[str] = ()) -> list[Case]:
    from ggufs import BUILDERS

    cases = []
    for family in families or sorted(BUILDERS):
        path = BUILDERS[family](folder / f"{family}.gguf")
        cases += [Case(family, path, flags) for flags in CONSTRUCTED_FLAGS]
    return cases


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(case: Case) -> Row:
    argv = [sys.executable, "-m", "swaplab.builtin.llamacpp", "-m", str(case.path), "--port", str(_port()),
            "-lv", "4", "--no-warmup", "-t", "1", "-fit", "off", *case.flags]
    reported, _ = report_of_load(argv)
    load = llama_load(argv)
    result = estimate(read_gguf(case.path), load.settings)
    ours = {"weights": result.total("weights"), "kv": result.total("kv") + result.total("recurrent"),
            "compute": result.total("compute")}
    got = {"weights": reported.total("weights"), "kv": reported.total("kv") + reported.total("recurrent"),
           "compute": reported.total("compute")}
    return Row(case, got, ours, xllamacpp_figures(case.path, load.settings, result.n_ctx))


@cache
def _metadata(path: Path) -> tuple[dict, int]:
    from gguf import GGUFReader
    from xllamacpp.memory import dump_metadata_json

    data = dump_metadata_json(GGUFReader(str(path), "r"), str(path))
    weights = sum(tensor["n_bytes"] for tensor in data["tensors"].values())
    return data["metadata"], weights


def xllamacpp_figures(path: Path, settings: LoadSettings, n_ctx: int) -> dict[str, int]:
    """xllamacpp.memory's figures for the same load: the weights as its layer sums count them,
    its KV list summed, its full-offload graph size as the compute buffer."""
    from xllamacpp.memory import graph_size

    metadata, weights = _metadata(path)
    kv, _partial, full = graph_size(
        metadata, context_length=n_ctx, batch_size=min(settings.ubatch, settings.batch),
        num_parallel=max(1, settings.parallel), kv_cache_type=settings.cache_type_k,
    )
    return {"weights": weights, "kv": int(sum(kv)), "compute": int(full)}


def table(rows: list[Row]) -> str:
    """One row per load: llama.cpp's figures, then each estimator's error per term."""
    lines = ["| model | flags | llama.cpp: weights / KV / compute (MiB) | swaplab error | xllamacpp.memory error |",
             "|---|---|---|---|---|"]
    for row in rows:
        figures = " / ".join(f"{row.reported[term] / 2**20:.2f}" for term in TERMS)
        ours = " / ".join(f"{row.error(term):+.1%}" for term in TERMS)
        theirs = " / ".join(f"{row.error(term, 'theirs'):+.1%}" for term in TERMS)
        lines.append(f"| {row.case.name} | `{' '.join(row.case.flags)}` | {figures} | {ours} | {theirs} |")
    return "\n".join(lines)


def worst(rows: list[Row], which: str = "ours") -> dict[str, float]:
    return {term: max(abs(row.error(term, which)) for row in rows) for term in TERMS}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        measured = [measure(case) for case in [*shipped_cases(), *constructed_cases(Path(folder))]]
    print(table(measured))
    print("worst |error|, swaplab:", {t: f"{e:.1%}" for t, e in worst(measured).items()})
    print("worst |error|, xllamacpp.memory:", {t: f"{e:.1%}" for t, e in worst(measured, "theirs").items()})
