"""llama.cpp's slots in the sim: a per-slot prompt cache, and `/slots` with save, restore and erase.

A router that saves a model's KV cache on eviction and restores it on start is tested against
these. The choices are pure functions (`common_prefix`, `choose_slot`, `check_filename`,
`encode_slot_file`, `decode_slot_file`); `Slots` owns the slots' tokens, the save counts and the
fault in force, and serves the HTTP side (`--parallel`, `--slot-save-path`, `--slot-fault`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from aiohttp import web

from swaplab.errors import SwaplabError
from swaplab.sim import chunks
from swaplab.sim.request import BadRequest, json_body

SlotFault = Literal[
    "none", "save-error", "save-hang", "restore-error", "restore-corrupt", "restore-hang", "restore-crash"
]
SLOT_FAULTS: tuple[SlotFault, ...] = get_args(SlotFault)

# What `/slots` reports as each slot's context size; the sim never runs out of it.
N_CTX = 4096
# A slot file's first line: a file without it was not written by the sim.
FILE_MAGIC = b"swaplab-sim-slot 1\n"
# The tokens a `restore-corrupt` fault leaves in the slot: garbage no prompt shares.
CORRUPT_TOKEN = "\x00corrupt"

# llama.cpp's own messages, so a client's error handling meets what it will meet there.
NOT_ENABLED = "This server does not support slots action. "  # llama.cpp answers 501 with this
INVALID_FILENAME = "Invalid filename"
INVALID_SLOT = "Invalid slot ID"
RESTORE_FAILED = "Unable to restore slot, no available space in KV cache or invalid slot save file"


class SlotFileError(Exception):
    """A slot file the sim cannot restore: missing, truncated, or not written by the sim."""


def check_settings(parallel: int, slot_save_path: str | None, slot_fault: str) -> None:
    """Refuse a slot count, save path or fault the sim cannot serve."""
    if parallel < 1:
        raise SwaplabError("sim: --parallel must be at least 1")
    if slot_fault not in SLOT_FAULTS:
        raise SwaplabError(f"sim: --slot-fault must be one of {', '.join(SLOT_FAULTS)}, not {slot_fault!r}")
    if slot_fault != "none" and slot_save_path is None:
        raise SwaplabError("sim: --slot-fault needs --slot-save-path: without it save and restore are refused anyway")


def common_prefix(first: Sequence[str], second: Sequence[str]) -> int:
    """How many leading tokens the two share."""
    count = 0
    for a, b in zip(first, second):
        if a != b:
            break
        count += 1
    return count


def choose_slot(cached: Sequence[Sequence[str]], busy: Sequence[bool], prompt: Sequence[str]) -> int:
    """The slot a request without `id_slot` gets: of the idle ones (all, when none is idle), the one
    sharing the longest prefix with `prompt`, else the first; as llama.cpp's prompt-similarity pick."""
    candidates = [index for index, taken in enumerate(busy) if not taken] or list(range(len(cached)))
    return max(candidates, key=lambda index: (common_prefix(cached[index], prompt), -index))


def check_filename(filename: Any) -> str:
    """A save or restore body's filename, refused (BadRequest) when it could leave the save directory."""
    if (
        not isinstance(filename, str)
        or not filename
        or filename in (".", "..")
        or ".." in filename
        or any(separator in filename for separator in ("/", "\\", "\x00"))
        or filename != filename.strip()
    ):
        raise BadRequest(INVALID_FILENAME)
    return filename


def encode_slot_file(tokens: Sequence[str]) -> bytes:
    """A slot file's bytes: the magic line, then the tokens as JSON with their count."""
    return FILE_MAGIC + json.dumps({"n_tokens": len(tokens), "tokens": list(tokens)}).encode()


def decode_slot_file(data: bytes) -> list[str]:
    """The tokens of a slot file; SlotFileError when it is not one the sim wrote whole."""
    if not data.startswith(FILE_MAGIC):
        raise SlotFileError("not a slot file written by the sim")
    try:
        document = json.loads(data[len(FILE_MAGIC) :])
    except ValueError:
        raise SlotFileError("truncated or corrupt slot file") from None
    tokens = document.get("tokens") if isinstance(document, dict) else None
    if (
        not isinstance(tokens, list)
        or not all(isinstance(token, str) for token in tokens)
        or document.get("n_tokens") != len(tokens)
    ):
        raise SlotFileError("truncated or corrupt slot file")
    return tokens


@dataclass
class SlotCounts:
    """Slot actions completed (not those refused or faulted)."""

    slot_saves: int = 0
    slot_restores: int = 0
    slot_erases: int = 0


