"""Commands on a cluster's nodes, through the user's own `ssh` client.

Everything goes through the `ssh` binary, so the user's `~/.ssh/config`, agent, jump hosts
and known_hosts keep working as they do in a terminal. One ControlMaster connection per
host is shared by every command (`ControlPersist` keeps it for the next swaplab command).

The remote side of ssh always hands the command to the login shell as one string; every
argv sent here is quoted with `shlex.join`, and the small node-side programs below are
constant `sh -c` scripts that receive untrusted values only as positional parameters.

A rank runs detached on its node (`setsid`, output to a file, pid file next to it) so it
outlives the ssh session that started it; its output is followed back by a small loop
which ends by itself once the rank has ended and all its output was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from swaplab.errors import SwaplabError
from swaplab.launch.cluster import Cluster, Host

CONNECT_TIMEOUT_SECONDS = 15
# The shared connection outlives one command by this much, so `up` then `status` or `logs`
# reuse it; ssh closes it afterwards on its own.
CONTROL_PERSIST_SECONDS = 120
SSH_EXIT_CONNECTION_FAILED = 255


class RemoteError(SwaplabError):
    """A node could not be reached over ssh, or a command on it failed."""


@dataclass(frozen=True)
class SshTarget:
    """How to reach one node: what `ssh` is given (its ~/.ssh/config resolves the rest)."""

    destination: str
    port: int | None = None
    user: str | None = None
    options: tuple[str, ...] = ()  # extra `-o KEY=VALUE` options, from the clusters file

    def __str__(self) -> str:
        return self.destination


def target_for(cluster: Cluster, host: Host) -> SshTarget:
    """How to reach `host` of `cluster`."""
    return SshTarget(host.name, port=host.ssh_port, user=cluster.user, options=cluster.ssh_options)


@dataclass(frozen=True)
class Completed:
    """A finished remote command."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def control_directory() -> Path:
    """Where the ControlMaster sockets live: short (sockets paths are limited to ~104 bytes), private."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else Path(tempfile.gettempdir())
    directory = base / f"swaplab-ssh-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def ssh_argv(target: SshTarget, remote_argv: Sequence[str] | None = None, *, control: Sequence[str] = ()) -> list[str]:
    """The local `ssh` command line that runs `remote_argv` on `target` (pure but for the socket folder).

    The cluster's own options come first: for `-o`, ssh keeps the first value it sees,
    so a clusters file can override any default set here.
    """
    argv = ["ssh"]
    for option in target.options:
        argv += ["-o", option]
    for option in (
        "BatchMode=yes",  # a password prompt nobody can answer would hang `up`
        f"ConnectTimeout={CONNECT_TIMEOUT_SECONDS}",
        "ServerAliveInterval=15",
        "ServerAliveCountMax=4",
        "ControlMaster=auto",
        f"ControlPath={control_directory()}/%C",
        f"ControlPersist={CONTROL_PERSIST_SECONDS}",
    ):
        argv += ["-o", option]
    if target.port is not None:
        argv += ["-p", str(target.port)]
    if target.user:
        argv += ["-l", target.user]
    argv += [*control, target.destination]
    if remote_argv is not None:
        argv += ["--", shlex.join(remote_argv)]
    return argv


def reach_hint(target: SshTarget) -> str:
    """What to do when `target` cannot be reached."""
    return (
        f"make `ssh {target} true` work without a prompt (key loaded in the agent, host in ~/.ssh/config, "
        "or `ssh_options` in the clusters file)"
    )


def unreachable(target: SshTarget, stderr: str) -> RemoteError:
    """The error for an ssh that could not connect, with what to try."""
    detail = " ".join(stderr.strip().splitlines()[-2:]) or "no message from ssh"
    return RemoteError(f"cannot reach {target} over ssh ({detail}); {reach_hint(target)}")


async def run(
    target: SshTarget, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None
) -> Completed:
    """Run `argv` on `target` to completion. RemoteError when ssh itself fails or `timeout` passes."""
    process = await asyncio.create_subprocess_exec(
        *ssh_argv(target, argv),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(stdin), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RemoteError(f"{target}: `{shlex.join(argv)}` did not finish within {timeout:.0f} s") from None
    except asyncio.CancelledError:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    result = Completed(process.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace"))
    if result.returncode == SSH_EXIT_CONNECTION_FAILED:
        raise unreachable(target, result.stderr)
    return result


async def run_script(
    target: SshTarget, script: str, *arguments: str, timeout: float | None = None, stdin: bytes | None = None
) -> Completed:
    """Run a constant `sh` script on `target`; `arguments` reach it as $1, $2, ... and nothing else."""
    return await run(target, ["sh", "-c", script, "swaplab", *arguments], timeout=timeout, stdin=stdin)


async def check(
    target: SshTarget, argv: Sequence[str], *, what: str, timeout: float | None = None, stdin: bytes | None = None
) -> str:
    """Run `argv` on `target` and return its stdout; RemoteError with its output when it fails."""
    result = await run(target, argv, timeout=timeout, stdin=stdin)
    if not result.ok:
        output = (result.stdout + result.stderr).strip()
        raise RemoteError(f"{target}: {what} failed with code {result.returncode}: `{shlex.join(argv)}`\n{output}")
    return result.stdout


async def connect(target: SshTarget) -> None:
    """Open (or reuse) the node's shared connection; RemoteError with a hint when it cannot."""
    await run(target, ["true"], timeout=CONNECT_TIMEOUT_SECONDS * 4)


