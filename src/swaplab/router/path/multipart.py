"""A multipart/form-data body read within bounds, no I/O: where each named field's value lies.

The router reads a form only to find (and at times rename) its `model` field; the rest goes
to the model as it came. So this finds the parts' spans without copying them, and refuses,
with a message that says why, what a real client never sends: more parts than Go's
`mime/multipart` takes (`ReadForm`'s 1,000, the limit llama-swap's Go inherits), a part's
headers past the request-line limit aiohttp applies to the request itself, a part that is
itself multipart, a part without a name, a boundary RFC 2046 does not allow. Every step is
linear in the body: no recursion, no parser that a crafted header can make quadratic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_PARTS = 1000
"""Go's `mime/multipart` default (`multipartmaxparts`); the openai SDK's transcription sends a handful."""
MAX_PART_HEADER_BYTES = 8190
"""One part's header block, the size aiohttp allows a request line or header line."""
MAX_BOUNDARY = 70
"""RFC 2046's longest boundary; real clients send 16 to 60 characters."""
# A boundary's characters as RFC 2046's `bchars` (a space only inside).
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_HEADERS_END = re.compile(rb"\n\r?\n")
# RFC 9110's `tchar`: what an unquoted parameter value may hold.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A quoted string, its `\` escapes unrolled so that the match is one linear pass.
_QUOTED = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


class MalformedForm(ValueError):
    """A multipart body the router does not read; the message says what is wrong."""


@dataclass(frozen=True)
class Field:
    """A form part's name and where its value lies in the body (`body[start:end]`)."""

    name: str
    start: int
    end: int


def header_parameter(value: str, name: str) -> str | None:
    """Parameter `name` of a header such as `form-data; name="model"` (the first of that name).

    Each value is a token or a quoted string (RFC 9110), all of them read: MalformedForm for one
    that is neither, as Go's `mime.ParseMediaType` refuses the whole header."""
    index, length = value.find(";"), len(value)
    chosen = None
    if index < 0:
        return None
    while index < length:
        index += 1  # past the `;`
        while index < length and value[index] in " \t;":
            index += 1
        if index >= length:
            break
        equals = value.find("=", index)
        semicolon = value.find(";", index)
        if equals < 0 or 0 <= semicolon < equals:
            shown = value[index:semicolon if semicolon >= 0 else length]
            raise MalformedForm(f"the header parameter {shown[:80]!r} has no value (in {value[:80]!r})")
        key = value[index:equals].strip().lower()
        index = equals + 1
        while index < length and value[index] in " \t":
            index += 1
        if value.startswith('"', index):
            quoted = _QUOTED.match(value, index)
            if quoted is None:
                raise MalformedForm(f"a quoted header parameter never ends (in {value[:80]!r})")
            found = _ESCAPE.sub(r"\1", quoted.group(1))
            index = quoted.end()
            while index < length and value[index] in " \t":
                index += 1
            if index < length and value[index] != ";":
                raise MalformedForm(f"text follows the quoted parameter {key!r} (in {value[:80]!r})")
        else:
            semicolon = value.find(";", index)
            stop = semicolon if semicolon >= 0 else length
            found = value[index:stop].strip()
            if found and not _TOKEN.fullmatch(found):  # empty: as if absent (`boundary=`)
                raise MalformedForm(
                    f"the header parameter {key[:40]!r} is neither a token nor a quoted string: {found[:40]!r}"
                    f"{'...' if len(found) > 40 else ''}"
                )
            index = stop
        if key == name and chosen is None:
            chosen = found
    return chosen


def form_fields(content_type: str, body: bytes) -> list[Field] | None:
    """The named parts of a multipart/form-data body, in order; None when the Content-Type names no boundary
    (the body is then not read as a form). MalformedForm says what is wrong with a form that is refused."""
    boundary = header_parameter(content_type, "boundary")
    if not boundary:
        return None
    if not _BOUNDARY.fullmatch(boundary):
        raise MalformedForm(
            f"the multipart boundary {boundary[:80]!r} is not 1 to {MAX_BOUNDARY} of the ASCII letters, digits and "
            "'()+_,-./:=? that RFC 2046 allows"
        )
    delimiter = b"\n--" + boundary.encode()
    position = -1 if body.startswith(delimiter[1:]) else _next_delimiter(body, delimiter, 0)
    if position is None:
        raise MalformedForm(f"the body holds no part: no line starts with its boundary --{boundary}")
    fields: list[Field] = []
    number = 0
    while True:
        after = position + len(delimiter)
        if body.startswith(b"--", after):
            return fields
        number += 1
        if number > MAX_PARTS:
            raise MalformedForm(f"the form has more than {MAX_PARTS} parts")
        line_end = body.find(b"\n", after)
        if line_end < 0 or body[after:line_end].strip(b" \t\r"):
            raise MalformedForm(f"the line of part {number}'s boundary holds more than --{boundary}")
        headers_end = _HEADERS_END.search(body, line_end, line_end + MAX_PART_HEADER_BYTES + 3)
        if headers_end is None:
            if len(body) - line_end > MAX_PART_HEADER_BYTES:
                raise MalformedForm(f"part {number}'s headers are longer than {MAX_PART_HEADER_BYTES} bytes")
            raise MalformedForm(f"part {number}'s headers never end (no empty line after them)")
        name = _part_name(body[line_end + 1:headers_end.start()], number)
        start = headers_end.end()
        following = _next_delimiter(body, delimiter, start - 1)
        if following is None:
            raise MalformedForm(f"the form ends inside part {number}: no closing --{boundary}--")
        end = following - 1 if body[following - 1:following] == b"\r" else following
        fields.append(Field(name, start, max(start, end)))
        position = following


def _next_delimiter(body: bytes, delimiter: bytes, start: int) -> int | None:
    """Where the next line holding only the boundary (or the closing one) begins, at its `\\n`."""
    while True:
        found = body.find(delimiter, start)
        if found < 0:
            return None
        after = found + len(delimiter)
        if body.startswith(b"--", after):
            return found
        line_end = body.find(b"\n", after)
        if line_end >= 0 and not body[after:line_end].strip(b" \t\r"):
            return found
        start = found + 1  # the boundary's text inside a value: RFC 2046 lets a line start with more


def _part_name(block: bytes, number: int) -> str:
    """The form name a part's headers give it; MalformedForm for a nameless or multipart part."""
    disposition = content_type = None
    for line in block.decode(errors="replace").split("\n"):
        line = line.rstrip("\r")
        if not line:
            continue
        header, colon, value = line.partition(":")
        if not colon:
            raise MalformedForm(f"part {number} has a header line without a colon: {line[:80]!r}")
        header = header.strip().lower()
        if header == "content-disposition":
            disposition = value.strip()
        elif header == "content-type":
            content_type = value.strip()
    if content_type is not None and content_type.lower().startswith("multipart/"):
        raise MalformedForm(f"part {number} is itself multipart ({content_type[:80]}): nested forms are not read")
    name = header_parameter(disposition, "name") if disposition is not None else None
    if not name:
        raise MalformedForm(
            f"part {number} has no name: each part needs a Content-Disposition of form-data with a name (RFC 7578)"
        )
    return name
