"""What llama.cpp says it allocated when it loads a model, read from its log.

At verbosity 4 (`-lv 4`) llama.cpp's server logs one line per buffer it allocates:

    load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
    llama_kv_cache:        CPU KV buffer size =    90.00 MiB
    llama_memory_recurrent:      CPU RS buffer size =     3.14 MiB
    llama_context:        CPU  output buffer size =     0.19 MiB
    llama_context:      CUDA0 compute buffer size =    47.01 MiB

`parse_load_log` gathers them into `Reported`: bytes per kind and buffer name. It is what
the estimator is measured against, and what the router records for a model it started
so that later estimates for that model use the measurement.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
