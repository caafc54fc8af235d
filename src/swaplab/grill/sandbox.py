"""Running code a model wrote: its own processes, limits, a throwaway directory, no network where possible.

Every run goes through the same chain:

    [unshare --user --net --pid --mount --mount-proc --fork --kill-child]   (when the machine allows it)
      python -E -s -c BOOT   (pid 1 of the run: sets the rlimits, starts the command, reaps, reports)
        the command          (the candidate: `python -E -s script.py`, or any argv)

- The chain starts as an unprivileged uid (65534, "nobody") when swaplab runs as root:
  RLIMIT_NPROC does nothing for root, and root could write anywhere. Not root, it keeps
  the caller's uid (said in the isolation report: the caller's files are then writable).
- rlimits: CPU seconds (SIGXCPU, then SIGKILL a second later), address space, file
  size (stdout and stderr included), process count, no core files.
- The user namespace makes the net namespace possible without privileges (only a
  loopback, down: no network at all) and the pid namespace makes every process of the
  run die with it: nothing a fork bomb started survives the run, even what left the
  process group.
- A wall-clock timeout kills the whole process group (and so the namespace).
- The run happens in a fresh temporary directory holding a copy of `workdir` (the
  sandbox uid must be able to reach it; a pytest tmp_path under /tmp/pytest-of-root is
  not reachable by nobody). What the run leaves there comes back to `workdir` after it
  (regular files and directories; links and devices never). HOME and TMPDIR point to it,
  and the environment holds nothing else but PATH and LANG.
- Output beyond `output_bytes` per stream is cut (and the file-size limit stops a
  candidate that writes more than `file_bytes` to it).
- Not more runs at once than the machine has cores.

World-writable places (/tmp, /var/tmp, /dev/shm) stay writable by the sandbox uid:
a mount namespace could hide them, but the candidate would then need to be kept from
unmounting them, which takes capability surgery this module doesn't do.
"""

from __future__ import annotations

import functools
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from swaplab.errors import SwaplabError

SANDBOX_UID = 65534  # "nobody" on Debian, Ubuntu, Fedora and Alpine alike
SANDBOX_GID = 65534
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
SCRIPT_NAME = "sandbox_main.py"
# python -I minus -P: environment and user site ignored, but the script's directory stays
# on sys.path, so a test file can import the module next to it.
PYTHON_FLAGS = ("-E", "-s")
NAMESPACE_OPTIONS = (
    "--user", "--net", "--pid", "--mount", "--mount-proc", "--fork", "--kill-child",
)

# pid 1 of the run. It must not be the candidate: pid 1 of a pid namespace ignores every
# signal it has no handler for, SIGXCPU and SIGXFSZ included. It writes how the command
# ended to the status pipe as JSON and exits.
BOOT = r"""
import json, os, resource, sys
spec = json.loads(sys.argv[1])
command = sys.argv[2:]
status_fd = spec["status_fd"]
os.set_inheritable(status_fd, False)
for name, soft, hard in spec["limits"]:
    resource.setrlimit(getattr(resource, name), (soft, hard))
child = os.fork()
if child == 0:
    try:
        os.execvp(command[0], command)
    except OSError as error:
        os.write(2, ("sandbox: cannot run %s: %s\n" % (command[0], error)).encode())
    os._exit(127)
while True:
    pid, status, usage = os.wait4(-1, 0)
    if pid == child:
        break
report = {"status": status, "cpu_seconds": usage.ru_utime + usage.ru_stime}
os.write(status_fd, json.dumps(report).encode())
os._exit(0)
"""


class SandboxUnavailableError(SwaplabError):
    """This machine cannot run candidate code safely."""


@dataclass(frozen=True)
class Limits:
    """What one run may use."""

    cpu_seconds: float = 10
    memory_bytes: int = 1 << 30  # address space
    file_bytes: int = 16 << 20  # largest file it may write (stdout and stderr too)
    processes: int = 32  # processes (threads count) of the sandbox uid in the run
    wall_seconds: float = 20
    output_bytes: int = 64 << 10  # kept of stdout and of stderr each


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended."""

    returncode: int | None  # negative: killed by that signal; None: it never reported (timed out)
    stdout: str
    stderr: str
    timed_out: bool
    stopped: str | None  # why a limit stopped it: "timeout", "cpu", "memory", "processes", "file size", "signal N"
    isolation: str  # what was in force, from `isolation()`

    @property
    def ok(self) -> bool:
        """It exited 0 and no limit stopped it."""
        return self.returncode == 0 and self.stopped is None


@dataclass(frozen=True)
class _Setup:
    """How runs are started on this machine, found once by trying."""

    namespaces: bool
    uid: int | None  # the uid to drop to; None: keep the caller's
    gid: int | None
    python: str
    description: str


def isolation() -> str:
    """What isolation runs get on this machine, in words for the report."""
    return _setup().description


def sandbox_python() -> str:
    """The interpreter candidates run under: this one, unless the sandbox uid can't reach it."""
    return _setup().python


