"""A real OpenSSH server for the launcher tests: Debian's sshd on a free high loopback port,
and the two-node loopback cluster, recipes and process checks the launcher tests build on it.

Two "nodes" share it: it listens on 127.0.0.1 and 127.0.0.2 (Linux answers all of 127/8 on
`lo`), so a cluster of two hosts runs real ssh sessions to each without a second machine.
Everything lives in a temporary folder: its own sshd_config, host key, client key,
authorized_keys and known_hosts. No system file is read for authentication or changed,
except `/run/sshd`, the empty privilege-separation folder that sshd insists on when it runs
as root (Debian's service creates the same folder at boot).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

SSHD = Path("/usr/sbin/sshd")
NODE_ADDRESSES = ("127.0.0.1", "127.0.0.2")
START_TIMEOUT = 60.0
# Sessions multiplexed over one ControlMaster connection: a gang opens a log stream per
# rank besides its commands, and sshd's default (10) would refuse the eleventh.
MAX_SESSIONS = 64


@dataclass(frozen=True)
class SshServer:
    """A running sshd and what a client needs to reach it as the current user."""

    port: int
    user: str
    directory: Path
    client_key: Path
    known_hosts: Path
    config_file: Path
    process: subprocess.Popen
    log_path: Path

    @property
    def addresses(self) -> tuple[str, ...]:
        return NODE_ADDRESSES

    @property
    def ssh_options(self) -> tuple[str, ...]:
        """`ssh -o` options (without the `-o`) that reach this server with the test's key."""
        return (
            f"Port={self.port}",
            f"IdentityFile={self.client_key}",
            "IdentitiesOnly=yes",
            f"UserKnownHostsFile={self.known_hosts}",
            "StrictHostKeyChecking=accept-new",
            "BatchMode=yes",
        )

    def ssh(self, address: str, *remote_argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a command on `address` through this server, output captured as text."""
        return subprocess.run(
            ["ssh", "-F", str(self.config_file), address, "--", *remote_argv],
            check=False, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, stdin=subprocess.DEVNULL, capture_output=True,
    )


def _answers(address: str, port: int) -> bool:
    """True once `address:port` greets like an SSH server."""
    try:
        with socket.create_connection((address, port), timeout=2) as connection:
            connection.settimeout(5)
            return connection.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _free_on_both(port: int) -> bool:
    for address in NODE_ADDRESSES:
        with socket.socket() as probe:
            try:
                probe.bind((address, port))
            except OSError:
                return False
    return True


def _config_text(directory: Path, port: int, user: str) -> str:
    listen = "\n".join(f"ListenAddress {address}" for address in NODE_ADDRESSES)
    return f"""\
Port {port}
{listen}
HostKey {directory / "host_key"}
PidFile {directory / "sshd.pid"}
AuthorizedKeysFile {directory / "authorized_keys"}
AllowUsers {user}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# PAM needs root and, in containers, fails on pam_loginuid: key authentication is enough.
UsePAM no
# pytest's temporary folders are not owned the way StrictModes wants for a key file.
StrictModes no
PermitRootLogin prohibit-password
MaxSessions {MAX_SESSIONS}
MaxStartups {MAX_SESSIONS}
PrintMotd no
PrintLastLog no
LogLevel INFO
"""


def start_sshd(directory: Path) -> SshServer:
    """Start sshd for the current user on a free high port of both node addresses; wait until it answers."""
    if not SSHD.exists() or shutil.which("ssh") is None:
        pytest.fail("OpenSSH is missing: run `make system-deps` (or `apt-get install -y openssh-server`)")
    directory.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    _keygen(directory / "host_key", "swaplab-test-host")
    client_key = directory / "client_key"
    _keygen(client_key, "swaplab-test-client")
    (directory / "authorized_keys").write_text((directory / "client_key.pub").read_text())
    known_hosts = directory / "known_hosts"
    known_hosts.touch()
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)

    for _ in range(20):
        port = _free_port_on_both()
        sshd_config = directory / "sshd_config"
        sshd_config.write_text(_config_text(directory, port, user))
        log_path = directory / "sshd.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(sshd_config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while process.poll() is None and time.monotonic() < deadline:
            if all(_answers(address, port) for address in NODE_ADDRESSES):
                break
            time.sleep(0.05)  # the poll's pace while sshd starts, not an ordering: the deadline bounds it
        if process.poll() is not None:
            text = log_path.read_text(errors="replace")
            if "Address already in use" in text:
                continue  # taken between the check and the bind: another port
            pytest.fail(f"sshd exited with code {process.returncode}:\n{text}")
        if not all(_answers(address, port) for address in NODE_ADDRESSES):
            process.kill()
            pytest.fail(f"sshd did not answer within {START_TIMEOUT:.0f} s:\n{log_path.read_text(errors='replace')}")
        server = SshServer(
            port=port, user=user, directory=directory, client_key=client_key, known_hosts=known_hosts,
            config_file=directory / "ssh_config", process=process, log_path=log_path,
        )
        options = "\n".join(f"    {option.replace('=', ' ', 1)}" for option in server.ssh_options)
        server.config_file.write_text(f"Host {' '.join(NODE_ADDRESSES)}\n    User {user}\n{options}\n")
        return server
    pytest.fail("no free port for sshd on both node addresses after 20 tries")


def stop_sshd(server: SshServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def close_shared_connections(server: SshServer) -> None:
    """End the launcher's ControlMaster connections to the server now, not after ControlPersist."""
    from swaplab.launch.remote import SshTarget, ssh_argv

    for address in server.addresses:
        target = SshTarget(address, port=server.port, user=server.user, options=server.ssh_options)
        subprocess.run(ssh_argv(target, control=("-O", "exit")), capture_output=True, timeout=30, check=False)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """One sshd for the whole session: the two loopback nodes' SSH server."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    close_shared_connections(server)
    stop_sshd(server)


# -- the loopback cluster -----------------------------------------------------------------

CLUSTER = "loop"
SWAPLAB = [sys.executable, "-m", "swaplab"]


def write_cluster(directory: Path, server: SshServer, name: str = CLUSTER) -> Path:
    """A clusters file whose two hosts are the server's two addresses, reached with its key."""
    hosts = ", ".join(
        f'{{ name = "{address}", fabric_ip = "{address}", ssh_port = {server.port} }}' for address in server.addresses
    )
    options = ", ".join(json.dumps(option) for option in server.ssh_options if not option.startswith("Port="))
    path = directory / "clusters.toml"
    path.write_text(f"""\
[clusters.{name}]
user = {json.dumps(server.user)}
ssh_options = [{options}]
hosts = [{hosts}]
""")
    return path


def write_recipe(directory: Path, slug: str, args: list[str], *, port: int, model: str = "sim-model",
                 ready: list[str] = (), fatal: list[str] = (), timeout: float = 240) -> Path:
    """A two-node `engine = "process"` recipe in `directory/slug/recipe.toml` (its slug is `slug`)."""
    folder = directory / slug
    folder.mkdir(parents=True)
    path = folder / "recipe.toml"
    path.write_text(f"""\
engine = "process"
name = "{slug}"
model = {json.dumps(model)}
required_nodes = 2
port = {port}
args = {json.dumps(args)}

[readiness]
ready = {json.dumps(list(ready))}
fatal = {json.dumps(list(fatal))}
timeout = {timeout}
""")
    return path


def sim_args(*extra: str) -> list[str]:
    """A rank that is `swaplab sim` on its node's fabric address and the recipe's port."""
    return [*SWAPLAB, "sim", "--host", "{fabric_ip}", "--port", "{port}", "--model", "{model}", *extra]


def gang_processes(slug: str) -> list[psutil.Process]:
    """Every live process on this machine (both loopback nodes) of a gang of recipe `slug`:
    by the label in its environment, or by its rank folder on its command line."""
    folder = f"swaplab/launch/{slug}/"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(process.info["cmdline"] or ())
            if folder in cmdline or process.environ().get("SWAPLAB_RECIPE") == slug:
                found.append(process)
        except psutil.Error:
            continue
    return found


def rank_processes(slug: str) -> dict[str, psutil.Process]:
    """Each rank's own process (not the `sh` wrapper that records its exit), by rank number."""
    ranks = {}
    for process in gang_processes(slug):
        try:
            environ, cmdline = process.environ(), process.cmdline()
        except psutil.Error:
            continue  # ended since it was listed
        if "SWAPLAB_RANK" in environ and cmdline and cmdline[0] != "sh":
            ranks[environ["SWAPLAB_RANK"]] = process
    return ranks


def node_state(slug: str) -> Path:
    """Where the loopback nodes keep the recipe's rank folders (this user's home)."""
    return Path.home() / ".local/state/swaplab/launch" / slug


class LoopGang:
    """One test's gang on the loopback cluster: its clusters file, a free port, a unique recipe
    slug and its own local state directory; `launch(ACTION)` runs `swaplab launch ACTION`."""

    def __init__(self, directory: Path, server: SshServer):
        self.directory = directory
        self.clusters = write_cluster(directory, server)
        self.port = _free_port_on_both()
        self.slug = f"gang-{os.urandom(4).hex()}"
        self.state_home = directory / "state"
        self.env = {"XDG_STATE_HOME": str(self.state_home)}
        self.recipe_path: Path | None = None

    def recipe(self, args: list[str], **options) -> Path:
        self.recipe_path = write_recipe(self.directory, self.slug, args, port=self.port, **options)
        return self.recipe_path

    def arguments(self, action: str, *extra: str) -> list[str]:
        return ["launch", action, str(self.recipe_path), "--cluster", CLUSTER, "--clusters", str(self.clusters), *extra]

    def command(self, action: str, *extra: str) -> str:
        """The shell-free command line of an action, with this gang's state directory (a router `cmd`)."""
        return shlex.join(["env", f"XDG_STATE_HOME={self.state_home}", *SWAPLAB, *self.arguments(action, *extra)])

    def launch(self, action: str, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*SWAPLAB, *self.arguments(action, *extra)], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )

    def url(self, address: str = NODE_ADDRESSES[0]) -> str:
        return f"http://{address}:{self.port}"

    def close(self) -> list[psutil.Process]:
        """`down`, then kill and return whatever of the gang is still running; its node folders go."""
        if self.recipe_path is not None:
            self.launch("down")
        leftovers = surviving(gang_processes(self.slug))
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.kill()
        shutil.rmtree(node_state(self.slug), ignore_errors=True)
        return leftovers


EXIT_GRACE_SECONDS = 10.0


def surviving(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still running after a grace: an ssh session's shell may be a moment
    behind the gang process it ran (its exit follows), but a leftover rank stays."""
    _, alive = psutil.wait_procs(processes, timeout=EXIT_GRACE_SECONDS)
    return [process for process in alive if _running(process)]


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _free_port_on_both() -> int:
    for _ in range(200):
        # Below the ephemeral range, where outgoing connections could take it meanwhile.
        port = random.randrange(20000, 32000)
        if _free_on_both(port):
            return port
    raise RuntimeError("no port free on both node addresses")


@pytest.fixture
def gang(tmp_path, sshd):
    """A LoopGang for one test; at the end `down`, and the test fails if anything of the gang survived."""
    directory = tmp_path / "gang"
    directory.mkdir()
    created = LoopGang(directory, sshd)
    yield created
    leftovers = created.close()
    assert not leftovers, f"the test left gang processes behind: {leftovers}"
