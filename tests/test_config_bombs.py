"""Config files built to exhaust the loader (issue 21): each is a `FILE:LINE` fault, in seconds
and bounded memory, for `swaplab config check` and for a reload alike.

The CLI runs under `prlimit --as` (1 GiB of address space), so a bomb that is not stopped
ends in a MemoryError traceback instead of filling the machine; the timeout only bounds a
hang, nothing here asserts how long a refusal takes.
"""

from __future__ import annotations

import json
import os
import tracemalloc
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from procs import SIM, wait_until
from swaplab.config.yamltree import MAX_NODES, parse

ADDRESS_SPACE = 1 << 30
TIMEOUT = 60


def billion_laughs() -> bytes:
    """Nine lines, each a list of nine aliases of the line before: 9**9 values once expanded."""
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return ("\n".join(lines) + "\n").encode()


def doubling_macros() -> bytes:
    """Forty macros, each its predecessor twice: 2**41 characters once expanded."""
    lines = ["macros:", '  m0: "xx"'] + [f'  m{i}: "${{m{i - 1}}}${{m{i - 1}}}"' for i in range(1, 41)]
    lines += ["models:", "  a:", '    cmd: "echo ${m40}"']
    return ("\n".join(lines) + "\n").encode()


def many_copies_of_a_big_macro() -> bytes:
    """A 600 KiB macro used by 200 models: 120 MiB, each string under the per-string limit."""
    lines = ["macros:", f'  big: "{"y" * (600 << 10)}"', "models:"]
    lines += [f'  m{i}:\n    cmd: "echo ${{big}}"' for i in range(200)]
    return ("\n".join(lines) + "\n").encode()


def nested_aliases() -> bytes:
    """Three lines of 90 levels, each holding the one before: 270 levels once expanded."""
    return (
        f"a: &a {'[' * 90}{']' * 90}\nb: &b {'[' * 90}*a{']' * 90}\nc: {'[' * 90}*b{']' * 90}\n"
    ).encode()


BOMBS = {
    # name: (file contents, expected line, words of the fault)
    "billion laughs": (billion_laughs(), 5, "aliases expand past 50000 values"),
    "a flat list of 480 KB": (b"- 1\n" * 120_000, 50_000, "the config holds more than 50000 values"),
    "doubling macros": (doubling_macros(), 22, "macros.m20: macro '${m19}' expands it past 1 MiB"),
    "a big macro used everywhere": (many_copies_of_a_big_macro(), None, "passes 4 MiB in all"),
    "deep lists": (b"x: " + b"[" * 5000 + b"]" * 5000 + b"\n", 1, "values nest deeper than 100 levels"),
    "deep mappings": (b"x: " + b"{a: " * 5000 + b"1" + b"}" * 5000 + b"\n", 1, "values nest deeper than 100 levels"),
    "deep block mappings": (
        "".join("  " * level + "a:\n" for level in range(1000)).encode(), 100, "values nest deeper than 100 levels"
    ),
    "aliases nested deep": (nested_aliases(), 2, "aliases nest values deeper than 100 levels"),
    "a NUL byte": (b'models:\n  a:\n    cmd: "echo\x00"\n', 3, "the file is not text: a NUL byte"),
    "a control character": (b'models:\n  a:\n    cmd: "echo \x07"\n', 3, "the file is not text: character U+0007"),
    "invalid UTF-8": (b'models:\n  a:\n    cmd: "echo \xff\xfe"\n', 3, "the file is not UTF-8 text: byte 0xff"),
    "a binary file": (bytes(range(256)) * 4, 2, "the file is not UTF-8 text: byte 0x80"),
    "a long command": (f'models:\n  a:\n    cmd: "echo {"z" * (1 << 20)}"\n'.encode(), 3, "longer than 128 KiB"),
}


def check_bounded(config: Path) -> subprocess.CompletedProcess:
    """`swaplab config check FILE` in 1 GiB of address space."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        pytest.skip("prlimit (util-linux) is not installed")
    return subprocess.run(
        [prlimit, f"--as={ADDRESS_SPACE}", "--", sys.executable, "-m", "swaplab", "config", "check", str(config)],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


@pytest.mark.parametrize("name", BOMBS)
def test_a_bomb_is_a_fault_at_its_line(tmp_path, name):
    contents, line, words = BOMBS[name]
    config = tmp_path / "config.yaml"
    config.write_bytes(contents)
    result = check_bounded(config)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert result.returncode == 2, output[-3000:]
    faults = [text for text in output.splitlines() if text.startswith(f"{config}:")]
    assert any(words in fault for fault in faults), output[-3000:]
    if line is not None:
        assert any(fault.startswith(f"{config}:{line}: ") and words in fault for fault in faults), faults


def test_a_config_within_the_limits_loads(tmp_path):
    """The limits leave room: 100 levels, and aliases that expand to thousands of values."""
    nested = "[" * 96 + "]" * 96  # levels 5 to 100
    config = tmp_path / "config.yaml"
    config.write_text(
        f"models:\n  a:\n    cmd: echo\n    proxy: http://127.0.0.1:9\n    metadata:\n      deep: {nested}\n"
        "      list: &l [" + ",".join(["x"] * 50) + "]\n"
        "      lists: [" + ",".join(["*l"] * 50) + "]\n"
    )
    result = check_bounded(config)
    assert result.returncode == 0, result.stdout + result.stderr


def model_ids(router) -> list[str]:
    with urllib.request.urlopen(f"{router.url}/v1/models", timeout=10) as response:
        return sorted(entry["id"] for entry in json.load(response)["data"])


@pytest.mark.parametrize("name", ["deep lists", "doubling macros", "a NUL byte"])
def test_a_bomb_reloaded_is_refused_and_the_old_config_keeps_serving(router_factory, tmp_path, name):
    router = router_factory(f"models:\n  steady:\n    cmd: {SIM} --port ${{PORT}} --model steady\n")
    assert model_ids(router) == ["steady"]
    contents, line, words = BOMBS[name]
    config = tmp_path / "config.yaml"
    config.write_bytes(contents)
    router.signal(signal.SIGHUP)
    wait_until(lambda: "config reload refused" in router.output(), 60, "the refusal")
    assert f"{config}:{line}: " in router.output() and words in router.output(), router.output()[-3000:]
    assert "Traceback" not in router.output()
    assert model_ids(router) == ["steady"]


def test_an_endless_file_is_refused_at_its_first_line():
    result = check_bounded(Path("/dev/zero"))
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr
    assert "/dev/zero:1: the file is larger than 4 MiB" in result.stdout + result.stderr


@pytest.mark.parametrize("text", [
    "- 1\n" * 120_000,  # 480 KB: one flat list, a value a line
    "models: [" + ",".join(["1"] * 240_000) + "]\n",  # 480 KB on one line, under a key
])
def test_a_flat_list_of_480_kb_stops_at_the_value_past_the_budget_as_it_is_composed(text):
    """Refused while PyYAML composes, not composed whole and refused after (issue 38: 18 s and
    341 MB at the old budget of 250,000, which a list of 240,000 values did not reach)."""
    tracemalloc.start()
    try:
        parsed = parse(text, "flat.yaml")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parsed.root is None
    (fault,) = parsed.faults
    assert fault.message == f"the config holds more than {MAX_NODES} values"
    # The value past the budget: the list is value 1 (2 under `models`), so its item MAX_NODES (- 1) is.
    assert (fault.file, fault.line) == ("flat.yaml", MAX_NODES if text.startswith("-") else 1)
    assert peak < 64 << 20, f"{peak} bytes to refuse it"