def run_python(
    script: str,
    *,
    workdir: Path,
    limits: Limits = Limits(),
    stdin: str | None = None,
    args: Sequence[str] = (),
) -> SandboxResult:
    """Run `script` with the sandbox's Python, in the sandbox's copy of `workdir`.

    The script is written next to the workdir's files as `sandbox_main.py` (it does not come
    back to `workdir`); its directory is on sys.path.
    """
    setup = _setup()
    return _run([setup.python, *PYTHON_FLAGS, SCRIPT_NAME, *args], workdir, limits, stdin, script)


def run_command(argv: Sequence[str], *, workdir: Path, limits: Limits = Limits(), stdin: str | None = None) -> SandboxResult:
    """Run `argv` (searched on PATH=/usr/local/bin:/usr/bin:/bin) in the sandbox's copy of `workdir`."""
    if not argv:
        raise ValueError("run_command needs a command")
    return _run(list(argv), workdir, limits, stdin, None)


# -- running ----------------------------------------------------------------------------

_slots = threading.BoundedSemaphore(os.cpu_count() or 1)


def _run(command: list[str], workdir: Path, limits: Limits, stdin: str | None, script: str | None) -> SandboxResult:
    setup = _setup()
    with _slots:
        return _run_once(setup, command, Path(workdir), limits, stdin, script)


def _run_once(
    setup: _Setup, command: list[str], workdir: Path, limits: Limits, stdin: str | None, script: str | None
) -> SandboxResult:
    workdir.mkdir(parents=True, exist_ok=True)
    # Output files and the status pipe live where only we can reach them; the run gets fds.
    private = Path(tempfile.mkdtemp(prefix="swaplab-sandbox-io-"))
    rundir = Path(tempfile.mkdtemp(prefix="swaplab-sandbox-"))
    try:
        copied = _copy_in(workdir, rundir)
        if script is not None:
            (rundir / SCRIPT_NAME).write_text(script)
        if setup.uid is not None:
            _hand_over(rundir, setup.uid, setup.gid)
        stdout_path, stderr_path = private / "stdout", private / "stderr"
        stdin_path = private / "stdin"
        stdin_path.write_text(stdin or "")
        outcome = _execute(setup, command, rundir, limits, stdin_path, stdout_path, stderr_path)
        stdout = _read_capped(stdout_path, limits.output_bytes)
        stderr = _read_capped(stderr_path, limits.output_bytes)
        _sync_back(rundir, workdir, copied, skip=SCRIPT_NAME if script is not None else None)
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    returncode, timed_out, report = outcome
    return SandboxResult(
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        stopped=_why_stopped(returncode, timed_out, report, stderr, limits),
        isolation=setup.description,
    )


def _execute(
    setup: _Setup, command: list[str], rundir: Path, limits: Limits, stdin_path: Path, stdout_path: Path, stderr_path: Path
) -> tuple[int | None, bool, dict]:
    """Start the chain, wait for it (or the wall clock), kill what is left: (returncode, timed_out, report)."""
    status_read, status_write = os.pipe()
    spec = {"status_fd": status_write, "limits": _rlimits(limits)}
    chain = [setup.python, *PYTHON_FLAGS, "-c", BOOT, json.dumps(spec), *command]
    if setup.namespaces:
        chain = [_unshare(), *NAMESPACE_OPTIONS, *_identity_map(setup), "--", *chain]
    environment = {"PATH": SAFE_PATH, "HOME": str(rundir), "TMPDIR": str(rundir), "LANG": "C.UTF-8"}
    identity = {} if setup.uid is None else {"user": setup.uid, "group": setup.gid, "extra_groups": []}
    try:
        with open(stdin_path, "rb") as stdin, open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                chain, cwd=rundir, env=environment, stdin=stdin, stdout=stdout, stderr=stderr,
                pass_fds=(status_write,), start_new_session=True, **identity,
            )
    finally:
        os.close(status_write)
    with os.fdopen(status_read, "rb") as status_pipe:
        timed_out = not _wait_exit(process.pid, limits.wall_seconds)
        # The leader is not reaped yet, so its process group id can't have been reused:
        # killing the group now reaches only what the run started.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        raw = status_pipe.read()
    try:
        report = json.loads(raw) if raw else {}
    except ValueError:
        report = {}
    returncode = os.waitstatus_to_exitcode(report["status"]) if "status" in report else None
    if timed_out:
        returncode = None
    return returncode, timed_out, report


