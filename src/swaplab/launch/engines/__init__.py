"""The engines, one module each, and the registry that finds them.

A module here is named after its engine (`engine = "vllm"` is `vllm.py`) and defines
`ENGINE`, an object implementing swaplab.launch.engine.Engine. The registry imports every
module of this package, so adding an engine is adding its module: nothing else names it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from swaplab.launch.engine import Engine


@functools.cache
def registry() -> Mapping[str, Engine]:
    """Every engine of this package by name, in the order they are listed for people."""
    found: list[Engine] = []
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        engine: Engine | None = getattr(module, "ENGINE", None)
        if engine is None or engine.name != module_info.name:
            raise TypeError(f"{module.__name__} must define ENGINE, an Engine named {module_info.name!r}")
        found.append(engine)
    return MappingProxyType({engine.name: engine for engine in sorted(found, key=lambda engine: engine.order)})


def engine_names() -> tuple[str, ...]:
    """The known engines' names, as listed for people."""
    return tuple(registry())


def get_engine(name: str) -> Engine:
    """The engine `name`; KeyError when there is none."""
    return registry()[name]
