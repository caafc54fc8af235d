import re

VERSION = re.compile(
    r"v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)


def _key(version: str):
    # Near miss: pre-release identifiers are compared as text, so beta.11 sorts before beta.2.
    match = VERSION.fullmatch(version)
    if match is None:
        raise ValueError(f"not a semantic version: {version!r}")
    major, minor, patch, prerelease = match.groups()
    release = (int(major), int(minor), int(patch))
    if prerelease is None:
        return (release, 1, ())
    return (release, 0, tuple(prerelease.split(".")))


def sort_versions(versions: list[str]) -> list[str]:
    return sorted(versions, key=_key)
