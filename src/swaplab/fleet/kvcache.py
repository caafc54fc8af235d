"""Which saved KV caches a llama.cpp server may restore, and which the disk budget lets stay.

llama-server started with `--slot-save-path DIR` saves a slot's cache to a file in DIR
(`POST /slots/{id}?action=save`) and restores it (`?action=restore`). A cache is only good
for a server whose model file and cache layout are the ones that saved it: `cache_identity`
names that, and a manifest beside the files says what each holds, with each file's SHA-256
taken at its save and checked before its restore. Pure decisions over plain data, except the
manifest's small file I/O (`record_saved`, `read_manifest`, `forget_saved`) and the checksums.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from swaplab.memory.flags import runs_llama_server
from swaplab.ownfolder import open_own, open_private, read_own, write_private

MANIFEST = "swaplab-kvcache.json"
MANIFEST_VERSION = 1
LOCK = ".swaplab-kvcache.lock"
# The files swaplab names (`cache_file_name`): only these are ever swept from a directory.
_OURS = re.compile(r"[0-9a-f]{16}-slot[0-9]+(-[0-9a-f]+)?\.bin")

# llama-server's spellings of the flags that change what a saved slot's bytes mean.
_FLAGS = {
    "-m": "model", "--model": "model",
    "-c": "ctx_size", "--ctx-size": "ctx_size",
    "-ctk": "cache_type_k", "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v",
    "-np": "parallel", "--parallel": "parallel",
    "--slot-save-path": "slot_save_path",
}


@dataclass(frozen=True)
class Layout:
    """What a llama-server command line says about its KV cache; None where the flag is absent."""

    model: str | None = None
    ctx_size: str | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    parallel: str | None = None
    slot_save_path: str | None = None


@dataclass(frozen=True)
class SavedCache:
    """One slot's cache saved to `file_name` in the save directory."""

    identity: str
    slot_id: int
    tokens: int
    bytes: int
    saved_at: float
    file_name: str
    model: str = ""
    """The model id that saved it (shown; the identity is what decides a restore)."""
    used_at: float = 0.0
    """When it was last restored (0: never); the disk budget removes the least recently used first."""
    sha256: str = ""
    """The file's SHA-256 when it was saved: a file changed since, even to the same size, is never restored."""

    @property
    def last_used(self) -> float:
        return max(self.saved_at, self.used_at)


def cache_layout(argv: Sequence[str]) -> Layout:
    """The layout flags of a llama-server command line, `--flag value` or `--flag=value`; the last one wins."""
    found: dict[str, str] = {}
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        flag, equals, value = word.partition("=")
        if flag in _FLAGS and equals:
            found[_FLAGS[flag]] = value
        elif word in _FLAGS and index + 1 < len(words):
            found[_FLAGS[word]] = words[index + 1]
            index += 1
        index += 1
    return Layout(**found)


def cache_identity(entry_hash: str, model_file_size: int, model_file_mtime_ns: int, layout: Layout) -> str:
    """A short hex digest of what a saved cache is good for: the config entry, the model file, the layout."""
    # Where the caches are saved is not what they hold: moving the directory keeps them good.
    facts = [
        entry_hash, model_file_size, model_file_mtime_ns,
        layout.model, layout.ctx_size, layout.cache_type_k, layout.cache_type_v, layout.parallel,
    ]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


def cache_file_name(identity: str, slot_id: int, nonce: str = "") -> str:
    """The file a slot's cache is saved to. Each save gets a new `nonce`, so a save cut short never
    overwrites the good file before it: `record_saved` replaces the old one once the new one is whole."""
    return f"{identity}-slot{slot_id}" + (f"-{nonce}" if nonce else "") + ".bin"


def with_slot_save_path(argv: Sequence[str], directory: str) -> list[str]:
    """argv with `--slot-save-path DIR/` added when it runs llama-server without one; else argv as it is."""
    if not runs_llama_server(argv) or cache_layout(argv).slot_save_path is not None:
        return list(argv)
    # xllamacpp joins the directory and the file name without a separator.
    return [*argv, "--slot-save-path", directory.rstrip("/") + "/"]


def _oldest_first(saved: Sequence[SavedCache]) -> list[SavedCache]:
    # The file name breaks a tie, so the same caches always give the same answer.
    return sorted(saved, key=lambda cache: (cache.last_used, cache.file_name))


def over_budget(saved: Sequence[SavedCache], budget_bytes: int) -> list[SavedCache]:
    """The caches to delete, least recently saved or restored first, until the rest fit in `budget_bytes`."""
    held = sum(cache.bytes for cache in saved)
    remove: list[SavedCache] = []
    for cache in _oldest_first(saved):
        if held <= budget_bytes:
            break
        remove.append(cache)
        held -= cache.bytes
    return remove


def restorable(saved: Sequence[SavedCache], identity: str) -> list[SavedCache]:
    """The caches a server of this identity may restore, by slot."""
    return sorted((cache for cache in saved if cache.identity == identity), key=lambda cache: cache.slot_id)


