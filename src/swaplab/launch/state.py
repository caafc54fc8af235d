"""Where a gang's run lives: its record and its ranks' output, here and on each node.

A run is one `up`: its id (`start`) sorts by time, apart from the plan's run id, which is
the same for every `up` of a recipe on a cluster (so `plan` shows exactly what `up` runs).

On a node, each rank has a folder under the node user's home
(`~/.local/state/swaplab/launch/<recipe>/<start>/rank-<N>/`: pid file, exit status, output).
Here, under the user's state directory, each run has a folder with `run.json` (what was
started where, and how it ended) and `rank-<N>.log`, a byte-for-byte mirror of each rank's
output: always a prefix of the node's file, extended whenever swaplab reads more of it, so
a run's logs stay readable here after its nodes are gone.

A foreground `up` records its pid in the run: `supervisor_alive` tells whether it still
watches the run (it then records the run's end itself).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import platformdirs
import psutil

# Relative to the node user's home, where ssh starts every command.
NODE_ROOT = ".local/state/swaplab/launch"
RUN_FILE = "run.json"
DOWN_FILE = "down-requested"
ENDED = ("failed", "stopped")


def local_root() -> Path:
    """This machine's launch state: `<user state dir>/launch` (XDG_STATE_HOME moves it)."""
    return Path(platformdirs.user_state_dir("swaplab")) / "launch"


def new_start_id() -> str:
    """A run's own id: sorts by start time, unique without coordination."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def node_directory(recipe_slug: str, start_id: str, name: str) -> str:
    """The folder of a run's rank process `name` on its node, relative to the node user's home."""
    return f"{NODE_ROOT}/{recipe_slug}/{start_id}/{name}"


@dataclass
class RankRecord:
    """One rank process as started: which rank, where, its step, its node folder, its wrapper's pid."""

    name: str  # "rank-N", or "rank-N-STEP" for a second long-running step of the same rank
    rank: int
    host: str
    step: str
    directory: str
    pid: int | None = None


@dataclass
class RunRecord:
    """What `up` started and how it went; `outcome` is starting, ready, failed or stopped."""

    start_id: str
    run_id: str  # the plan's run id, in the ranks' labels
    recipe: str  # the recipe's slug
    recipe_path: str
    cluster: str
    engine: str
    head_url: str
    started_at: float
    foreground: bool
    supervisor_pid: int
    ranks: list[RankRecord] = field(default_factory=list)
    outcome: str = "starting"
    cause: str = ""

    @property
    def ended(self) -> bool:
        """Whether the run has ended (failed or stopped)."""
        return self.outcome in ENDED


def supervisor_alive(record: RunRecord) -> bool:
    """Whether a foreground `up` still watches this run (it records the outcome itself then)."""
    if not record.foreground:
        return False
    try:
        return psutil.Process(record.supervisor_pid).create_time() <= record.started_at + 1
    except psutil.Error:
        return False


class RunFolder:
    """One run's folder here: its record and the mirrors of its ranks' output."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def start_id(self) -> str:
        return self.path.name

    def save(self, record: RunRecord) -> None:
        """Write the record atomically (a reader never sees half of it)."""
        self.path.mkdir(parents=True, exist_ok=True)
        temporary = self.path / f".{RUN_FILE}.{os.getpid()}"
        temporary.write_text(json.dumps(asdict(record), indent=2) + "\n")
        temporary.replace(self.path / RUN_FILE)

    def load(self) -> RunRecord | None:
        try:
            data = json.loads((self.path / RUN_FILE).read_text())
            data["ranks"] = [RankRecord(**rank) for rank in data.get("ranks", [])]
            return RunRecord(**data)
        except (OSError, ValueError, TypeError):
            return None

    def output_path(self, name: str) -> Path:
        return self.path / f"{name}.log"

    def mirrored_bytes(self, name: str) -> int:
        """How much of rank process `name`'s output this machine already holds."""
        try:
            return self.output_path(name).stat().st_size
        except FileNotFoundError:
            return 0

    def append_output(self, name: str, data: bytes) -> None:
        """Extend the mirror of rank process `name` with bytes read from its node."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.output_path(name), "ab") as mirror:
            mirror.write(data)

    def read_output(self, name: str) -> bytes:
        try:
            return self.output_path(name).read_bytes()
        except FileNotFoundError:
            return b""

    def request_down(self) -> None:
        """Note that `down` is stopping this run, so its supervisor reports a stop, not a failure."""
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / DOWN_FILE).write_text(f"{time.time()}\n")

    @property
    def down_requested(self) -> bool:
        return (self.path / DOWN_FILE).exists()


def recipe_folder(recipe_slug: str) -> Path:
    return local_root() / recipe_slug


def create_run(recipe_slug: str, start_id: str) -> RunFolder:
    folder = RunFolder(recipe_folder(recipe_slug) / start_id)
    folder.path.mkdir(parents=True, exist_ok=True)
    return folder


def runs(recipe_slug: str, cluster: str | None = None) -> list[RunFolder]:
    """The recipe's runs here, newest first; only those on `cluster` when given."""
    try:
        folders = sorted((path for path in recipe_folder(recipe_slug).iterdir() if path.is_dir()), reverse=True)
    except FileNotFoundError:
        return []
    found = []
    for path in folders:
        folder = RunFolder(path)
        record = folder.load()
        if record is not None and (cluster is None or record.cluster == cluster):
            found.append(folder)
    return found


def latest_run(recipe_slug: str, cluster: str | None = None) -> RunFolder | None:
    """The recipe's most recent run on `cluster`, or None."""
    found = runs(recipe_slug, cluster)
    return found[0] if found else None


def find_run(recipe_slug: str, start_id: str) -> RunFolder | None:
    """The run `start_id` of the recipe, if this machine started it."""
    folder = RunFolder(recipe_folder(recipe_slug) / start_id)
    return folder if folder.load() is not None else None
