"""The agent suite's tools over a throwaway workspace: list_dir, read_file, write_file, run_tests, run_python.

Every path a model gives is resolved inside the workspace (symlinks followed); one
that lands outside (`../x`, `/etc/passwd`) is refused with a tool error and nothing
runs. Code (run_tests, run_python) runs through the grill's sandbox with the
workspace as its directory. Tool errors go back to the model as the call's result:
a bad call costs a step, never the run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swaplab.grill.sandbox import (
    PYTHON_FLAGS,
    Limits,
    SandboxResult,
    run_command,
    sandbox_python,
)

# What one tool result may hand back to the model: its head and tail are kept.
MAX_RESULT_CHARS = 8000
MAX_LISTED = 200
# Code goes to the interpreter as one argument (`-c`); Linux caps one at 128 KiB.
MAX_CODE_CHARS = 100_000
IGNORED_PARTS = frozenset({"__pycache__", ".pytest_cache"})

# Runs the workspace's tests without pytest (which the grill's machine may lack): every
# top-level `test_*` function of every `test_*.py` file under the given paths.
TEST_RUNNER = r'''
import importlib.util, os, sys, traceback
from pathlib import Path
sys.path.insert(0, os.getcwd())
here = os.getcwd() + os.sep


def report(error):
    # The test's own frames (not this runner's, not importlib's), paths relative to the workspace.
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith("<")]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames[-4:]))
    text += "".join(traceback.format_exception_only(type(error), error))
    print(text.replace(here, "").rstrip())

targets = sys.argv[1:] or ["."]
files, missing = [], []
for target in targets:
    path = Path(target)
    if path.is_dir():
        files += sorted(p for p in path.rglob("test_*.py") if "__pycache__" not in p.parts)
    elif path.is_file():
        files.append(path)
    else:
        missing.append(target)
passed = failed = 0
for name in missing:
    print(f"{name}: no such file or directory")
    failed += 1
for number, path in enumerate(files):
    spec = importlib.util.spec_from_file_location(f"_swaplab_test_{number}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as error:
        print(f"{path}: ERROR while importing")
        report(error)
        failed += 1
        continue
    for name, test in list(vars(module).items()):
        if not (name.startswith("test") and callable(test)) or getattr(test, "__module__", None) != spec.name:
            continue
        try:
            test()
        except BaseException as error:
            print(f"{path}::{name} FAILED")
            report(error)
            failed += 1
        else:
            print(f"{path}::{name} passed")
            passed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(0 if passed and not failed else 1)
'''


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_PATH = {"type": "string", "description": "a path relative to the workspace root"}
TOOL_SCHEMAS: list[dict[str, Any]] = [
    _function(
        "list_dir",
        "List the files under a directory of the workspace (recursively), with their sizes.",
        {"path": {"type": "string", "description": "a directory relative to the workspace root (default: the root)"}},
        [],
    ),
    _function("read_file", "Read a text file of the workspace.", {"path": _PATH}, ["path"]),
    _function(
        "write_file",
        "Write a text file of the workspace, replacing it whole (parent directories are created).",
        {"path": _PATH, "content": {"type": "string", "description": "the file's complete new content"}},
        ["path", "content"],
    ),
    _function(
        "run_tests",
        "Run the workspace's tests: every top-level test_* function in test_*.py files (plain asserts, "
        "no fixtures). Returns each test's result and the failures' tracebacks.",
        {"path": {"type": "string", "description": "a test file or directory (default: the whole workspace)"}},
        [],
    ),
    _function(
        "run_python",
        "Run Python code with the workspace as the current directory (its modules importable); "
        "returns the exit status, stdout and stderr. No network.",
        {"code": {"type": "string", "description": "the Python source to run"}},
        ["code"],
    ),
]
TOOL_NAMES = tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS)


class ToolError(Exception):
    """A call a tool refuses (a path outside the workspace, bad arguments); the message goes to the model."""


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool with its arguments, as a model (or a reference trajectory) makes it."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, name: str, arguments: str) -> ToolCall:
        """A call as the server sent it (arguments as JSON text); raises ToolError when they don't parse."""
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError as error:
            raise ToolError(f"the arguments are not valid JSON ({error}); send a JSON object") from None
        if not isinstance(parsed, dict):
            raise ToolError("the arguments must be a JSON object")
        return cls(name, parsed)

    def key(self) -> str:
        """The call's identity for loop detection: its name and its arguments, canonically."""
        return f"{self.name} {json.dumps(self.arguments, sort_keys=True)}"


@dataclass(frozen=True)
class ToolResult:
    """What a call hands back to the model; `error` when the tool refused or failed."""

    text: str
    error: bool = False


