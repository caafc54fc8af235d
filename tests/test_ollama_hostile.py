"""Large and hostile bodies on Ollama's routes (issue 38): a body past 64 KiB (a 200 MiB image) is parsed,
translated and encoded in a thread while the router goes on answering; a bad image in it is still a 400
that says why, a good one reaches the backend whole, and its base64 is checked a piece at a time."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
from pathlib import Path

import aiohttp
import pytest

from conftest import write_config
from procs import SIM, Router, eventually
from test_hostile_multipart import _answer as answer_of
from test_hostile_multipart import _open as open_request
from routerclient import running

CONFIG = f"""
models:
  sim:
    cmd: {SIM} --port ${{PORT}} --model sim
  renamed:
    cmd: {SIM} --port ${{PORT}} --model renamed
    useModelName: upstream-name
"""
# Generous: only what ends a test whose router never answers, never what it asserts.
ANSWER_BOUND = 60
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """One router for every case here: none of them changes its state beyond loading its sims."""
    directory = tmp_path_factory.mktemp("ollama-hostile")
    router = Router(write_config(directory, CONFIG), directory)
    yield router
    router.close()


def _image(size: int) -> str:
    """A PNG's base64 of `size` decoded bytes (its magic, then filler)."""
    return base64.b64encode(PNG + bytes(range(256)) * (size // 256)).decode()


def _chat(*images: str) -> bytes:
    message = {"role": "user", "content": "what is this?", "images": list(images)}
    return json.dumps({"model": "sim", "stream": False, "messages": [message]}).encode()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, dict]:
    """The status and JSON body of the answer on a `Connection: close` request."""
    status, content = await answer_of(reader, writer)
    return status, json.loads(content)


async def _post(router, path: str, body: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}{path}", data=body, headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=ANSWER_BOUND)) as response:
            return response.status, await response.json()


async def _last_request(router, model: str) -> dict:
    async with aiohttp.ClientSession() as session:
        proxy = (await running(session, router.url))[model]["proxy"]
        async with session.get(f"{proxy}/sim/last-request") as response:
            return await response.json()


def _queues(local_port: int, remote_port: int) -> tuple[int, int] | None:
    """(sent but not yet acknowledged, received but not yet read) of the loopback TCP socket from `local_port` to
    `remote_port`, as the kernel lists it in /proc/net/tcp; None when it has no such socket."""
    ends = (f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == ends:
            sending, receiving = fields[4].split(":")
            return int(sending, 16), int(receiving, 16)
    return None


async def _read_whole(router, writer: asyncio.StreamWriter) -> None:
    """Until the router has read every byte written on `writer`: none left in this side's buffer or send queue,
    none in the router's receive queue."""
    port = writer.get_extra_info("sockname")[1]

    def read() -> bool:
        client, server = _queues(port, router.port), _queues(router.port, port)
        return writer.transport.get_write_buffer_size() == 0 and client is not None and client[0] == 0 \
            and server is not None and server[1] == 0

    await eventually(read, ANSWER_BOUND, "the router to read the whole request")


async def test_health_answers_while_a_large_image_is_checked_and_its_bad_base64_is_a_400(router):
    # 64 MiB of base64, bad only at its end: a second of parsing and checking, which held the loop (issue 38).
    body = _chat(_image(48 * 1024 * 1024)[:-4] + "%AAA")
    reader, writer = await open_request(router.port, b"application/json", body, "/api/chat")
    refused = asyncio.ensure_future(_answer(reader, writer))
    # The probe leaves once the router holds the whole body (so it is working on it), and must be answered first.
    await _read_whole(router, writer)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/health", timeout=aiohttp.ClientTimeout(total=ANSWER_BOUND)) as response:
            assert response.status == 200
    assert not refused.done(), "the large request was answered first: the loop waited on its image"
    assert await refused == (400, {"error": "messages[0].images[0] is not valid base64"})


BIG = 3 * 1024 * 1024  # decoded: past 64 KiB of body, and its base64 more than one piece (1 MiB) long
AT_END = _image(BIG)


@pytest.mark.parametrize(("path", "images", "message"), [
    # Past the first piece: each piece is checked, not only the head.
    ("/api/chat", [AT_END[:2_000_000] + "%" + AT_END[2_000_001:]], "messages[0].images[0] is not valid base64"),
    ("/api/chat", [AT_END[:2_000_000] + "\u00e9" + AT_END[2_000_001:]], "messages[0].images[0] is not valid base64"),
    # Padding inside the text, at a piece's end: data after it is refused as b64decode's validate refuses it.
    ("/api/chat", [AT_END[:1024 * 1024 - 2] + "==" + AT_END[1024 * 1024:]], "messages[0].images[0] is not valid base64"),
    ("/api/chat", [AT_END[:-2] + "="], "messages[0].images[0] is not valid base64"),
    ("/api/chat", [AT_END, "data:image/png" + AT_END], "messages[0].images[1] is not valid base64"),  # no comma
    ("/api/chat", [base64.b64encode(b"GIF90a" + bytes(BIG)).decode()],
     "messages[0].images[0] is not a PNG, JPEG, GIF, WebP or BMP image"),
    ("/api/generate", [AT_END[:-1] + "%"], "images[0] is not valid base64"),
], ids=["bad-digit-mid-image", "non-ascii-mid-image", "padding-mid-image", "bad-padding", "data-url-without-comma",
        "not-an-image", "generate"])
async def test_a_bad_image_in_a_large_body_is_a_400_that_says_why(router, path, images, message):
    if path == "/api/chat":
        body = _chat(*images)
    else:
        body = json.dumps({"model": "sim", "prompt": "what is this?", "images": images, "stream": False}).encode()
    assert len(body) > 64 * 1024
    assert await _post(router, path, body) == (400, {"error": message})


async def test_a_large_image_reaches_the_backend_whole_and_a_renamed_model_gets_its_name(router):
    status, answer = await _post(router, "/api/chat", _chat(AT_END, "data:image/png;base64," + AT_END))
    assert status == 200, answer
    sent = (await _last_request(router, "sim"))["body"]
    assert sent["model"] == "sim" and sent["stream"] is True
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + AT_END}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + AT_END}},
    ]
    # The body encoded in the thread is the one sent, unless the model's entry rewrites it (useModelName).
    status, answer = await _post(router, "/api/generate", json.dumps(
        {"model": "renamed", "prompt": "and this?", "images": [AT_END], "stream": False}).encode())
    assert status == 200, answer
    sent = (await _last_request(router, "renamed"))["body"]
    assert sent["model"] == "upstream-name"
    assert sent["messages"][0]["content"][1]["image_url"]["url"] == "data:image/png;base64," + AT_END


