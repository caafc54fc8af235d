"""The folders the router writes to are its own, and the files it writes there are its owner's only.

Another user of the machine who made a folder first (in /tmp, on a shared disk, under a shared
`$SWAPLAB_KVCACHE_DIR`) could otherwise read what swaplab keeps there, replace it, or plant links
that make swaplab write where they choose. So a folder is written to only when it and every folder
on the way to it (links followed) could be changed by this user or root alone: each belongs to one
of them, and no one else may write to it (a sticky folder such as /tmp excepted, above the folder
only). A missing folder is made `0700`; a folder of saved conversations that others may read (as earlier
swaplabs made it) loses those bits, with a warning. Files are created `0600`, never through a
symbolic link.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from swaplab.errors import SwaplabError

log = logging.getLogger("swaplab")

# As the kernel's own limit on the links one lookup follows.
_MAX_LINKS = 40


class FolderNotOwnedError(SwaplabError):
    """A folder swaplab would write to that another user could read from, plant in or replace."""


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _user(uid: int) -> str:
    return f"{_name(uid)} (uid {uid})"


def make_folders(path: str | os.PathLike[str]) -> None:
    """`path` and each missing folder above it made, every one `0700` (folders that exist keep their mode)."""
    missing = []
    folder = Path(os.path.abspath(path))
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # made meanwhile (another router): it is checked like any other
            pass


def _lookup(path: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry the kernel passes through to reach `path`, each link and the folders of its target
    included, with its `lstat`; the last one is what `path` names."""
    # Not normalised first: `..` after a link leaves the link's target, as the kernel reads it.
    pending = list((Path.cwd() / path).parts[1:])
    current = Path("/")
    yield current, os.lstat(current)
    links = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = current.parent
            continue
        entry = current / part
        status = os.lstat(entry)
        yield entry, status
        if stat.S_ISLNK(status.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(f"{path}: too many levels of symbolic links")
            target = Path(os.readlink(entry))
            if target.is_absolute():
                current = Path("/")
            pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
        else:
            current = entry


def _private_group(gid: int, uid: int) -> bool:
    """Whether group `gid` is user `uid`'s own (a user private group, as Debian and Ubuntu give each
    user, with umask 002): named as the user, its primary group, no other member. Its bits are the user's."""
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _foreign(status: os.stat_result, uid: int, bits: int) -> int:
    """Those of `bits` in the entry's mode that give someone other than user `uid` access."""
    if _private_group(status.st_gid, uid):
        bits &= ~0o070
    return stat.S_IMODE(status.st_mode) & bits


def _who(bits: int) -> str:
    return " and ".join(name for name, mask in (("its group", 0o070), ("every user", 0o007)) if bits & mask)


def folder_problem(path: str | os.PathLike[str], uid: int, *, private: bool = False) -> str | None:
    """Why `path` is not a folder of user `uid`'s own, with the fix; None when it is.

    With `private`, a folder others may read or enter is refused too (it holds conversations).
    """
    entries = list(_lookup(Path(path)))
    status = entries[-1][1]
    mode = stat.S_IMODE(status.st_mode)
    if not stat.S_ISDIR(status.st_mode):
        return f"{path} is not a folder"
    if status.st_uid != uid:
        return (f"{path} belongs to {_user(status.st_uid)}, not to you ({_name(uid)}): its owner could read or "
                f"replace what swaplab keeps there. Use another folder (swaplab makes a missing one, 0700), "
                f"or take this one: `sudo chown {_name(uid)} {path} && chmod 700 {path}`")
    if writers := _foreign(status, uid, 0o022):
        return (f"{path} may be written by {_who(writers)} (mode {mode:04o}): they could plant or replace "
                f"files in it. `chmod 700 {path}`, or use another folder")
    if private and (readers := _foreign(status, uid, 0o077)):
        return (f"{path} may be read by {_who(readers)} (mode {mode:04o}), and it holds saved conversations: "
                f"`chmod 700 {path}`, or use another folder")
    for entry, above in entries[:-1]:
        kind = "a link" if stat.S_ISLNK(above.st_mode) else "a folder"
        if above.st_uid not in (uid, 0):
            return (f"{path} lies under {entry}, {kind} of {_user(above.st_uid)}, who could put another folder in "
                    f"its place: use a folder outside it")
        writers = _foreign(above, uid, 0o022) if stat.S_ISDIR(above.st_mode) else 0
        if writers and not above.st_mode & stat.S_ISVTX:
            return (f"{path} lies under {entry}, which {_who(writers)} may write to (mode "
                    f"{stat.S_IMODE(above.st_mode):04o}, not sticky): they could put another folder in its place. "
                    f"`chmod go-w {entry}` (or `chmod +t` it, as /tmp is), or use another folder")
    return None


def own_folder(path: str | os.PathLike[str], what: str, *, private: bool = False) -> Path:
    """`path` made if missing (`0700`), once it is this user's own: FolderNotOwnedError, saying the
    fix, when another user could change it (see `folder_problem`). `what` names it for the message."""
    make_folders(path)
    _tighten(path, what, private)
    problem = folder_problem(path, os.geteuid(), private=private)
    if problem is not None:
        raise FolderNotOwnedError(f"{what}: {problem}")
    return Path(path)


def _tighten(path: str | os.PathLike[str], what: str, private: bool) -> None:
    """A private folder of this user's that others may only read or enter (an earlier swaplab made its kvCache
    folder 0755) loses those bits, said in the log. One others may write to is refused, not mended: what they
    may have planted there is not known."""
    uid = os.geteuid()
    try:
        status = os.stat(path)
    except OSError:
        return  # folder_problem says what is wrong
    if not private or not stat.S_ISDIR(status.st_mode) or status.st_uid != uid or _foreign(status, uid, 0o022):
        return
    bits = _foreign(status, uid, 0o077)
    if bits:
        mode = stat.S_IMODE(status.st_mode)
        os.chmod(path, mode & ~bits)
        log.warning("%s: %s was open to %s (mode %04o): made %04o", what, path, _who(bits), mode, mode & ~bits)


def open_private(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """A descriptor of `path`, created `0600` if missing; a symbolic link there is refused (OSError), never followed."""
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_private(path: str | os.PathLike[str], data: bytes, *, durable: bool = False) -> None:
    """`data` as the whole of `path`, replaced atomically: written to a new `0600` file beside it
    (`mkstemp`: created exclusively, never through a link), then renamed over it, which replaces a
    link at `path` rather than following it. `durable`: on disk before the rename."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def open_own(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` open for reading, a plain file of this user's: a link, a FIFO or another user's file is an OSError."""
    file = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    try:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise OSError(f"{path}: not a plain file")
        if status.st_uid != os.geteuid():
            raise OSError(f"{path}: belongs to {_user(status.st_uid)}, not to you")
    except BaseException:
        file.close()
        raise
    return file


def read_own(path: str | os.PathLike[str]) -> bytes:
    """The bytes of `path`, a plain file of this user's (`open_own`)."""
    with open_own(path) as file:
        return file.read()
