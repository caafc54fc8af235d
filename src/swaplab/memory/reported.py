"""What llama.cpp says it allocated when it loads a model, read from its log.

At verbosity 4 (`-lv 4`) llama.cpp's server logs one line per buffer it allocates:

    load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
    llama_kv_cache:        CPU KV buffer size =    90.00 MiB
    llama_memory_recurrent:      CPU RS buffer size =     3.14 MiB
    llama_context:        CPU  output buffer size =     0.19 MiB
    llama_context:      CUDA0 compute buffer size =    47.01 MiB

`parse_load_log` gathers them into `Reported`: bytes per kind and buffer name. It is what
the estimator is measured against.

vLLM and SGLang state theirs too, per GPU, in the lines their contracts list under
`memory.reports` ("Model loading took 15.27 GiB memory ...", "KV Cache is allocated. ...,
K size: 22.57 GB, V size: 22.57 GB"). `parse_engine_log` reads them into `EngineReported`,
which the fleet records beside a model's estimated claim once it is ready.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from swaplab.engines import contract
from swaplab.memory.flags import engine_of

MIB = 1024 * 1024

_BUFFER = re.compile(r"\b(?P<buffer>[A-Za-z0-9_]+)\s+(?P<kind>model|KV|RS|compute|output) buffer size\s*=\s*(?P<mib>[0-9.]+) MiB")
KINDS = {"model": "weights", "KV": "kv", "RS": "recurrent", "compute": "compute", "output": "output"}


@dataclass
class Reported:
    """Bytes llama.cpp reported, by kind ("weights", "kv", "recurrent", "compute", "output"),
    then by buffer name ("CPU_Mapped", "CUDA0", "CUDA_Host"...)."""

    buffers: dict[str, dict[str, int]] = field(default_factory=dict)

    def total(self, kind: str) -> int:
        return sum(self.buffers.get(kind, {}).values())

    @property
    def empty(self) -> bool:
        return not self.buffers


def parse_load_log(lines: Iterable[str]) -> Reported:
    """The buffer sizes in one load's log. Every model, KV, RS and output line is an
    allocation of its own (a sliding-window model has two KV caches on one device, a split
    GGUF one mapped buffer per file), so they add up; a compute buffer reserved again
    keeps its last figure."""
    reported = Reported()
    for line in lines:
        match = _BUFFER.search(line)
        if match is None:
            continue
        kind = KINDS[match.group("kind")]
        size = round(float(match.group("mib")) * MIB)
        buffers = reported.buffers.setdefault(kind, {})
        name = match.group("buffer")
        buffers[name] = size if kind == "compute" else buffers.get(name, 0) + size
    return reported


def report_of_load(argv: Sequence[str], timeout: float = 120.0) -> tuple[Reported, list[str]]:
    """Start a llama.cpp server (`argv`, which should carry `-lv 4`), read its output until it
    listens, stop it, and return what it reported with the lines it printed. For the tests
    and benchmarks/memory.py that hold the estimator to llama.cpp's figures."""
    process = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        start_new_session=True,
    )
    lines: list[str] = []
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if "server is listening" in line or "main: model loaded" in line:
                break
    finally:
        timer.cancel()
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if not any("server is listening" in line or "model loaded" in line for line in lines):
        tail = "\n".join(lines[-15:])
        raise RuntimeError(f"{argv[0]} did not finish loading (exit {process.returncode}):\n{tail}")
    return parse_load_log(lines), lines


# -- vLLM and SGLang -----------------------------------------------------------------

_GRAPHS = ("cuda_graph_gib", "decode_graph_gib")
"""The figures of CUDA graph memory: vLLM's one capture, SGLang's decode graphs. SGLang's
prefill capture line is left out: its contract's `meaning` names one field fewer than the
line has (no capture name), so its `prefill_graph_gib` would read the seconds."""


@dataclass(frozen=True)
class EngineReported:
    """The figures a vLLM or SGLang start printed (GiB per GPU, and token counts), by the names
    its contract's `memory.reports` give them; a figure printed again (by each rank, or as a
    cache grows) keeps its last value."""

    engine: str
    figures: dict[str, float]

    @property
    def weights_gib(self) -> float | None:
        return self.figures.get("weights_gib")

    @property
    def kv_gib(self) -> float | None:
        """The KV cache: vLLM's final size (else the budget it reserved), SGLang's K + V."""
        figures = self.figures
        if "kv_gib" in figures:
            return figures["kv_gib"]
        if "k_gib" in figures:
            return figures["k_gib"] + figures.get("v_gib", 0.0)
        return figures.get("kv_budget_gib")

    @property
    def graphs_gib(self) -> float:
        return sum(self.figures.get(name, 0.0) for name in _GRAPHS)

    @property
    def held_gib(self) -> float | None:
        """Weights + KV + CUDA graphs on each GPU, where the weights and the KV cache were stated."""
        if self.weights_gib is None or self.kv_gib is None:
            return None
        return self.weights_gib + self.kv_gib + self.graphs_gib

    def summary(self) -> str:
        """The figures as arithmetic, e.g. "weights 15.27 + KV 56.63 + CUDA graphs 0.54 = 72.44 GiB per GPU"."""
        name = contract(self.engine).name
        tokens = self.figures.get("kv_tokens")
        pool = f" ({tokens:,.0f} KV tokens)" if tokens else ""
        if self.held_gib is None:
            known = ", ".join(f"{key} {value:g}" for key, value in self.figures.items())
            return f"{name} reported {known}"
        graphs = f" + CUDA graphs {self.graphs_gib:.2f}" if self.graphs_gib else ""
        return (f"{name} reported weights {self.weights_gib:.2f} + KV {self.kv_gib:.2f}{graphs} = "
                f"{self.held_gib:.2f} GiB per GPU{pool}")


def parse_engine_log(engine: str, lines: Iterable[str]) -> EngineReported:
    """The figures in a vLLM or SGLang start's output, read with its contract's report patterns."""
    patterns = [report.pattern() for report in contract(engine).memory.reports]
    figures: dict[str, float] = {}
    for line in lines:
        for pattern in patterns:
            found = pattern.search(line)
            if found is None:
                continue
            for name, text in found.groupdict().items():
                try:
                    figures[name] = float(text.replace(",", ""))
                except ValueError:  # a figure the line left empty
                    continue
    return EngineReported(engine, figures)


def engine_said(argv: Sequence[str], lines: Iterable[str]) -> str | None:
    """What a vLLM or SGLang command's start said it allocated, in words; None for another
    engine, or an output without its figures."""
    engine = engine_of(argv)
    if engine is None:
        return None
    reported = parse_engine_log(engine, lines)
    return reported.summary() if reported.figures else None