@dataclass
class Slots:
    """The sim's slots: what each holds, whether it is processing, and the save directory's traffic."""

    parallel: int = 1
    save_path: Path | None = None
    fault: SlotFault = "none"
    counts: SlotCounts = field(default_factory=SlotCounts)
    tokens: list[tuple[str, ...]] = field(init=False)
    busy: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = [()] * self.parallel
        self.busy = [False] * self.parallel

    def routes(self) -> list[web.RouteDef]:
        """`GET /slots` and `POST /slots/{id}?action=save|restore|erase`."""
        return [web.get("/slots", self._list), web.post("/slots/{id}", self._action)]

    def stats(self) -> dict[str, int]:
        """The slot fields of `/sim/stats`: none without a save path, where no action can be counted."""
        return asdict(self.counts) if self.save_path is not None else {}

    # -- generation --------------------------------------------------------

    def begin(self, prompt: Sequence[str], id_slot: int | None) -> tuple[int, int]:
        """Take a slot for a request: (slot, prompt tokens it already holds); BadRequest for an unknown id_slot."""
        if id_slot is None:
            slot = choose_slot(self.tokens, self.busy, prompt)
        elif id_slot < self.parallel:
            slot = id_slot
        else:
            raise BadRequest(f"{INVALID_SLOT}: {id_slot} (the sim has {self.parallel})")
        cached = common_prefix(self.tokens[slot], prompt)
        self.busy[slot] = True
        self.tokens[slot] = tuple(prompt)  # the prefill is done once the first token is due
        return slot, cached

    def end(self, slot: int, answer: Sequence[str]) -> None:
        """Release a slot: it keeps the prompt and the answer's tokens generated so far."""
        self.tokens[slot] = self.tokens[slot] + tuple(answer)
        self.busy[slot] = False

    # -- HTTP --------------------------------------------------------------

    async def _list(self, request: web.Request) -> web.Response:
        # As llama.cpp's server lists them: a slot that has held a task says how many tokens.
        return web.json_response([
            {"id": index, "n_ctx": N_CTX, "is_processing": self.busy[index], "prompt": " ".join(tokens),
             **({"n_prompt_tokens": len(tokens), "next_token": [{"n_decoded": 0}]} if tokens else {})}
            for index, tokens in enumerate(self.tokens)
        ])

    async def _action(self, request: web.Request) -> web.Response:
        if self.save_path is None:
            return _error(501, NOT_ENABLED)
        try:
            slot = int(request.match_info["id"])
        except ValueError:
            return _error(400, INVALID_SLOT)
        if not 0 <= slot < self.parallel:
            return _error(400, INVALID_SLOT)
        action = request.query.get("action")
        if action == "erase":
            erased = len(self.tokens[slot])
            self.tokens[slot] = ()
            self.counts.slot_erases += 1
            return web.json_response({"id_slot": slot, "n_erased": erased})
        if action not in ("save", "restore"):
            return _error(400, "Invalid action")
        try:
            body = await json_body(request)
            filename = check_filename(body.get("filename") if isinstance(body, dict) else None)
        except BadRequest as bad:
            return _error(400, str(bad))
        if action == "save":
            return await self._save(slot, self.save_path / filename, filename)
        return await self._restore(slot, self.save_path / filename, filename)

    async def _save(self, slot: int, path: Path, filename: str) -> web.Response:
        if self.fault == "save-error":
            _log("slot save: injecting fault 'save-error'")
            return _error(500, "simulated slot save failure (fault 'save-error')")
        if self.fault == "save-hang":
            _log("slot save: injecting fault 'save-hang'")
            # Never answered, nothing written: the wait ends when the client leaves.
            await asyncio.get_running_loop().create_future()
        started = asyncio.get_running_loop().time()
        tokens = self.tokens[slot]
        data = encode_slot_file(tokens)
        # Written whole under a temporary name, then renamed: a reader never sees half a file.
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        temporary.write_bytes(data)
        os.replace(temporary, path)
        self.counts.slot_saves += 1
        return web.json_response({
            "id_slot": slot, "filename": filename, "n_saved": len(tokens), "n_written": len(data),
            "timings": {"save_ms": _elapsed_ms(started)},
        })

    async def _restore(self, slot: int, path: Path, filename: str) -> web.Response:
        if self.fault == "restore-error":
            _log("slot restore: injecting fault 'restore-error'")
            return _error(500, "simulated slot restore failure (fault 'restore-error')")
        if self.fault == "restore-hang":
            _log("slot restore: injecting fault 'restore-hang'")
            await asyncio.get_running_loop().create_future()  # never answered; the slot stays as it was
        if self.fault == "restore-crash":
            # What a server that chokes on a file does: it dies mid-restore, with no answer.
            _log("slot restore: injecting fault 'restore-crash': exiting")
            sys.stdout.flush()
            os._exit(70)
        started = asyncio.get_running_loop().time()
        try:
            data = path.read_bytes()
            tokens = decode_slot_file(data)
        except (OSError, SlotFileError) as error:
            # As llama.cpp: a failed restore leaves the slot empty.
            self.tokens[slot] = ()
            _log(f"slot restore: {filename}: {error}")
            return _error(400, RESTORE_FAILED)
        if self.fault == "restore-corrupt":
            # Answers as if all went well, but the slot holds garbage: only a follow-up's cache_n tells.
            _log("slot restore: injecting fault 'restore-corrupt'")
            self.tokens[slot] = (CORRUPT_TOKEN,) * len(tokens)
        else:
            self.tokens[slot] = tuple(tokens)
        self.counts.slot_restores += 1
        return web.json_response({
            "id_slot": slot, "filename": filename, "n_restored": len(tokens), "n_read": len(data),
            "timings": {"restore_ms": _elapsed_ms(started)},
        })


def _elapsed_ms(started: float) -> float:
    return round((asyncio.get_running_loop().time() - started) * 1000, 3)


def _error(status: int, message: str) -> web.Response:
    return web.json_response(chunks.error_body(status, message), status=status)


def _log(line: str) -> None:
    # Rare events, on stderr, where a router's /logs shows them.
    print(f"sim: {line}", file=sys.stderr, flush=True)