def _wait_exit(pid: int, seconds: float) -> bool:
    """Wait for `pid` to exit without reaping it; False when `seconds` passed first."""
    descriptor = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([descriptor], [], [], seconds)
        return bool(ready)
    finally:
        os.close(descriptor)


def _rlimits(limits: Limits) -> list[tuple[str, int, int]]:
    cpu = max(1, math.ceil(limits.cpu_seconds))
    return [
        ("RLIMIT_CPU", cpu, cpu + 1),  # SIGXCPU first, SIGKILL a second later if it is caught
        ("RLIMIT_AS", limits.memory_bytes, limits.memory_bytes),
        ("RLIMIT_FSIZE", limits.file_bytes, limits.file_bytes),
        ("RLIMIT_NPROC", limits.processes, limits.processes),
        ("RLIMIT_CORE", 0, 0),
    ]


def _why_stopped(returncode: int | None, timed_out: bool, report: dict, stderr: str, limits: Limits) -> str | None:
    if timed_out:
        return "timeout"
    if returncode is None:
        return "lost"  # the run's pid 1 died without reporting: killed from outside
    if returncode < 0:
        number = -returncode
        if number == signal.SIGXCPU or (number == signal.SIGKILL and report.get("cpu_seconds", 0) >= limits.cpu_seconds):
            return "cpu"
        if number == signal.SIGXFSZ:
            return "file size"
        return f"signal {number}"
    if returncode != 0:
        # A limit met inside Python surfaces as an exception, not a signal; its last line says which.
        last = stderr.rstrip().rsplit("\n", 1)[-1]
        if last.startswith("MemoryError"):
            return "memory"
        if last.startswith("BlockingIOError") and "Resource temporarily unavailable" in last:
            return "processes"  # fork() or thread start refused by RLIMIT_NPROC
        if "File too large" in last:
            return "file size"
    return None


def _read_capped(path: Path, limit: int) -> str:
    size = path.stat().st_size
    with open(path, "rb") as file:
        data = file.read(limit)
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        text += f"\n[sandbox: output cut at {limit} of {size} bytes]\n"
    return text


# -- the run's directory ----------------------------------------------------------------


def _real_entries(root: Path) -> Iterator[tuple[str, Path, bool]]:
    """Every directory and regular file under root, top-down: (relative path, path, is a directory).

    Links are neither listed nor followed, nor is anything that is not a regular file
    (fifos, devices): only what is really under root travels in or out of a run. A
    directory comes before what it holds, so a caller can create it first.
    """
    for directory, subdirectories, files in os.walk(root):
        relative = os.path.relpath(directory, root)
        subdirectories[:] = [name for name in subdirectories if not os.path.islink(os.path.join(directory, name))]
        for name in subdirectories:
            yield os.path.normpath(os.path.join(relative, name)), Path(directory, name), True
        for name in files:
            source = Path(directory, name)
            if source.is_symlink() or not source.is_file():
                continue
            yield os.path.normpath(os.path.join(relative, name)), source, False


def _copy_in(workdir: Path, rundir: Path) -> set[str]:
    """Copy workdir's regular files and directories into rundir; their relative paths."""
    copied: set[str] = set()
    for path, source, is_directory in _real_entries(workdir):
        if is_directory:
            os.mkdir(rundir / path)
        else:
            shutil.copy2(source, rundir / path, follow_symlinks=False)
        copied.add(path)
    return copied


def _hand_over(rundir: Path, uid: int, gid: int) -> None:
    """Make the run's directory the sandbox uid's (lchown: never through a link)."""
    os.chown(rundir, uid, gid)
    for directory, subdirectories, files in os.walk(rundir):
        for name in subdirectories + files:
            os.chown(os.path.join(directory, name), uid, gid, follow_symlinks=False)


