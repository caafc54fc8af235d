"""Other users on the same machine: the folders the router writes to are its own, its files are
private and never written through a link (docs/security.md, "Other users on the same machine").

The folder another user made first is made for real, as `nobody` (`setpriv`), in /tmp, where such
a user would make it; the router is the real `swaplab serve`.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from conftest import write_config
from procs import SIM, free_port, run_swaplab

from swaplab.fleet.kvcache import LOCK, MANIFEST, SavedCache, cache_file_name, locked, record_saved
from swaplab.fleet.kvstore import make_directory
from swaplab.fleet.reaper import PidFiles
from swaplab.ownfolder import FolderNotOwnedError, folder_problem, own_folder
from swaplab.results.store import connect

NOBODY = 65534
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="makes a folder as another user: root and setpriv"
)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def theirs():
    """A folder another user (`nobody`) made in /tmp before the router ran, open to its owner only."""
    folder = Path("/tmp") / f"swaplab-theirs-{uuid.uuid4().hex[:12]}"
    made = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           "mkdir", "-m", "0700", str(folder)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert os.stat(folder).st_uid == NOBODY
    yield folder
    shutil.rmtree(folder)


def serve(tmp_path: Path, config: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`swaplab serve` that is expected to refuse to start (a router that starts is a timeout here)."""
    path = write_config(tmp_path, config)
    return run_swaplab("serve", "--listen", f"127.0.0.1:{free_port()}", "--config", str(path),
                       "--db", str(tmp_path / "swaplab.db"), *extra, timeout=30, env=env)


ONE_SIM = f"models:\n  a:\n    cmd: {SIM} --port ${{PORT}}\n"


@as_root
def test_serve_refuses_a_state_folder_another_user_made_and_says_the_fix(tmp_path, theirs):
    done = serve(tmp_path, ONE_SIM, "--state-dir", str(theirs))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the state folder (--state-dir): {theirs} belongs to nobody (uid {NOBODY})" in done.stderr
    assert f"chown root {theirs} && chmod 700 {theirs}" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(theirs.iterdir()) == []  # nothing written in it


