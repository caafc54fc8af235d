"""Where the tests find the agent CLIs they drive (Codex, Claude Code), installed from npm."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

AGENT_CLIS = Path(os.environ.get("SWAPLAB_AGENT_CLIS") or Path(__file__).resolve().parent.parent / ".venv" / "agents")
"""The npm prefix the CLIs are installed under (`make agents`, which `make test` runs: `npm install --prefix`);
`SWAPLAB_AGENT_CLIS` names another."""


def agent_cli(name: str) -> tuple[Path | None, str]:
    """The installed CLI `name` (`codex`, `claude`) and "", or None and why a test of it must skip."""
    path = AGENT_CLIS / "node_modules" / ".bin" / name
    if not path.exists():
        return None, f"{name} is not installed: no {path} (`make agents` installs it from npm)"
    if path.resolve().suffix == ".js" and shutil.which("node") is None:
        return None, f"{path} is a Node.js script and node is not on PATH"
    return path, ""
