"""The package map of docs/architecture.md holds: layers, no import cycle, files of one concept.

The contracts live in pyproject.toml ([tool.importlinter]); `make test` runs `lint-imports`
before pytest and this module runs it again, so a plain pytest run checks them too. The
broken-copy tests prove the contracts bite: each plants one forbidden import in a copy of
the package and expects lint-imports to name it.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "swaplab"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# Task fixtures the grill copies into sandboxes: data, not swaplab's code.
FIXTURE_DIRS = (PACKAGE / "grill" / "agent" / "data", PACKAGE / "grill" / "tasks")
LONGEST = 500
# Past this no module goes, one concept or not; nor a room of the router past a dozen modules (issue 39).
HARD_LONGEST = 600
ROOM_MODULES = 12


def lint_imports(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def test_the_import_contracts_are_kept(tmp_path):
    done = lint_imports(ROOT / "src", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        # A lower layer reaching up: the results store importing the router.
        ("results/__init__.py", "import swaplab.router.app\n", "Packages are layered"),
        # Two siblings of one layer importing each other: the launcher and the grill.
        ("launch/spec.py", "import swaplab.grill.outcome\n", "Packages are layered"),
        # A cycle inside a package: the client's server probe importing its HTTP client back.
        ("client/server.py", "import swaplab.client.http\n", "No import cycle"),
        # A room of the router reaching up: the front door importing the request path.
        ("router/door/guard.py", "import swaplab.router.path.forward\n", "The router's rooms are layered"),
        # Two rooms side by side: the router's own API importing Ollama's.
        ("router/api/listing.py", "import swaplab.router.ollama.handlers\n", "The router's rooms are layered"),
        # One stage of the request path calling another: the relay beating a heartbeat itself.
        ("router/relay/proxy.py", "import swaplab.router.relay.keepalive\n", "The request path's stages"),
        # The observation reaching into admission.
        ("router/watch/observe.py", "import swaplab.fleet.lease\n", "The request path's stages"),
    ],
)
def test_a_planted_import_breaks_its_contract(tmp_path, module, planted, contract):
    copy = tmp_path / "src" / "swaplab"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + "\n" + planted)
    done = lint_imports(tmp_path / "src", tmp_path)
    assert done.returncode != 0, done.stdout
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), done.stdout


def source_files() -> list[Path]:
    return sorted(
        path for path in PACKAGE.rglob("*.py")
        if not any(path.is_relative_to(folder) for folder in FIXTURE_DIRS)
    )


def test_a_file_over_500_lines_says_why_it_is_one_concept():
    long = []
    for path in source_files():
        lines = path.read_text().count("\n")
        if lines <= LONGEST:
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "one concept" not in docstring.lower():
            long.append(f"{path.relative_to(ROOT)}: {lines} lines, and its docstring does not say why it is one concept")
    assert not long, "\n".join(long)


def test_no_module_is_over_600_lines():
    long = [f"{path.relative_to(ROOT)}: {lines} lines" for path in source_files()
            if (lines := path.read_text().count("\n")) > HARD_LONGEST]
    assert not long, "\n".join(long)


def router_rooms() -> dict[str, list[str]]:
    """Each sub-package of the router and its modules."""
    return {
        init.parent.name: sorted(path.stem for path in init.parent.glob("*.py") if path.stem != "__init__")
        for init in sorted((PACKAGE / "router").glob("*/__init__.py"))
    }


def test_no_room_of_the_router_holds_more_than_a_dozen_modules():
    crowded = {room: modules for room, modules in router_rooms().items() if len(modules) > ROOM_MODULES}
    assert not crowded, crowded


def page_section(heading: str) -> str:
    page = (ROOT / "docs" / "architecture.md").read_text()
    start = page.index(f"\n## {heading}\n")
    end = page.find("\n## ", start + 1)
    return page[start:end if end >= 0 else len(page)]


def test_the_architecture_page_maps_the_rooms_that_exist_and_only_those():
    rooms = router_rooms()
    section = page_section("The router's rooms")
    named = set(re.findall(r"^\| `(\w+)/` \|", section, re.MULTILINE))
    assert named == set(rooms), f"named on the page: {sorted(named)}; in router/: {sorted(rooms)}"
    drawing = section.split("```")[1]
    undrawn = [room for room in rooms if not re.search(rf"(^|\| ){room}\b", drawing, re.MULTILINE)]
    assert not undrawn, f"rooms missing from the drawing: {undrawn}"
    for room, modules in rooms.items():
        row = next(line for line in section.splitlines() if line.startswith(f"| `{room}/` |"))
        unnamed = [module for module in modules if f"`{module}`" not in row and room not in ("translate", "ollama")]
        assert not unnamed, f"{room}/'s row does not name {unnamed}"


def test_every_package_the_map_names_exists():
    table = page_section("The package map")
    named = re.findall(r"^\| `(\w+)/?` \|", table, re.MULTILINE)
    missing = [name for name in named if not (PACKAGE / name).is_dir() and not (PACKAGE / f"{name}.py").is_file()]
    assert named and not missing, f"docs/architecture.md names what is not there: {missing}"


def test_the_architecture_page_names_every_package():
    page = (ROOT / "docs" / "architecture.md").read_text()
    packages = sorted(
        path.parent.name for path in PACKAGE.glob("*/__init__.py")
    ) + sorted(path.stem for path in PACKAGE.glob("*.py") if not path.stem.startswith("__"))
    missing = [name for name in packages if f"`{name}`" not in page and f"`{name}/`" not in page]
    assert not missing, f"docs/architecture.md does not describe: {', '.join(missing)}"
