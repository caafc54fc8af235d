"""argparse types the commands share: comma-separated lists of numbers, a `HOST:PORT`."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """`1,2,4` -> [1, 2, 4]."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None


def float_list(text: str) -> list[float]:
    """`0.1,0.5` -> [0.1, 0.5]."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


_UNITS = {
    "": 1024**3, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3, "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}


def size_list(text: str) -> list[int]:
    """`16GiB,8GiB` -> bytes each; a bare number is GiB; KB/MB/GB are decimal, KiB/MiB/GiB binary."""
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        number = part.rstrip("KMGTkmgtiIbB ")
        unit = part[len(number):].strip().lower()
        try:
            value = float(number)
        except ValueError:
            value = -1.0
        if unit not in _UNITS or not value > 0:
            raise argparse.ArgumentTypeError(f"expected sizes like 16GiB,8GiB separated by commas, got {part!r}")
        sizes.append(int(value * _UNITS[unit]))
    if not sizes:
        raise argparse.ArgumentTypeError("expected at least one size, like 16GiB")
    return sizes


def host_port(text: str) -> tuple[str, int]:
    """`HOST:PORT` (or `:PORT`, on 127.0.0.1)."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)