async def disconnect(target: SshTarget) -> None:
    """Close the node's shared connection now instead of after ControlPersist."""
    process = await asyncio.create_subprocess_exec(
        *ssh_argv(target, control=("-O", "exit")),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    await process.wait()


async def open_stream(
    target: SshTarget, argv: Sequence[str], *, with_stderr: bool = False, stdin: int | None = None
) -> asyncio.subprocess.Process:
    """Start `argv` on `target` with its stdout (and stderr, when asked) readable here while it runs.

    `stdin`: a file descriptor whose content is sent to the command (a local pipe).
    """
    return await asyncio.create_subprocess_exec(
        *ssh_argv(target, argv),
        stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if with_stderr else asyncio.subprocess.DEVNULL,
    )


@contextlib.asynccontextmanager
async def owned(process: asyncio.subprocess.Process) -> AsyncIterator[asyncio.subprocess.Process]:
    """Read from a local ssh process, then wait for it; kill it only when the reading was cut short.

    Never kill one that merely reached the end of its output: Popen.kill() polls first and
    would reap it behind asyncio's back (asyncio then reports exit code 255 for it).
    """
    try:
        yield process
    except BaseException:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()
        raise
    await process.wait()


# -- a rank, detached on its node ------------------------------------------------------

# A process's identity on its node is its pid and start time (field 22 of /proc/PID/stat,
# counted after the command name, which may hold spaces): a reused pid is never the rank.
# Alive means the same process and not a zombie (a container's init may never reap the
# orphaned wrapper, and `kill -0` succeeds on a zombie).
_ALIVE = r"""
identity() { echo "$1 $(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20)"; }
alive() {
    [ -e "$dir/exit" ] && return 1
    read -r pid start < "$dir/pid" || return 1
    [ "$(identity "$pid")" = "$pid $start" ] || return 1
    [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" != Z ]
}
"""

# $1: the rank's folder (relative paths are under $HOME); $2...: the rank's argv; stdin:
# the secrets, as `export NAME='value'` lines (see secrets_script).
# The inner sh leads a new session: it outlives this ssh session, one signal to its
# process group reaches all the rank started, and it stays to record the exit status.
# The secrets go to a file only this user reads; the inner sh sources it and removes it
# before the rank starts, so they reach the rank's environment and no argv, and the
# inner sh's own environment (what `down` scans) never holds them.
_START = _ALIVE + r"""
dir=$1; shift
mkdir -p "$dir" || exit 1
rm -f "$dir/pid" "$dir/started" "$dir/exit" "$dir/secrets.env"
(umask 077 && cat > "$dir/secrets.env") || exit 1
: > "$dir/output.log"
setsid sh -c '. "$0/secrets.env"; rm -f "$0/secrets.env"
    echo $$ > "$0/started.tmp" && mv "$0/started.tmp" "$0/started"
    "$@" >> "$0/output.log" 2>&1 < /dev/null
    echo $? > "$0/exit"' "$dir" "$@" < /dev/null > /dev/null 2>&1 &
tries=0
while [ ! -s "$dir/started" ]; do
    tries=$((tries + 1))
    if [ "$tries" -gt 400 ]; then rm -f "$dir/secrets.env"; echo "the rank did not start within 20 s" >&2; exit 1; fi
    sleep 0.05
done
identity "$(cat "$dir/started")" > "$dir/pid"
cut -d' ' -f1 "$dir/pid"
"""

# $1: the rank's folder, $2: how many bytes of its output were already seen.
# Sends what the output file gains until the rank has ended and all of it was sent.
# (Not `tail --pid`: it takes a zombie for alive, and reports no exit.)
_FOLLOW = _ALIVE + r"""
dir=$1; offset=$2
while :; do
    running=no; alive && running=yes
    size=$(stat -c %s "$dir/output.log" 2>/dev/null || echo 0)
    if [ "$size" -gt "$offset" ]; then
        tail -c "+$((offset + 1))" "$dir/output.log" | head -c "$((size - offset))" || exit 0
        offset=$size
    elif [ "$running" = no ]; then
        exit 0
    else
        sleep 0.2
    fi
done
"""

# $1: the rank's folder. Prints "running PID", "exited CODE" or "gone" (killed: no status written).
_STATE = _ALIVE + r"""
dir=$1
if alive; then echo "running $pid"
elif [ -s "$dir/exit" ]; then echo "exited $(cat "$dir/exit")"
else echo gone
fi
"""

# $1: NAME=VALUE that marks the gang's processes in their environment.
# Prints one line per marked process: PID, parent PID, its environment's SWAPLAB_* entries, its command line.
_FIND = r"""
for file in $(grep -lszxF -- "$1" /proc/[0-9]*/environ); do
    pid=${file#/proc/}; pid=${pid%/environ}
    [ "$pid" = "$$" ] && continue
    parent=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f2)
    labels=$(tr '\0' '\n' < "$file" 2>/dev/null | grep '^SWAPLAB_' | tr '\n' ' ')
    command=$(tr '\0\n' '  ' < "/proc/$pid/cmdline" 2>/dev/null)
    printf '%s\t%s\t%s\t%s\n' "$pid" "$parent" "$labels" "$command"
done
"""

# $1: NAME=VALUE that marks the gang's processes; $2: seconds between SIGTERM and SIGKILL.
# Signals each marked process and, where it leads one, its process group (what it started).
_STOP = r"""
marked() {
    for file in $(grep -lszxF -- "$1" /proc/[0-9]*/environ); do
        pid=${file#/proc/}; echo "${pid%/environ}"
    done
}
pids=$(marked "$1")
[ -z "$pids" ] && exit 0
echo $pids
for pid in $pids; do kill -TERM -- "-$pid" 2>/dev/null; kill -TERM "$pid" 2>/dev/null; done
waited=0
while [ -n "$(marked "$1")" ] && [ "$waited" -lt "$(($2 * 10))" ]; do sleep 0.1; waited=$((waited + 1)); done
for pid in $(marked "$1"); do kill -KILL -- "-$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; done
waited=0
while [ -n "$(marked "$1")" ] && [ "$waited" -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
if [ -n "$(marked "$1")" ]; then echo "still running: $(marked "$1")" >&2; exit 1; fi
"""


# $1 address, $2 port: exit 0 once something accepts a connection there (from this node).
_ACCEPTS = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError:
    sys.exit(1)
"""


async def accepts(target: SshTarget, address: str, port: int) -> bool:
    """Whether, seen from `target`, `address:port` accepts a TCP connection (python3 on the node)."""
    result = await run(target, ["python3", "-c", _ACCEPTS, address, str(port)], timeout=CONNECT_TIMEOUT_SECONDS * 4)
    return result.ok


@dataclass(frozen=True)
class LabeledProcess:
    """A process on a node whose environment carries the gang's label."""

    pid: int
    parent: int
    labels: Mapping[str, str]  # its SWAPLAB_* environment
    command: str


# stdin: the secrets as `export NAME='value'` lines; then "$@" runs with them in its
# environment (and nothing but its environment: no file, no argv).
_WITH_SECRETS = 'eval "$(cat)" && exec "$@" < /dev/null'


def secrets_script(secrets: Mapping[str, str]) -> bytes:
    """`secrets` as POSIX sh `export` lines (each value quoted): what the node-side scripts read from stdin."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in secrets.items()).encode()


def with_secrets(argv: Sequence[str]) -> list[str]:
    """`argv` run by a wrapper that first reads `secrets_script` from stdin into the environment."""
    return ["sh", "-c", _WITH_SECRETS, "swaplab", *argv]


async def start_detached(
    target: SshTarget, directory: str, argv: Sequence[str], env: Mapping[str, str],
    secrets: Mapping[str, str] | None = None,
) -> int:
    """Start `argv` detached on `target` with `env` added, output to `directory/output.log`; returns its pid.

    `secrets` reach the rank's environment through ssh's stdin, never an argv (here or on the node).
    """
    assignments = [f"{name}={value}" for name, value in env.items()]
    command = ["env", *assignments, "sh", "-c", _START, "swaplab", directory, *argv]
    output = await check(
        target, command, what="starting a rank", timeout=CONNECT_TIMEOUT_SECONDS * 4,
        stdin=secrets_script(secrets or {}),
    )
    return int(output.split()[-1])


async def follow_output(
    target: SshTarget, directory: str, offset: int = 0, *, label: str | None = None
) -> asyncio.subprocess.Process:
    """Stream a detached rank's output from byte `offset` on; the stream ends when the rank ends.

    `label` (NAME=VALUE) goes into the node-side loop's environment, so that stopping the
    gang by its label also ends a loop whose reader went away (it would otherwise notice
    only at the rank's next line of output).
    """
    environment = ["env", label] if label else []
    return await open_stream(target, [*environment, "sh", "-c", _FOLLOW, "swaplab", directory, str(offset)])


async def read_output(target: SshTarget, directory: str, offset: int = 0) -> bytes:
    """A detached rank's output from byte `offset` to its current end."""
    process = await asyncio.create_subprocess_exec(
        *ssh_argv(target, ["tail", "-c", f"+{offset + 1}", f"{directory}/output.log"]),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    if process.returncode == SSH_EXIT_CONNECTION_FAILED:
        raise unreachable(target, stderr.decode(errors="replace"))
    return stdout


async def rank_state(target: SshTarget, directory: str) -> tuple[str, int | None]:
    """("running", pid), ("exited", code) or ("gone", None) for a detached rank."""
    output = (await run_script(target, _STATE, directory, timeout=CONNECT_TIMEOUT_SECONDS * 4)).stdout.split()
    if len(output) == 2 and output[0] in ("running", "exited") and output[1].lstrip("-").isdigit():
        return output[0], int(output[1])
    return "gone", None


async def find_labeled(target: SshTarget, label: str) -> list[LabeledProcess]:
    """The processes on `target` whose environment holds `label` (NAME=VALUE)."""
    result = await run_script(target, _FIND, label, timeout=CONNECT_TIMEOUT_SECONDS * 4)
    found = []
    for line in result.stdout.splitlines():
        pid, parent, labels, command = (line.split("\t", 3) + ["", "", ""])[:4]
        if not pid.isdigit():
            continue
        pairs = dict(item.split("=", 1) for item in labels.split() if "=" in item)
        found.append(LabeledProcess(int(pid), int(parent) if parent.isdigit() else 0, pairs, command.strip()))
    return found


async def stop_labeled(target: SshTarget, label: str, *, grace_seconds: int) -> list[int]:
    """SIGTERM every process on `target` marked with `label`, SIGKILL what is left after the grace.

    Returns the pids it signalled; RemoteError when some survive even SIGKILL.
    """
    result = await run_script(
        target, _STOP, label, str(grace_seconds), timeout=grace_seconds + CONNECT_TIMEOUT_SECONDS * 4
    )
    if not result.ok:
        raise RemoteError(f"{target}: could not stop the gang's processes: {result.stderr.strip()}")
    return [int(pid) for pid in result.stdout.split() if pid.isdigit()]