def _well_formed(cache: SavedCache) -> bool:
    def counts(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    return (
        isinstance(cache.identity, str) and counts(cache.slot_id) and counts(cache.tokens)
        and counts(cache.bytes) and isinstance(cache.saved_at, (int, float)) and isinstance(cache.file_name, str)
        and isinstance(cache.model, str) and isinstance(cache.used_at, (int, float)) and isinstance(cache.sha256, str)
    )


@dataclass(frozen=True)
class Manifest:
    """The caches a manifest lists whose files are whole, and why any others were left out."""

    caches: list[SavedCache]
    notes: list[str]


def read_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """The manifest's caches whose file exists with exactly the recorded size; a corrupt manifest gives none."""
    path = Path(directory) / MANIFEST
    try:
        document = json.loads(read_own(path).decode())
    except FileNotFoundError:
        return Manifest([], [])
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return Manifest([], [f"{path}: unreadable ({error}); its caches are ignored"])
    if not isinstance(document, dict) or document.get("version") != MANIFEST_VERSION:
        return Manifest([], [f"{path}: not a version {MANIFEST_VERSION} manifest; its caches are ignored"])
    caches: list[SavedCache] = []
    notes: list[str] = []
    for entry in document.get("caches") if isinstance(document.get("caches"), list) else []:
        try:
            cache = SavedCache(**entry)
        except TypeError:
            cache = None
        if cache is None or not _well_formed(cache):
            notes.append(f"{path}: a malformed entry {entry!r} is ignored")
            continue
        name = cache.file_name
        if name in ("", ".", "..", MANIFEST) or os.path.basename(name) != name:
            notes.append(f"{path}: {name!r} is not a file name in the save directory; ignored")
            continue
        if not cache.sha256:
            notes.append(f"{name}: saved without a checksum (by an older swaplab); dropped")
            continue
        try:
            size = (Path(directory) / name).stat().st_size
        except OSError:
            notes.append(f"{name}: missing; dropped")
            continue
        # A save cut short leaves a file shorter than the one recorded: never restore it.
        if size != cache.bytes:
            notes.append(f"{name}: {size} bytes on disk, {cache.bytes} recorded; dropped")
            continue
        caches.append(cache)
    return Manifest(caches, notes)


def _write_manifest(directory: Path, caches: Sequence[SavedCache]) -> None:
    # Replaced atomically, so a crash leaves the old manifest or the new one, never half of one.
    document = {"version": MANIFEST_VERSION, "caches": [asdict(cache) for cache in caches]}
    write_private(directory / MANIFEST, json.dumps(document, indent=1).encode(), durable=True)


def _take_file(path: Path) -> tuple[int, str]:
    """A cache file the server wrote, made its owner's only (`0600`: llama.cpp writes it with its
    umask), with its size and SHA-256; a link, or anything but a plain file of this user's, is an OSError."""
    with open_own(path) as file:
        os.fchmod(file.fileno(), 0o600)
        return os.fstat(file.fileno()).st_size, hashlib.file_digest(file, "sha256").hexdigest()


def changed_since_saved(directory: str | os.PathLike[str], cache: SavedCache) -> str | None:
    """Why the cache's file may not be restored (it cannot be read, or its bytes are not the ones
    saved: its SHA-256 differs); None when it is the file that was saved."""
    try:
        size, digest = _take_file(Path(directory) / cache.file_name)
    except OSError as error:
        return f"its file cannot be read ({error})"
    if size != cache.bytes or digest != cache.sha256:
        return "its file is not the one saved (its SHA-256 differs from the one recorded at the save)"
    return None


@contextlib.contextmanager
def locked(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Holds the directory's lock file: two routers sharing a save directory never lose each other's entries."""
    descriptor = open_private(Path(directory) / LOCK)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing it lets the lock go


def record_saved(directory: str | os.PathLike[str], cache: SavedCache) -> SavedCache:
    """Adds a cache whose file the server has written to the manifest, with the size and SHA-256 its
    file has now (the file made `0600`).

    It replaces the entry of the same identity and slot; the file that entry named is deleted
    once the manifest no longer lists it.
    """
    directory = Path(directory)
    size, digest = _take_file(directory / cache.file_name)
    recorded = replace(cache, bytes=size, sha256=digest)
    old = read_manifest(directory).caches
    replaced = [c for c in old if c.file_name == cache.file_name
                or (c.identity, c.slot_id) == (cache.identity, cache.slot_id)]
    _write_manifest(directory, [*(c for c in old if c not in replaced), recorded])
    for stale in replaced:
        if stale.file_name != recorded.file_name:
            (directory / stale.file_name).unlink(missing_ok=True)
    return recorded


def mark_used(directory: str | os.PathLike[str], file_name: str, when: float) -> None:
    """Records that a cache was restored at `when` (the budget keeps the most recently used)."""
    directory = Path(directory)
    caches = read_manifest(directory).caches
    if any(c.file_name == file_name for c in caches):
        _write_manifest(directory, [replace(c, used_at=when) if c.file_name == file_name else c for c in caches])


def sweep(directory: str | os.PathLike[str], now: float, min_age: float) -> tuple[Manifest, list[str]]:
    """Reads a save directory's manifest and tidies the directory: entries whose file is missing or
    cut short leave the manifest, and files swaplab named that the manifest does not list (a save
    cut short by a kill) are deleted once older than `min_age` seconds (a younger one may be another
    router's save under way). Returns the manifest as read and the deleted files' names."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    listed = {cache.file_name for cache in manifest.caches}
    if manifest.notes and (directory / MANIFEST).exists():
        _write_manifest(directory, manifest.caches)
    deleted = []
    for path in directory.iterdir():
        if not _OURS.fullmatch(path.name) or path.name in listed:
            continue
        try:
            if now - path.stat().st_mtime < min_age:
                continue
            path.unlink()
        except OSError:
            continue
        deleted.append(path.name)
    return manifest, sorted(deleted)


def forget_saved(directory: str | os.PathLike[str], caches: Sequence[SavedCache]) -> None:
    """Takes these caches out of the manifest, then deletes their files (what `over_budget` chose)."""
    directory = Path(directory)
    gone = {cache.file_name for cache in caches}
    _write_manifest(directory, [old for old in read_manifest(directory).caches if old.file_name not in gone])
    for name in gone:
        (directory / name).unlink(missing_ok=True)
