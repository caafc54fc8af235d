"""The `gguf` package's constants (ggml's types, their block sizes, GGUF's value types), imported
when first needed: importing gguf loads numpy, 70 ms and about 12 MB that every `swaplab`
command and the router would pay for a config that never reads a GGUF file."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def constants() -> ModuleType:
    import gguf.constants

    return gguf.constants
