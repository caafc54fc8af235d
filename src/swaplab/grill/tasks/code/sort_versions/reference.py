import re

VERSION = re.compile(
    r"v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)


def _key(version: str):
    match = VERSION.fullmatch(version)
    if match is None:
        raise ValueError(f"not a semantic version: {version!r}")
    major, minor, patch, prerelease = match.groups()
    release = (int(major), int(minor), int(patch))
    if prerelease is None:
        return (release, 1, ())
    identifiers = tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in prerelease.split(".")
    )
    return (release, 0, identifiers)


def sort_versions(versions: list[str]) -> list[str]:
    return sorted(versions, key=_key)