class Workspace:
    """A directory the agent works in; every path it is given must stay inside it."""

    def __init__(self, root: Path, limits: Limits | None = None):
        self.root = root.resolve()
        self.limits = limits or Limits()

    @classmethod
    def create(cls, root: Path, files: Mapping[str, str], limits: Limits | None = None) -> Workspace:
        """A workspace at `root` holding `files` (relative path -> text)."""
        workspace = cls(root, limits)
        for relative, text in files.items():
            path = workspace.resolve(relative)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return workspace

    def resolve(self, path: Any) -> Path:
        """The absolute path for `path`, or ToolError when it is not a string or leads outside the workspace."""
        if not isinstance(path, str) or not path.strip():
            raise ToolError("'path' must be a non-empty string")
        if "\x00" in path:
            raise ToolError("'path' must not contain a NUL character")
        resolved = (self.root / path).resolve()  # an absolute `path` replaces the root: checked below
        if resolved != self.root and self.root not in resolved.parents:
            raise ToolError(f"{path!r} is outside the workspace; use a path relative to the workspace root")
        return resolved

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def files(self) -> list[Path]:
        """Every file of the workspace, sorted, caches left out."""
        return sorted(
            path for path in self.root.rglob("*")
            if path.is_file() and not IGNORED_PARTS & set(path.relative_to(self.root).parts)
        )

    def snapshot(self) -> dict[str, str]:
        """Each file's relative path and content digest: two equal snapshots mean nothing changed."""
        return {self.relative(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in self.files()}

    def execute(self, call: ToolCall) -> ToolResult:
        """Carry out one call; refusals and failures come back as error results, never as exceptions."""
        handler = _HANDLERS.get(call.name)
        if handler is None:
            return ToolResult(f"error: there is no tool {call.name!r}; the tools are {', '.join(TOOL_NAMES)}", True)
        try:
            return handler(self, call.arguments)
        except ToolError as error:
            return ToolResult(f"error: {error}", True)

    # -- the tools -------------------------------------------------------------

    def list_dir(self, arguments: Mapping[str, Any]) -> ToolResult:
        directory = self.resolve(arguments.get("path") or ".")
        if not directory.exists():
            raise ToolError(f"{arguments.get('path')!r} does not exist")
        if not directory.is_dir():
            raise ToolError(f"{arguments.get('path')!r} is a file; read it with read_file")
        entries = [path for path in self.files() if directory in path.parents]
        lines = [f"{self.relative(path)} ({path.stat().st_size} bytes)" for path in entries[:MAX_LISTED]]
        if len(entries) > MAX_LISTED:
            lines.append(f"... and {len(entries) - MAX_LISTED} more files")
        return ToolResult("\n".join(lines) if lines else "(no files)")

    def read_file(self, arguments: Mapping[str, Any]) -> ToolResult:
        path = self.resolve(arguments.get("path"))
        if not path.is_file():
            raise ToolError(f"{arguments.get('path')!r} is not a file" + (" (it is a directory)" if path.is_dir() else ""))
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise ToolError(f"{arguments.get('path')!r} is not UTF-8 text") from None
        return ToolResult(clip(text))

    def write_file(self, arguments: Mapping[str, Any]) -> ToolResult:
        path = self.resolve(arguments.get("path"))
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ToolError("'content' must be a string: the file's whole new text")
        if path.is_dir():
            raise ToolError(f"{arguments.get('path')!r} is a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return ToolResult(f"wrote {len(content.encode())} bytes to {self.relative(path)}")

    def run_tests(self, arguments: Mapping[str, Any]) -> ToolResult:
        targets = []
        if arguments.get("path"):
            targets.append(self.relative(self.resolve(arguments["path"])))
        return ToolResult(describe_run(self.run(test_command(targets))))

    def run_python(self, arguments: Mapping[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError("'code' must be a string of Python source")
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"the code is {len(code)} characters; at most {MAX_CODE_CHARS}: write it to a file first")
        # -c puts the current directory first on sys.path: the workspace's modules import.
        result = self.run([sandbox_python(), *PYTHON_FLAGS, "-B", "-c", code])
        return ToolResult(describe_run(result), error=not result.ok)

    def run(self, argv: list[str]) -> SandboxResult:
        """A command in the sandbox, in the workspace."""
        return run_command(argv, workdir=self.root, limits=self.limits)


_HANDLERS = {
    "list_dir": Workspace.list_dir,
    "read_file": Workspace.read_file,
    "write_file": Workspace.write_file,
    "run_tests": Workspace.run_tests,
    "run_python": Workspace.run_python,
}


def test_command(targets: list[str]) -> list[str]:
    """The test runner over `targets` (relative paths; none: everything): what run_tests and the checks run."""
    return [sandbox_python(), *PYTHON_FLAGS, "-B", "-c", TEST_RUNNER, *targets]


def describe_run(result: SandboxResult) -> str:
    """A sandboxed run as the model reads it: exit status or why it was stopped, then its output."""
    if result.stopped:
        head = f"stopped by the sandbox: {result.stopped}"
    else:
        head = f"exit status {result.returncode}"
    parts = [head]
    if result.stdout:
        parts.append(f"stdout:\n{result.stdout.rstrip()}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr.rstrip()}")
    return clip("\n".join(parts))


def clip(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """`text`, or its head and tail with a note of what was cut when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
