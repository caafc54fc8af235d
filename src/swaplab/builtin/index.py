"""A pinned wheel from a Python package index (PyPI's simple API, or a mirror), verified as it downloads.

The index is the one pip would use: `SWAPLAB_INDEX_URL`, else pip's own `PIP_INDEX_URL`,
else PyPI. A project's page there (PEP 691 JSON or PEP 503 HTML) names each file with its
sha256; a file the index gives no sha256 for is refused, and a download whose bytes do
not match is deleted. Nothing an index sends is taken unbounded: a page past `PAGE_BYTES`,
a download past the size the page declares (PEP 700's `size`), its `Content-Length` or the
caller's ceiling, and a file name that is not a plain name are refused, nothing kept.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from swaplab.errors import SwaplabError

DEFAULT_INDEX_URL = "https://pypi.org/simple/"
SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
CHUNK_BYTES = 1024 * 1024
TIMEOUT_SECONDS = 30.0
PAGE_BYTES = 32 * 1024 * 1024
"""The most a project's page may be (PyPI's largest run to a few MiB)."""


class IndexUnavailable(SwaplabError):
    """The index could not be reached, or had no usable file."""


class DigestMismatch(SwaplabError):
    """A download's bytes are not what the index's sha256 says."""


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str
    size: int | None = None
    """Bytes, where the page says (PEP 700's `size` in a JSON page)."""


def index_url() -> str:
    """The simple API's root: `SWAPLAB_INDEX_URL`, else `PIP_INDEX_URL`, else PyPI's."""
    url = os.environ.get("SWAPLAB_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX_URL
    return url if url.endswith("/") else url + "/"


def normalized(project: str) -> str:
    """PEP 503's name for a project's page (`Gemma3_270M` -> `gemma3-270m`)."""
    return re.sub(r"[-_.]+", "-", project).lower()


def project_url(project: str, index: str | None = None) -> str:
    return urllib.parse.urljoin(index or index_url(), normalized(project) + "/")


class _Links(HTMLParser):
    """The `<a href>` links of a PEP 503 page, with their text (the file name)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_project_page(body: bytes, content_type: str, page_url: str) -> list[IndexFile]:
    """The files a simple-API page lists, with absolute URLs; those without a sha256 are left out."""
    files = []
    if "json" in content_type:
        for entry in json.loads(body).get("files", []):
            digest = (entry.get("hashes") or {}).get("sha256")
            size = entry.get("size")
            size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
            if digest:
                files.append(IndexFile(entry["filename"], urllib.parse.urljoin(page_url, entry["url"]), digest.lower(), size))
        return files
    parser = _Links()
    parser.feed(body.decode("utf-8", errors="replace"))
    for href, text in parser.links:
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        algorithm, _, digest = fragment.partition("=")
        name = text or urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if algorithm == "sha256" and digest:
            files.append(IndexFile(name, url, digest.lower()))
    return files


def _open(url: str, accept: str | None = None):
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS)


def find_wheel(project: str, version: str, index: str | None = None) -> IndexFile:
    """The pure-Python wheel of `project==version` on the index, with its sha256."""
    page = project_url(project, index)
    try:
        with _open(page, SIMPLE_ACCEPT) as response:
            body, content_type = response.read(PAGE_BYTES + 1), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        raise IndexUnavailable(f"{page} answered {error.code}: the index has no {project}") from None
    except (OSError, http.client.HTTPException) as error:
        raise IndexUnavailable(f"{page} unreachable ({getattr(error, 'reason', error)})") from None
    if len(body) > PAGE_BYTES:
        raise IndexUnavailable(f"{page} is longer than {PAGE_BYTES >> 20} MiB: not a project's page; refused")
    prefix = f"{normalized(project).replace('-', '_')}-{version}-"
    for file in parse_project_page(body, content_type, page):
        if file.filename.lower().startswith(prefix) and file.filename.endswith(".whl"):
            return file
    raise IndexUnavailable(f"{page} lists no wheel of {project} {version} with a sha256")


def plain_name(name: str, where: str) -> str:
    """`name` where it is a plain file name, to be used as one; refused where it could name another place."""
    if not name or name == "." or any(bad in name for bad in ("/", "\\", "..", "\0")):
        raise IndexUnavailable(f"{where} names a file {name!r}: not a plain file name (a '/', '\\', '..' or NUL); refused")
    return name


def download(
    file: IndexFile, folder: Path, on_bytes: Callable[[int, int | None], None] | None = None, *, most: int,
) -> Path:
    """`file` into `folder` under its own name, hashed on the way: a `.partial` renamed only when
    its sha256 is the index's, deleted otherwise (and on any interruption). It may be no longer
    than `most` bytes, the size the page declares or its `Content-Length`: past the smallest of
    them the download stops and is refused."""
    plain_name(file.filename, file.url)
    folder.mkdir(parents=True, exist_ok=True)
    descriptor, partial_name = tempfile.mkstemp(dir=folder, prefix=f".{file.filename}.", suffix=".partial")
    partial = Path(partial_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(descriptor, "wb") as out:
            try:
                with _open(file.url) as response:
                    length = response.headers.get("Content-Length")
                    total = int(length) if length and length.isdecimal() else None
                    bounds = {"bytes this file may take": most, "bytes the index declares": file.size,
                              "bytes of its Content-Length": total}
                    why, limit = min(((why, size) for why, size in bounds.items() if size is not None),
                                     key=lambda item: item[1])
                    done = 0
                    while block := response.read1(min(CHUNK_BYTES, limit + 1 - done)):  # what has arrived
                        done += len(block)
                        if done > limit:
                            raise IndexUnavailable(f"{file.url} sends more than the {limit} {why}; refused, nothing kept")
                        out.write(block)
                        digest.update(block)
                        if on_bytes:
                            on_bytes(done, total or file.size)
            except urllib.error.HTTPError as error:
                raise IndexUnavailable(f"{file.url} answered {error.code}") from None
            except (OSError, http.client.HTTPException) as error:  # unreachable, or cut off mid-file
                raise IndexUnavailable(f"{file.url} failed ({getattr(error, 'reason', None) or error!r})") from None
        if digest.hexdigest() != file.sha256:
            raise DigestMismatch(
                f"{file.url}: sha256 {digest.hexdigest()}, but the index says {file.sha256}; nothing was kept"
            )
        target = folder / file.filename
        partial.chmod(0o644)  # mkstemp's 0600 is for the partial file only
        partial.replace(target)
        return target
    finally:
        partial.unlink(missing_ok=True)
