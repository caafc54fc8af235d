"""A GGUF file's header walked within bounds: its metadata, vocabulary size and tensor table.

Every length and count is checked against the bytes left in the file before anything is
read or allocated; what llama.cpp's own reader (ggml/src/gguf.cpp) refuses is refused here
too (arrays of arrays, tensor names of 64 bytes or more, more than 4 dimensions, a negative
dimension, an unknown ggml type, an alignment that is not a power of two); and what the
walk keeps in memory has a budget. A hostile, truncated or merely odd file ends in a
`HeaderFault` saying what is wrong, which `memory.facts` turns into a `ModelFactsError`
naming the file: never a traceback, never an allocation the file's bytes do not pay for.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

from swaplab.memory.ggml import constants

MAX_ITEMS = 1 << 24
"""Keys, tensors and items of one array a header may declare (each also checked against the file's length)."""
KEEP_ARRAY = 65536
"""Longer arrays are skipped, their length kept (as the tokenizer's arrays always are)."""
KEEP_BYTES = 1 << 26
"""What the walk keeps in memory (keys, values, the tensor table), each item counted as at least
`ITEM_COST` bytes: values past it are left out, keys or tensors past it refuse the file."""
ITEM_COST = 64
"""About what one Python object and its reference cost."""
MAX_NAME = 64
"""ggml's GGML_MAX_NAME: a tensor's name is shorter."""
MAX_DIMS = 4
"""ggml's GGML_MAX_DIMS."""
_MIN_KEY_VALUE = 8 + 4 + 1  # a key's length, its type and the smallest value
_MIN_TENSOR = 8 + 4 + 4 + 8  # a name's length, the dimension count, the type and the offset
_FORMATS = {  # gguf's GGUFValueType names -> struct formats
    "UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i",
    "FLOAT32": "f", "BOOL": "?", "UINT64": "Q", "INT64": "q", "FLOAT64": "d",
}
_LAYER = re.compile(r"^blk\.(\d+)\.")


class HeaderFault(ValueError):
    """What is wrong with a GGUF header (the caller names the file)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str
    """ggml's name of its type: "F16", "Q4_K", "Q8_0"..."""
    n_bytes: int
    offset: int = 0
    """Where its data starts in the file (what a memory-mapped load spans)."""
    shape: tuple[int, ...] = ()
    """ggml's order: shape[0] is the row length, shape[1] the number of rows."""

    @property
    def layer(self) -> int | None:
        """The block index of a `blk.N.` tensor; None for the embeddings, output and norms."""
        match = _LAYER.match(self.name)
        return int(match.group(1)) if match else None


def read_header(file: BinaryIO, size: int) -> tuple[dict[str, Any], int, list[TensorInfo]]:
    """The metadata (the tokenizer's arrays left out), the vocabulary size and the tensors of the
    GGUF header at the start of `file`, a file of `size` bytes."""
    # gguf's GGUFReader builds a numpy view per element of every array: 8 s for Gemma 3's
    # 262,144-token vocabulary on one core, in the path of a model's start. This walk reads
    # the same format (gguf's constants name its types and block sizes) and skips the
    # tokenizer's arrays, keeping the tokens' count: 0.1 s.
    walk = _Walk(file, size)
    ggml = constants()
    magic, version = walk.numbers("<II", "the magic and version")
    if magic != ggml.GGUF_MAGIC:
        raise HeaderFault("not a GGUF file (it does not start with GGUF)")
    if version not in (2, 3):
        raise HeaderFault(f"GGUF version {version} (big-endian or unknown; llama.cpp reads 2 and 3)")
    n_tensors, n_kv = walk.numbers("<QQ", "the tensor and key counts")
    walk.count(n_kv, _MIN_KEY_VALUE, "keys")
    walk.count(n_tensors, _MIN_TENSOR, "tensors")
    metadata: dict[str, Any] = {}
    n_tokens = 0
    for _ in range(n_kv):
        key = walk.key()
        value, count = walk.value(walk.kind(key), key)
        if key == "tokenizer.ggml.tokens":
            n_tokens = count
        if value is not None and (not key.startswith("tokenizer.ggml.") or key == "tokenizer.ggml.model"):
            metadata[key] = value
    tensors = [walk.tensor(ggml) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", ggml.GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderFault(f"general.alignment is {alignment!r}, not a power of two (llama.cpp refuses the file)")
    start = (walk.at + alignment - 1) // alignment * alignment
    return metadata, n_tokens, [
        TensorInfo(name, kind, n_bytes, start + offset, dims) for name, kind, n_bytes, offset, dims in tensors
    ]


class _Walk:
    """A cursor over the header that knows how many bytes the file has left."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self.file = file
        self.size = size
        self.at = 0
        self.kept = 0
        self.types = constants().GGUFValueType

    def need(self, size: int, what: str) -> None:
        left = self.size - self.at
        if size > left:
            raise HeaderFault(f"the header ends early: {what} at byte {self.at} needs {size} bytes and the file has "
                              f"{left} left (a truncated or partial file?)")

    def take(self, size: int, what: str) -> bytes:
        self.need(size, what)
        data = self.file.read(size)
        if len(data) != size:
            raise HeaderFault(f"the header ends early at byte {self.at} (the file shrank while it was read?)")
        self.at += size
        return data

    def skip(self, size: int, what: str) -> None:
        self.need(size, what)
        self.file.seek(size, 1)
        self.at += size

    def numbers(self, fmt: str, what: str) -> tuple[Any, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))

    def number(self, fmt: str, what: str) -> Any:
        return self.numbers("<" + fmt, what)[0]

    def count(self, count: int, smallest: int, what: str) -> None:
        """A declared count the file's bytes can hold, `smallest` bytes each at least."""
        if count > MAX_ITEMS:
            raise HeaderFault(f"{count} {what} declared (a header holds at most {MAX_ITEMS}; not a GGUF file?)")
        left = self.size - self.at
        if count * smallest > left:
            raise HeaderFault(f"the header ends early: {count} {what} at byte {self.at} need {count * smallest} bytes "
                              f"or more and the file has {left} left (a truncated or partial file?)")

    def keep(self, cost: int) -> bool:
        """Whether `cost` more bytes fit the budget of what the walk keeps (and take them if so)."""
        if self.kept + cost > KEEP_BYTES:
            return False
        self.kept += cost
        return True

    def key(self) -> str:
        length = self.number("Q", "a key's length")
        self.need(length, "a key")
        if not self.keep(length + ITEM_COST):
            raise HeaderFault(f"its keys and values pass {KEEP_BYTES >> 20} MiB (not a model's header?)")
        return self.take(length, "a key").decode("utf-8", errors="replace")

    def kind(self, key: str) -> Any:
        code = self.number("I", f"{key}'s type")
        try:
            return self.types(code)
        except ValueError:
            raise HeaderFault(f"{key} has value type {code}, which GGUF does not have") from None

    def string(self, what: str) -> str | None:
        """A string value; None (skipped) where it would pass the budget."""
        length = self.number("Q", f"{what}'s length")
        self.need(length, what)
        if not self.keep(length + ITEM_COST):
            self.skip(length, what)
            return None
        return self.take(length, what).decode("utf-8", errors="replace")

    def value(self, kind: Any, key: str) -> tuple[Any, int]:
        """A value and, for arrays, its length (the value is None where it was skipped)."""
        if kind == self.types.STRING:
            return self.string(key), 0
        if kind != self.types.ARRAY:
            return self.number(_FORMATS[kind.name], key), 0
        item = self.kind(key)
        if item == self.types.ARRAY:
            raise HeaderFault(f"{key} is an array of arrays (llama.cpp's GGUF reader refuses them)")
        count = self.number("Q", f"{key}'s length")
        # The tokenizer's arrays are llama.cpp's vocabulary, not a fact swaplab reads.
        skip = count > KEEP_ARRAY or key.startswith("tokenizer.ggml.")
        if item == self.types.STRING:
            self.count(count, 8, f"strings in {key}")
            return self.strings(count, key, skip), count
        fmt = _FORMATS[item.name]
        width = struct.calcsize(fmt)
        self.count(count, width, f"items in {key}")
        if skip or not self.keep(count * (width + ITEM_COST)):
            self.skip(count * width, key)
            return None, count
        return list(struct.unpack(f"<{count}{fmt}", self.take(count * width, key))), count

    def strings(self, count: int, key: str, skip: bool) -> list[str] | None:
        """An array of strings: each one's length checked as it comes; None where it was skipped
        (all of it past the budget: a part of an array would say something else)."""
        values: list[str] | None = None if skip else []
        for _ in range(count):
            if values is None:
                self.skip(self.number("Q", f"a string's length in {key}"), key)
                continue
            value = self.string(key)
            if value is None:
                values = None
            else:
                values.append(value)
        return values

    def tensor(self, ggml: Any) -> tuple[str, str, int, int, tuple[int, ...]]:
        """One entry of the tensor table: name, ggml type, bytes, offset in the data, shape."""
        length = self.number("Q", "a tensor's name length")
        if length >= MAX_NAME:
            raise HeaderFault(f"a tensor name of {length} bytes at byte {self.at} (ggml's are shorter than {MAX_NAME})")
        if not self.keep(length + 4 * ITEM_COST):
            raise HeaderFault(f"its tensor table passes {KEEP_BYTES >> 20} MiB (not a model's header?)")
        name = self.take(length, "a tensor's name").decode("utf-8", errors="replace")
        n_dims = self.number("I", f"tensor {name}'s dimension count")
        if n_dims > MAX_DIMS:
            raise HeaderFault(f"tensor {name} has {n_dims} dimensions (ggml has at most {MAX_DIMS})")
        dims = self.numbers(f"<{n_dims}q", f"tensor {name}'s shape")
        if any(dim < 0 for dim in dims):
            raise HeaderFault(f"tensor {name} has a negative dimension {dims}")
        code = self.number("I", f"tensor {name}'s type")
        try:
            kind = ggml.GGMLQuantizationType(code)
            per_block, block_bytes = ggml.GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise HeaderFault(f"tensor {name} has ggml type {code}, which this gguf package does not know") from None
        elements = 1
        for dim in dims:
            elements *= dim
        if elements >= 1 << 63 or (dims[0] if dims else 1) % per_block:
            raise HeaderFault(f"tensor {name} of shape {dims} is not a {kind.name} tensor llama.cpp can hold")
        offset = self.number("Q", f"tensor {name}'s offset")
        return name, kind.name, elements // per_block * block_bytes, offset, tuple(dims)
