"""The grill's sandbox, attacked for real: each attack is stopped and the next run still works.

Every attack test is written so that it fails if the limit it proves were missing: the
allocation would succeed (Linux overcommits), the loop would run into the wall clock
instead of the CPU limit, the bounded fork count would reach its target.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from procs import wait_until

from swaplab.grill.sandbox import Limits, isolation, run_command, run_python

ROOT = os.geteuid() == 0
NAMESPACES = "namespaces" in isolation()


def still_works(tmp_path: Path) -> None:
    result = run_python("print('alive')", workdir=tmp_path / "after")
    assert result.ok, result
    assert result.stdout == "alive\n"


def test_isolation_is_reported(tmp_path):
    result = run_python("print(1)", workdir=tmp_path)
    assert result.isolation == isolation()
    assert "rlimits" in result.isolation
    if ROOT:
        assert "uid 65534" in result.isolation


def test_a_plain_run_sees_its_files_and_returns_its_changes(tmp_path):
    workdir = tmp_path / "work"
    (workdir / "package").mkdir(parents=True)
    (workdir / "package" / "helper.py").write_text("VALUE = 41\n")
    (workdir / "stale.txt").write_text("remove me")
    (workdir / "keep.txt").write_text("unchanged")
    script = (
        "import os, sys\n"
        "from package.helper import VALUE\n"
        "print(VALUE + 1, sys.stdin.read(), sys.argv[1:])\n"
        "os.remove('stale.txt')\n"
        "os.makedirs('made/deeper')\n"
        "open('made/deeper/out.txt', 'w').write('written')\n"
        "os.symlink('/etc/passwd', 'leak')\n"
        "print('oops', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    result = run_python(script, workdir=workdir, stdin="from stdin", args=["--flag"])
    assert result.returncode == 3 and not result.ok and result.stopped is None
    assert result.stdout == "42 from stdin ['--flag']\n"
    assert result.stderr == "oops\n"
    assert (workdir / "made" / "deeper" / "out.txt").read_text() == "written"
    assert (workdir / "keep.txt").read_text() == "unchanged"
    assert not (workdir / "stale.txt").exists()
    assert not (workdir / "leak").exists()  # a link the run made never comes back
    assert not (workdir / "sandbox_main.py").exists()


def test_the_environment_is_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPLAB_TEST_SECRET", "hunter2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    result = run_python("import json, os; print(json.dumps(dict(os.environ)))", workdir=tmp_path)
    assert result.ok, result
    assert "hunter2" not in result.stdout and "sk-secret" not in result.stdout
    environment = __import__("json").loads(result.stdout)
    assert set(environment) == {"PATH", "HOME", "TMPDIR", "LANG"}
    assert environment["HOME"] == environment["TMPDIR"] != str(Path.home())


def test_run_command_runs_any_program(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    result = run_command(["wc", "-l", "a.txt"], workdir=tmp_path)
    assert result.ok, result
    assert result.stdout.split()[0] == "2"
    missing = run_command(["no-such-program-here"], workdir=tmp_path)
    assert missing.returncode == 127 and "cannot run" in missing.stderr


def test_a_fork_bomb_is_stopped_and_leaves_nothing_behind(tmp_path):
    marker = f"bomb-{uuid.uuid4().hex}"
    # Catching the refusals keeps it forking until the wall clock: the worst kind.
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_python(bomb, workdir=tmp_path / "bomb", args=[marker], limits=Limits(cpu_seconds=5, wall_seconds=3))
    assert not result.ok
    assert result.stopped in ("timeout", "cpu")

    def none_left() -> bool:
        return not any(marker in " ".join(process.info["cmdline"] or ()) for process in psutil.process_iter(["cmdline"]))

    wait_until(none_left, 10, "every process of the fork bomb to be gone")
    still_works(tmp_path)


def test_the_process_limit_refuses_forks_beyond_it(tmp_path):
    # Without RLIMIT_NPROC all 60 children would start: the count proves the limit.
    script = (
        "import os, sys, time\n"
        "started = 0\n"
        "for _ in range(60):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except BlockingIOError:\n"
        "        print('refused after', started)\n"
        "        raise\n"
        "    if pid == 0:\n"
        "        time.sleep(30)  # each child holds its process slot while the parent forks more\n"
        "        os._exit(0)\n"
        "    started += 1\n"
        "print('started', started)\n"
    )
    result = run_python(script, workdir=tmp_path / "forks", limits=Limits(processes=8, wall_seconds=15))
    assert not result.ok
    assert result.stopped == "processes", result
    refused_after = int(result.stdout.split()[-1])
    assert refused_after < 8
    still_works(tmp_path)


def test_an_infinite_loop_is_stopped_by_the_cpu_limit(tmp_path):
    result = run_python("while True:\n    pass\n", workdir=tmp_path / "loop", limits=Limits(cpu_seconds=1, wall_seconds=30))
    assert not result.ok and not result.timed_out
    assert result.stopped == "cpu", result
    still_works(tmp_path)


def test_a_sleeper_is_stopped_by_the_wall_clock(tmp_path):
    # The sleeper is the scenario: only the wall-clock limit can end it.
    result = run_python("import time\ntime.sleep(60)\n", workdir=tmp_path / "sleep", limits=Limits(wall_seconds=1))
    assert result.timed_out and result.stopped == "timeout" and result.returncode is None
    still_works(tmp_path)


def test_a_10_gb_allocation_is_refused(tmp_path):
    # Linux overcommits: without the address-space limit this would succeed and print.
    script = "block = bytearray(10 * 1024 ** 3)\nprint('allocated', len(block))\n"
    result = run_python(script, workdir=tmp_path / "alloc")
    assert not result.ok
    assert result.stopped == "memory", result
    assert "allocated" not in result.stdout
    still_works(tmp_path)


@pytest.mark.skipif(not ROOT, reason="not root: the sandbox keeps the caller's uid, and isolation() says its files are writable")
def test_writing_to_the_home_directory_fails(tmp_path):
    home = Path.home()
    target = home / f"swaplab-sandbox-test-{uuid.uuid4().hex}.txt"
    script = f"open({str(target)!r}, 'w').write('escaped')\nprint('wrote it')\n"
    try:
        result = run_python(script, workdir=tmp_path / "home")
        assert not result.ok
        assert "PermissionError" in result.stderr, result
        assert "wrote it" not in result.stdout
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)
    still_works(tmp_path)


@pytest.mark.skipif(not ROOT, reason="not root: the sandbox keeps the caller's uid")
def test_the_system_is_not_writable(tmp_path):
    script = "open('/etc/swaplab-sandbox-test', 'w').write('x')\n"
    result = run_python(script, workdir=tmp_path / "etc")
    assert not result.ok and "PermissionError" in result.stderr
    assert not Path("/etc/swaplab-sandbox-test").exists()


@pytest.mark.skipif(not NAMESPACES, reason="no user+net namespaces here: the network stays open, as isolation() says")
def test_a_socket_reaches_nothing(tmp_path):
    received: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        listener.settimeout(0.2)
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                with connection:
                    received.append(connection.recv(1024) or b"(connected)")

        acceptor = threading.Thread(target=accept)
        acceptor.start()
        try:
            script = (
                "import socket\n"
                f"with socket.create_connection(('127.0.0.1', {port}), timeout=5) as sock:\n"
                "    sock.sendall(b'exfiltrated')\n"
                "print('sent')\n"
            )
            result = run_python(script, workdir=tmp_path / "net")
            # The same script from here reaches the listener: the test's listener works.
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"control")
            wait_until(lambda: received, 10, "the control connection to arrive")
        finally:
            stop.set()
            acceptor.join()
    assert not result.ok and "sent" not in result.stdout
    assert "OSError" in result.stderr, result
    assert received == [b"control"]
    still_works(tmp_path)


def test_output_is_capped(tmp_path):
    script = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 10000)\n"
    result = run_python(script, workdir=tmp_path / "out", limits=Limits(output_bytes=5000))
    assert result.ok, result.stderr
    assert result.stdout.startswith("x" * 5000)
    assert "output cut at 5000 of 1000000 bytes" in result.stdout


def test_a_file_beyond_the_size_limit_is_refused(tmp_path):
    script = "with open('big', 'wb') as file:\n    file.write(b'x' * 2_000_000)\nprint('written')\n"
    result = run_python(script, workdir=tmp_path / "big", limits=Limits(file_bytes=1_000_000))
    assert not result.ok
    assert result.stopped == "file size", result
    assert "written" not in result.stdout
    still_works(tmp_path)
