"""Hostile multipart forms (issue 38), on both front doors (the lane and aiohttp's): each is a 400
that says why, the router goes on answering, and a real transcription client still reaches its model."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from conftest import write_config
from procs import SIM, Router
from routerclient import running

CONFIG = f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
"""
TRANSCRIPTIONS = "/v1/audio/transcriptions"
# Generous: only what ends a test whose router never answers, never what it asserts.
ANSWER_BOUND = 60


@pytest.fixture(scope="module", params=["on", "off"], ids=["lane", "aiohttp"])
def router(request, tmp_path_factory):
    """One router per front door for every case here: none of them changes its state."""
    directory = tmp_path_factory.mktemp(f"multipart-{request.param}")
    router = Router(write_config(directory, CONFIG), directory, env={"SWAPLAB_LANE": request.param})
    yield router
    router.close()


def _part(name: str, value: bytes, boundary: bytes = b"XyZ", headers: bytes = b"") -> bytes:
    return (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="' + name.encode() + b'"\r\n' + headers
            + b"\r\n" + value + b"\r\n")


def _form(*parts: bytes, boundary: bytes = b"XyZ") -> bytes:
    return b"".join(parts) + b"--" + boundary + b"--\r\n"


async def _open(port: int, content_type: bytes, body: bytes, path: str = TRANSCRIPTIONS):
    """A connection with one request written byte for byte (headers aiohttp's client would not send as they are)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: "
                 + content_type + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, bytes]:
    """The status and body of the answer on a `Connection: close` request."""
    try:
        raw = await asyncio.wait_for(reader.read(), ANSWER_BOUND)
    finally:
        writer.close()
    head, _, content = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), content


async def _refusal(port: int, content_type: bytes, body: bytes) -> tuple[int, str]:
    status, content = await _answer(*await _open(port, content_type, body))
    try:
        return status, json.loads(content)["error"]["message"]
    except (ValueError, KeyError):
        return status, content.decode(errors="replace")


# 30,000 parts in 1.7 MB, none named `model`: what stalled every client for 16 s.
MANY_PARTS = _form(*(_part(f"f{index}", b"x") for index in range(30_000)))


async def test_a_form_of_30k_parts_is_a_400_and_health_answers_while_it_is_handled(router):
    assert MANY_PARTS.count(b"--XyZ\r\n") == 30_000
    hostile = await _open(router.port, b"multipart/form-data; boundary=XyZ", MANY_PARTS)
    # The probe leaves once the whole hostile body is written, before its answer is read.
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/health", timeout=aiohttp.ClientTimeout(total=ANSWER_BOUND)) as response:
            assert response.status == 200
    status, content = await _answer(*hostile)
    assert (status, json.loads(content)["error"]["message"]) == (400, "the form has more than 1000 parts")
    # At the bound the form is read, and names its model (as the sim's 404 for the route shows).
    bounded = _form(*(_part(f"f{index}", b"x") for index in range(999)), _part("model", b"nosuch"))
    status, said = await _refusal(router.port, b"multipart/form-data; boundary=XyZ", bounded)
    assert status == 404 and said.startswith("model 'nosuch' not found"), said


NESTED = _form(_part("file", b"--Inner\r\n\r\nx\r\n--Inner--", headers=b"Content-Type: multipart/mixed; boundary=Inner\r\n"))
DEEP = b"".join(b"--B%d\r\nContent-Type: multipart/mixed; boundary=B%d\r\n\r\n" % (depth, depth + 1) for depth in range(2000))


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        ("multipart/form-data; boundary=\u00e9\u00e9".encode(), _form(_part("model", b"a", "\u00e9\u00e9".encode()),
                                                                     boundary="\u00e9\u00e9".encode()),
         "the header parameter 'boundary' is neither a token nor a quoted string"),
        ('multipart/form-data; boundary="\u00e9\u00e9"'.encode(), _form(_part("model", b"a", "\u00e9\u00e9".encode()),
                                                                       boundary="\u00e9\u00e9".encode()),
         "the multipart boundary '\u00e9\u00e9' is not 1 to 70 of the ASCII letters"),
        (b"multipart/form-data; boundary=XyZ", NESTED, "part 1 is itself multipart (multipart/mixed; boundary=Inner)"),
        (b"multipart/form-data; boundary=B0", DEEP, "part 1 is itself multipart (multipart/mixed; boundary=B1)"),
        (b"multipart/form-data; boundary=XyZ",
         _form(b"--XyZ\r\nContent-Disposition: form-data; x=" + b"(" * 5000 + b'; name="model"\r\n\r\na\r\n'),
         "the header parameter 'x' is neither a token nor a quoted string"),
        (b"multipart/form-data; boundary=XyZ; x=" + b"(" * 5000, _form(_part("model", b"a")),
         "the header parameter 'x' is neither a token nor a quoted string"),
        (b"multipart/form-data; boundary=XyZ", _form(_part("model", b"a"), b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n"),
         "part 2 has no name: each part needs a Content-Disposition of form-data with a name (RFC 7578)"),
        (b"multipart/form-data; boundary=XyZ", _part("model", b"a"), "the form ends inside part 1: no closing --XyZ--"),
        (b"multipart/form-data; boundary=XyZ", b"--XyZ\r\nX: " + b"y" * 9000 + b"\r\n\r\n",
         "part 1's headers are longer than 8190 bytes"),
    ],
    ids=["non-ascii-boundary", "non-ascii-quoted-boundary", "nested", "deep", "5000-parens-in-a-part",
         "5000-parens-in-content-type", "part-without-name", "no-closing-delimiter", "long-part-headers"],
)
async def test_a_malformed_form_is_a_400_that_says_why(router, content_type, body, message):
    before = len(router.output())
    status, said = await _refusal(router.port, content_type, body)
    assert (status, said[: len(message)]) == (400, message), said
    added = router.output()[before:]
    assert "Traceback" not in added and "Error handling request" not in added, added


async def test_the_openai_sdk_s_transcription_reaches_the_model(router):
    client = openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    async with client:
        # The sim has no transcription endpoint: a 404 from *the sim*, with its model started for it,
        # proves the form was read and routed (the router's own 404 names an unknown model).
        with pytest.raises(openai.NotFoundError) as missing:
            await client.audio.transcriptions.create(model="a", file=("a.wav", b"RIFF" + b"\x00" * 70_000, "audio/wav"))
    assert "model 'a' not found" not in str(missing.value)
    async with aiohttp.ClientSession() as session:
        assert (await running(session, router.url))["a"]["state"] == "ready"


def test_only_a_large_form_is_parsed_in_a_thread():
    from swaplab.router.path.targets import OFF_LOOP_BYTES, reads_off_loop

    large, small = b"x" * (OFF_LOOP_BYTES + 1), b"x" * OFF_LOOP_BYTES
    assert reads_off_loop("multipart/form-data; boundary=XyZ", large)
    assert reads_off_loop("Application/X-WWW-Form-Urlencoded", large)
    assert not reads_off_loop("multipart/form-data; boundary=XyZ", small)
    for json_type in ("application/json", None, "application/vnd.api+json"):  # the hot path stays on the loop
        assert not reads_off_loop(json_type, b"x" * (8 * OFF_LOOP_BYTES))


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        # A preamble, bare LF line ends, an empty value and an epilogue, as Go's reader takes them.
        (b"preamble\n--XyZ\nContent-Disposition: form-data; name=model\n\nm\n--XyZ\n"
         b'Content-Disposition: form-data; name="e"\n\n\n--XyZ--\nepilogue', [("model", b"m"), ("e", b"")]),
        # The boundary's text inside a value, on a line of more than the boundary, is the value's.
        (b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\n'
         b"\x00--XyZ\r\n--XyZabc\r\n--XyZ \r\nContent-Disposition: form-data; name=\"mo\\\"del\"\r\n\r\nm\r\n--XyZ--",
         [("file", b"\x00--XyZ\r\n--XyZabc"), ('mo"del', b"m")]),
        (b"".join(_part(f"f{index}", b"x") for index in range(1000)) + b"--XyZ--", [(f"f{index}", b"x") for index in range(1000)]),
    ],
    ids=["lf-preamble-empty-epilogue", "boundary-text-in-a-value", "1000-parts"],
)
def test_form_fields_finds_each_named_value(body, fields):
    from swaplab.router.path.multipart import form_fields

    found = form_fields("multipart/form-data; boundary=XyZ", body)
    assert [(field.name, body[field.start:field.end]) for field in found] == fields


def test_a_content_type_without_a_boundary_is_not_read_as_a_form():
    from swaplab.router.path.multipart import form_fields

    assert form_fields("multipart/form-data", b"--XyZ--") is None
    assert form_fields("multipart/form-data; boundary=", b'{"model": "a"}') is None