async def test_a_large_embedding_request_is_translated_off_the_loop_and_answered(router):
    texts = ["why is the sky blue? " * 4000, "why is the grass green? " * 4000]
    status, answer = await _post(router, "/api/embed", json.dumps({"model": "sim", "input": texts}).encode())
    assert status == 200, answer
    assert len(answer["embeddings"]) == 2
    assert (await _last_request(router, "sim"))["body"]["input"] == texts


async def test_only_a_large_body_is_worked_on_in_a_thread():
    from swaplab.router.ollama.handlers import off_loop, off_loop_if
    from swaplab.router.path.targets import OFF_LOOP_BYTES

    assert OFF_LOOP_BYTES == 64 * 1024  # the forms' bound
    assert off_loop(b"x" * (OFF_LOOP_BYTES + 1)) and not off_loop(b"x" * OFF_LOOP_BYTES)
    here = threading.get_ident()
    assert await off_loop_if(False, threading.get_ident) == here  # the small request's path: no thread
    assert await off_loop_if(True, threading.get_ident) != here


# Every string of these characters up to 7 long, and some of real base64 around the pieces' edges.
_ALPHABET = ("Q", "=", "%", "\u00e9")
_CASES = ["".join(letters) for length in range(8) for letters in itertools.product(_ALPHABET, repeat=length)]
_CASES += ["QUJD" * 3 + tail for tail in ("", "QQ==", "QUI=", "QQ=", "Q", "QUJD=", "==", "QQ==QQ==", "\n", "=" * 9,
                                          "QQ" + "=" * 9, "QUI" + "=" * 9, "QUI=" + "=" * 9 + "Q")]


@pytest.mark.parametrize("piece", [4, 8, 12, 1024 * 1024])
def test_base64_checked_in_pieces_takes_what_b64decode_validate_takes(piece):
    from swaplab.router.ollama.translate import valid_base64

    def whole(text: str) -> bool:
        try:
            base64.b64decode(text, validate=True)
        except ValueError:  # binascii.Error is one
            return False
        return True

    for text in _CASES:
        assert valid_base64(text, piece=piece) == whole(text), (text, piece)
        assert valid_base64("data:," + text, 6, piece=piece) == whole(text), (text, piece)