@as_root
def test_serve_refuses_a_kvcache_folder_another_user_made(tmp_path, theirs):
    model = tmp_path / "a.gguf"
    model.write_bytes(b"GGUF")
    config = f"models:\n  a:\n    cmd: {SIM} --port ${{PORT}} --model {model} --slot-save-path {theirs}\n    kvCache: true\n"
    done = serve(tmp_path, config, "--state-dir", str(tmp_path / "state"), env={"SWAPLAB_KVCACHE_DIR": str(theirs)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the kvCache folder: {theirs} belongs to nobody" in done.stderr and "chmod 700" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(theirs.iterdir()) == []  # no lock file, no manifest


@as_root
def test_a_folder_under_a_folder_of_another_user_is_refused(theirs):
    inner = theirs / "mine"
    inner.mkdir(mode=0o700)  # ours, but its owner may replace it
    with pytest.raises(FolderNotOwnedError, match=f"lies under {theirs}, a folder of nobody"):
        own_folder(inner, "the state folder")


@pytest.mark.parametrize(("bits", "group"), [
    (0o707, None), (0o777, None), (0o1777, None),
    pytest.param(0o770, NOBODY, marks=pytest.mark.skipif(os.geteuid() != 0, reason="gives a folder to a group")),
], ids=["0707", "0777", "01777", "0770-nogroup"])
def test_a_folder_others_may_write_is_refused_with_the_fix(tmp_path, bits, group):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(bits)
    if group is not None:
        os.chown(folder, -1, group)
    with pytest.raises(FolderNotOwnedError) as refused:
        PidFiles(folder)
    message = str(refused.value)
    assert f"the state folder (--state-dir): {folder} may be written by" in message
    assert f"`chmod 700 {folder}`" in message
    with pytest.raises(FolderNotOwnedError):
        make_directory(folder)


def test_a_folder_under_one_others_may_write_is_refused_unless_it_is_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(FolderNotOwnedError, match=r"lies under .*shared, which (its group and )?every user may write to .*not sticky"):
        PidFiles(shared / "state")
    shared.chmod(0o1777)  # as /tmp: others cannot rename what is ours
    assert PidFiles(shared / "state").directory == shared / "state"


def test_a_link_to_a_folder_others_may_write_is_followed_and_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    real.chmod(0o777)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(FolderNotOwnedError, match="may be written by"):
        PidFiles(tmp_path / "link")


def test_a_kvcache_folder_others_may_read_is_closed_a_state_folder_is_left(tmp_path, caplog):
    """An earlier swaplab made its kvCache folder 0755: it is closed to others, said, not refused (an upgrade
    must not stop the router); the state folder holds nothing private and keeps its mode."""
    folder = tmp_path / "readable"
    folder.mkdir()
    folder.chmod(0o755)
    assert PidFiles(folder).directory == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    make_directory(folder)
    assert not stat.S_IMODE(folder.stat().st_mode) & 0o007
    assert "was open to every user (mode 0755)" in caplog.text
    assert folder_problem(folder, os.geteuid(), private=True) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="root's group is root's own: a user private group")
def test_the_users_own_private_group_may_write_as_with_umask_002(tmp_path):
    shared = tmp_path / "home"
    shared.mkdir()
    shared.chmod(0o775)
    os.chown(shared, 0, 0)  # root:root, as ~ is user:user on Debian and Ubuntu
    (shared / "kvcache").mkdir(mode=0o770)
    assert PidFiles(shared / "state").directory == shared / "state"
    make_directory(shared / "kvcache")


def test_missing_folders_are_made_0700_each(tmp_path):
    PidFiles(tmp_path / "a" / "b" / "state")
    make_directory(tmp_path / "c" / "kvcache")
    for made in ("a", "a/b", "a/b/state", "c", "c/kvcache"):
        assert mode(tmp_path / made) == 0o700, made


def saved(directory: Path, size: int = 100) -> SavedCache:
    name = cache_file_name("a" * 16, 0, "1f")
    (directory / name).write_bytes(b"k" * size)  # as llama.cpp writes it: with its umask, 0644
    return SavedCache(identity="a" * 16, slot_id=0, tokens=7, bytes=0, saved_at=1.0, file_name=name)


def test_the_files_the_router_keeps_are_created_0600(tmp_path):
    pid_files = PidFiles(tmp_path / "state")
    pid_files.record("a", os.getpid())
    assert mode(tmp_path / "state" / "backend-a.json") == 0o600
    store = tmp_path / "kvcache"
    make_directory(store)
    with locked(store):
        cache = record_saved(store, saved(store))
    assert mode(store / LOCK) == 0o600 and mode(store / MANIFEST) == 0o600
    assert mode(store / cache.file_name) == 0o600  # the slot file llama.cpp wrote, made private at its record


def test_a_link_planted_at_a_pid_file_is_replaced_never_followed(tmp_path):
    state = tmp_path / "state"
    pid_files = PidFiles(state)
    target = tmp_path / "victim.txt"
    target.write_text("precious")
    # The file's own name, and the temporary name the router used to write it under.
    for name in ("backend-a.json", "backend-a.tmp"):
        (state / name).symlink_to(target)
    pid_files.record("a", os.getpid())
    assert target.read_text() == "precious"
    assert not (state / "backend-a.json").is_symlink() and mode(state / "backend-a.json") == 0o600


def test_a_link_planted_at_the_lock_file_is_refused_never_followed(tmp_path):
    store = tmp_path / "kvcache"
    make_directory(store)
    target = tmp_path / "elsewhere" / "created-through-the-link"
    target.parent.mkdir()
    (store / LOCK).symlink_to(target)
    with pytest.raises(OSError):
        with locked(store):
            pass
    assert not target.exists()


def test_a_link_planted_as_a_slot_file_is_never_recorded(tmp_path):
    store = tmp_path / "kvcache"
    make_directory(store)
    target = tmp_path / "secret.txt"
    target.write_text("not a cache")
    target.chmod(0o644)
    name = cache_file_name("a" * 16, 0, "1f")
    (store / name).symlink_to(target)
    with pytest.raises(OSError):
        record_saved(store, SavedCache(identity="a" * 16, slot_id=0, tokens=7, bytes=0, saved_at=1.0, file_name=name))
    assert mode(target) == 0o644


def test_the_stores_missing_folders_are_made_0700(tmp_path):
    connect(tmp_path / "new" / "swaplab.db").close()
    assert mode(tmp_path / "new") == 0o700 and mode(tmp_path / "new" / "swaplab.db") == 0o600