def _sync_back(rundir: Path, workdir: Path, copied: set[str], skip: str | None) -> None:
    """What the run left in rundir becomes workdir's: new and changed files, removals.

    Only regular files and directories travel; a link the run made is never followed
    (we run as root here, the run did not). Everything in the run is dead by now.
    """
    present: set[str] = set()
    for path, source, is_directory in _real_entries(rundir):
        target = workdir / path
        if is_directory:
            if not target.is_symlink():
                target.mkdir(exist_ok=True)
                present.add(path)
            continue
        if path == skip or target.is_symlink() or not target.parent.is_dir():
            continue
        present.add(path)
        if target.is_file() and _same_content(source, target):
            continue
        _copy_file_no_follow(source, target)
    for path in sorted(copied - present, reverse=True):  # children before their directories
        target = workdir / path
        if target.is_symlink():
            continue
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()


def _same_content(first: Path, second: Path) -> bool:
    if first.stat().st_size != second.stat().st_size:
        return False
    return first.read_bytes() == second.read_bytes()


def _copy_file_no_follow(source: Path, target: Path) -> None:
    descriptor = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as reader, open(target, "wb") as writer:
        shutil.copyfileobj(reader, writer)
    os.chmod(target, os.stat(source, follow_symlinks=False).st_mode & 0o755)


# -- what this machine allows -----------------------------------------------------------


@functools.cache
def _unshare() -> str | None:
    return shutil.which("unshare", path=SAFE_PATH)


def _identity_map(setup: _Setup) -> list[str]:
    # Inside the namespace the run keeps the uid it has outside (nobody, or the caller):
    # mapped to root it would hold capabilities there, enough to mount over what we set up.
    uid = setup.uid if setup.uid is not None else os.getuid()
    gid = setup.gid if setup.gid is not None else os.getgid()
    return [f"--map-user={uid}", f"--map-group={gid}"]


_setup_lock = threading.Lock()
_found: _Setup | None = None


def _setup() -> _Setup:
    global _found
    with _setup_lock:
        if _found is None:
            _found = _find_setup()
        return _found


def _find_setup() -> _Setup:
    """Try the strongest chain first; the first that runs a trivial Python is the one."""
    root = os.geteuid() == 0
    uid, gid = (SANDBOX_UID, SANDBOX_GID) if root else (None, None)
    pythons = [sys.executable, *(path for path in ("/usr/bin/python3", shutil.which("python3", path=SAFE_PATH)) if path)]
    pythons = list(dict.fromkeys(pythons))
    probe_limits = Limits(cpu_seconds=10, wall_seconds=30)
    tried: list[str] = []
    for namespaces in ((True, False) if _unshare() else (False,)):
        for python in pythons:
            candidate = _Setup(namespaces, uid, gid, python, _describe(namespaces, uid, python))
            result = _probe(candidate, python, probe_limits)
            if result.ok and result.stdout.strip() == "ok":
                return candidate
            tried.append(f"{candidate.description}: {(result.stderr or result.stdout).strip()[-200:] or result.stopped}")
    raise SandboxUnavailableError(
        "no way to run candidate code here: " + "; ".join(tried)
        + (" (as root the sandbox runs as uid 65534, which must be able to run a Python >= 3.11:"
           " install python3, or run swaplab as an ordinary user)" if root else "")
    )


def _probe(candidate: _Setup, python: str, limits: Limits) -> SandboxResult:
    check = "import sys; assert sys.version_info >= (3, 11), sys.version; print('ok')"
    with tempfile.TemporaryDirectory(prefix="swaplab-sandbox-probe-") as workdir:
        return _run_once(candidate, [python, *PYTHON_FLAGS, "-c", check], Path(workdir), limits, None, None)


def _describe(namespaces: bool, uid: int | None, python: str) -> str:
    parts = ["user+net+pid+mount namespaces (no network)"] if namespaces else []
    parts.append(f"uid {uid}" if uid is not None else "the caller's uid (its files are writable)")
    parts.append("rlimits (cpu, memory, file size, processes)")
    if not namespaces:
        parts.append("network open (unshare unavailable)")
    if python != sys.executable:
        parts.append(f"python {python}")
    return ", ".join(parts)
