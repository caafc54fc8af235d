"""Generated requests near the lane's edge, sent to both front doors: the lane must answer as aiohttp's server does.

The router's own front door (router/door/lane.py) takes a plain HTTP/1.1 POST to a model route
and hands anything else to aiohttp's server; `SWAPLAB_LANE=off` sends everything to aiohttp.
Two real routers on the same config (one with the lane, one without) get the same bytes,
each on a fresh connection: requests built close to where the lane decides, where a
difference would hide. The method, target and version (other methods, a route's near
misses, a query, percent-encoding, non-ASCII bytes, HTTP/1.0), `Host` (absent, twice, odd),
a second singleton header, `Content-Length` (leading zeros, a sign, spaces, huge, too short
or too long for the body, twice), `Transfer-Encoding` (chunks valid and not), `Expect`,
`Connection`, an upgrade, a folded header, bare line feeds, tabs, odd bytes in a header's
name or value, heads near aiohttp's 8190-byte line limit, bodies that name the model, do
not, or are not JSON, and two requests pipelined on one connection.

What must hold, for each connection:

- both doors send the same answers: the same status codes in the same order, each with the
  same HTTP version, framed alike (a length, chunks, or until the end) and saying
  `Connection: close` or not alike, and both leave the connection open or both close it.
  What may differ is what no client can tell apart: the date, an error's text, and one
  thing aiohttp's server does by chance (`Seen.as_lane_may`: a whole request followed by
  a malformed one in the same read gets one 400 for both, the lane answers each);
- no answer is a 5xx, and neither router's output holds "Traceback" or "Error handling
  request" (aiohttp's line for a handler that raised; the lane's, and its log of a head it
  could not read, come with a traceback; a model's log is in its router's output).

What it found is kept as explicit cases (`REGRESSIONS`), each failing before its fix.

Bounded by a fixed number of examples, derandomized and with no example database. Nothing
is asserted on how fast an answer comes: a connection is read until the router closes it
or it stays quiet a while (longer while fewer answers came than requests were sent), and
two answers that differ are read again on fresh connections, with a long quiet, before
they count as a difference.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from gzip import compress

import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import write_config
from procs import SIM, Router, http_status
from swaplab.router.door.routes import MODEL_ROUTES
from test_fuzz_http import BAD_OUTPUT, Output

EXAMPLES = 1000
CONFIG = f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --ttft-ms 0 --tokens-per-second 0 --default-max-tokens 3
    aliases: [alpha]
"""
# How long a connection may stay quiet before its reading ends: short once every request sent has its
# answer, longer while one may still come; both far longer when two doors' answers are read again.
QUIET_ANSWERED = 0.15
QUIET_WAITING = 0.6
QUIET_AGAIN = 3.0
CONNECT_SECONDS = 30.0
READ_LIMIT = 1024 * 1024


# -- what a request is made of ----------------------------------------------------------------


def chat(model: str = "a", **extra) -> bytes:
    document = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **extra}
    return json.dumps(document).encode()


BODIES = [
    chat(),
    json.dumps({"model": "alpha", "prompt": "hi", "max_tokens": 2}).encode(),
    json.dumps({"model": "a", "input": "hi"}).encode(),
    chat(stream=True),
    chat("nosuch"),
    chat("\u00e9"),
    b"{not json",
    b"",
    b"null",
    b"[]",
    b'{"model": "a", "messages": "x"}',
    b'{"model": "a\xff"}',
]
body = st.integers(0, 5).flatmap(lambda odd: st.binary(max_size=40) if odd == 5 else st.sampled_from(BODIES))


def usual_or(draw, usual, odd: list, odds: int = 6):
    """`usual`, or one time in `odds` one of `odd` (Hypothesis shrinks towards `usual`)."""
    return draw(st.sampled_from(odd)) if draw(st.integers(0, odds - 1)) == odds - 1 else usual


# The near misses of each part of a plain request.
METHODS = [b"GET", b"HEAD", b"PUT", b"OPTIONS", b"post", b"POS", b"POSTX", b"DELETE", b"PRI"]
VERSIONS = [b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 ", b"HTTP/01.1", b"HTTP/1.10", b"HTTP/1"]
# A model route's near misses (as a function of the route).
ROUTE_SHAPES = [
    lambda route: route + "?x=1",
    lambda route: route + "?model=a&stream=true",
    lambda route: route + "?",
    lambda route: route + "#x",
    lambda route: route + "?a#b",
    lambda route: route + "/",
    lambda route: route.upper(),
    lambda route: "/" + route,
    lambda route: route.replace("/", "%2F"),
    lambda route: route[:-1] + "%" + format(ord(route[-1]), "02X"),
    lambda route: route[:-1] + "%" + format(ord(route[-1]), "02x"),
    lambda route: route.replace("/", "/./", 1),
    lambda route: "/x/.." + route,
    lambda route: "http://127.0.0.1" + route,
    lambda route: "127.0.0.1" + route,
    lambda route: route + "%00",
    lambda route: route + "\t",
    lambda route: route + ";x",
    lambda route: route + "?\u00e9",
    lambda route: route + "\u00e9",
    lambda route: route[1:],
]
OTHER_TARGETS = ["/health", "/v1/models", "/", "*", "/nosuch", "/upstream/a/v1/chat/completions", "/v1/chat", ""]


@st.composite
def targets(draw) -> bytes:
    route = draw(st.sampled_from(MODEL_ROUTES))
    if draw(st.integers(0, 9)) == 9:
        return draw(st.sampled_from(OTHER_TARGETS)).encode()
    return usual_or(draw, route, [shape(route) for shape in ROUTE_SHAPES], 3).encode()


HOST = [b"Host: 127.0.0.1"]
HOSTS = [
    [], [b"Host: 127.0.0.1", b"Host: 127.0.0.1"], [b"Host: 127.0.0.1", b"host: localhost"], [b"Host:"],
    [b"Host: localhost"], [b"Host: [::1]"], [b"Host: evil.example"], [b"Host: 127.0.0.1:1"], [b"Host:\t127.0.0.1\t"],
    [b"Host : 127.0.0.1"], [b"HOST: 127.0.0.1"], [b"Host: 127.0.0.1 "], [b"Host: 127.0.0.1\r\n .evil"],
    [b"Host: 127.0.0.1\r\n\t"], [b"Host: \xc3\xa9"], [b"Host: 127.0.0.1, localhost"], [b"Host: 127.0.0.1@evil.example"],
]


def length_lines(size: int) -> list[list[bytes]]:
    """`Content-Length` as a client may write it for a body of `size` bytes: right, in odd spellings, wrong, twice."""
    n = b"%d" % size
    return [
        [], [b"Content-Length: 0" + n], [b"Content-Length: 00" + n], [b"Content-Length: +" + n],
        [b"Content-Length: -" + n], [b"Content-Length:  " + n + b"  "], [b"Content-Length:\t" + n],
        [b"Content-Length: " + n + b" " + n], [b"Content-Length: " + n + b"," + n],
        [b"Content-Length: " + n + b", " + n],
        [b"Content-Length: %d" % (size + 1)], [b"Content-Length: %d" % max(size - 1, 0)], [b"Content-Length: 0"],
        [b"Content-Length: " + b"9" * 20], [b"Content-Length: 99999999999"], [b"Content-Length: 0x%x" % size],
        [b"Content-Length: " + n + b".0"], [b"Content-Length: \xd9\xa3"], [b"Content-Length:"],
        [b"Content-Length: " + n, b"Content-Length: " + n],
        [b"Content-Length: " + n, b"Content-Length: %d" % (size + 1)],
        [b"Content-Length: " + n, b"content-length: " + n],
        [b"Content-Length : " + n], [b"Content-Length: " + n + b"\r\n 0"],
    ]


# Headers besides Host and Content-Length, each on its own line (or a few): the ones that keep a
# request off the lane, the singletons aiohttp takes once, policy, and odd syntax.
EXTRA_LINES = [
    [b"Content-Type: application/json", b"Content-Type: text/plain"], [b"Content-Type: text/plain"],
    [b"Connection: close"], [b"Connection: keep-alive"], [b"Connection: Close"], [b"Connection: keep-alive, close"],
    [b"Connection: upgrade", b"Upgrade: websocket"], [b"Upgrade: h2c"], [b"Connection: Upgrade, HTTP2-Settings"],
    [b"Expect: 100-continue"], [b"Expect: 100-Continue"], [b"Expect: nothing"],
    [b"Transfer-Encoding: identity"], [b"Transfer-Encoding:"], [b"Authorization: Bearer sk-x"],
    [b"Authorization: Bearer a", b"Authorization: Bearer b"], [b"User-Agent: a", b"User-Agent: b"],
    [b"Origin: http://evil.example"], [b"Origin: http://localhost:3000"], [b"Origin: null"],
    [b"Origin: http://127.0.0.1", b"Origin: http://evil.example"], [b"Sec-Fetch-Site: cross-site"],
    [b"Access-Control-Request-Method: POST"], [b"X-Folded: a\r\n b"], [b"X-Folded: a\r\n\tb"], [b" X-Leading: space"],
    [b"\tX-Leading: tab"], [b"X-Tab:\tv\t"], [b"X Y: z"], [b"X@Y: z"], [b"X\x80: z"], [b"X\x00Y: z"], [b"X\x7f: z"],
    [b": no name"], [b"NoColon"], [b"X-Value: \x80\xff"], [b"X-Value: a\x00b"], [b"X-Value: a\x7fb"],
    [b"X-Value: a\rb"], [b"X-Value: a\x0bb"], [b"X-Value: a\x0cb"], [b"X-Empty:"],
    [b"X-Session-Id: s1", b"X-Session-Id: s2"],
    # gzip and deflate bodies are cases of their own below (REGRESSIONS): their answers are not yet right.
    [b"Content-Encoding: identity"], [b"Content-Encoding: br"], [b"Content-Encoding: x"],
    [b"If-Modified-Since: x", b"If-Modified-Since: y"], [b"From: a", b"From: b"],
    [b"Max-Forwards: 1", b"Max-Forwards: 2"], [b"Referer: a", b"Referer: b"], [b"Content-Location: a"],
    [b"Range: bytes=0-1", b"Range: bytes=2-3"], [b"Proxy-Authorization: a", b"Proxy-Authorization: b"],
    [b"Accept: text/event-stream"], [b"Keep-Alive: timeout=5"], [b"Te: trailers"],
]
LINE_ENDS = [b"\n", b"\r", b"\r\r\n", b"\n\r", b" \r\n"]


@st.composite
def chunked(draw, payload: bytes) -> tuple[list[bytes], bytes]:
    """(header lines, wire body) of `payload` sent in chunks: valid ones, or one of their malformations."""
    cut = draw(st.integers(0, len(payload)))
    pieces = [piece for piece in (payload[:cut], payload[cut:]) if piece]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    ending = draw(st.sampled_from([b"0\r\n\r\n"] * 4 + [
        b"0\r\n", b"", b"0;x=y\r\n\r\n", b"0\r\nX-Trailer: t\r\n\r\n", b"zz\r\n\r\n", b"0\n\n", b"-1\r\n\r\n",
        b"1\r\nab\r\n0\r\n\r\n", b"00000000000000000000\r\n\r\n",
    ]))
    names = draw(st.sampled_from([[b"Transfer-Encoding: chunked"]] * 3 + [
        [b"Transfer-Encoding: Chunked"], [b"Transfer-Encoding: gzip, chunked"], [b"Transfer-Encoding: chunked, gzip"],
        [b"Transfer-Encoding:  chunked "], [b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"],
        [b"Transfer-Encoding: chunked", b"Content-Length: %d" % len(payload)], [b"Transfer-Encoding: xchunked"],
    ]))
    return names, wire + ending


@st.composite
def one_request(draw) -> tuple[bytes, bytes]:
    """(method, bytes) of one request near the lane's edge: a plain model request with a few of its parts odd."""
    method = usual_or(draw, b"POST", METHODS, 10)
    line = method + b" " + draw(targets()) + b" " + usual_or(draw, b"HTTP/1.1", VERSIONS, 10)
    line = usual_or(draw, line, [line.replace(b" ", b"  ", 1), line.replace(b" ", b"\t", 1), line + b" ", b" " + line],
                    20)
    payload = draw(body)
    if draw(st.integers(0, 7)) == 7:
        framing, payload = draw(chunked(payload))
    else:
        framing = usual_or(draw, [b"Content-Length: %d" % len(payload)], length_lines(len(payload)), 6)
    lines = [*usual_or(draw, HOST, HOSTS, 8), *framing, b"Content-Type: application/json"]
    if draw(st.integers(0, 2)) == 2:
        for extra in draw(st.lists(st.sampled_from(EXTRA_LINES), min_size=1, max_size=2)):
            lines += extra
    lines = draw(st.permutations(lines)) if draw(st.booleans()) else lines
    count = len(lines) + 2
    ends = usual_or(draw, [b"\r\n"] * count, [[end] * count for end in LINE_ENDS] + [
        draw(st.lists(st.sampled_from([b"\r\n", b"\r\n", *LINE_ENDS]), min_size=count, max_size=count))
    ], 12)
    head = line + ends[0] + b"".join(header + ending for header, ending in zip(lines, ends[1:])) + ends[-1]
    if draw(st.integers(0, 9)) == 9:
        # A head near aiohttp's 8190-byte line limit (and the lane's whole-head limit): one long header.
        size = 8190 + draw(st.integers(-6, 6)) - len(head)
        if draw(st.booleans()):
            size = 8190 + draw(st.integers(-6, 6)) - len(b"X-Pad: ")
        pad = b"X-Pad: " + b"p" * max(size - len(b"X-Pad: \r\n"), 0) + b"\r\n"
        head = line + b"\r\n" + pad + head[len(line) + len(ends[0]):]
    return method, head + payload


@st.composite
def exchanges(draw) -> tuple[list[bytes], bytes]:
    """(methods, bytes) of what one connection sends: one request, or two pipelined."""
    first = draw(one_request())
    if draw(st.integers(0, 4)) == 4:
        second = draw(st.one_of(one_request(), st.just((b"POST", _plain(chat())))))
        return [first[0], second[0]], first[1] + second[1]
    return [first[0]], first[1]


def _plain(payload: bytes, route: bytes = b"/v1/chat/completions", *extra: bytes) -> bytes:
    head = [b"POST " + route + b" HTTP/1.1", b"Host: 127.0.0.1", b"Content-Type: application/json",
            b"Content-Length: %d" % len(payload), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + payload


# -- what came back ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What one answer is made of, less what two routers may legitimately differ in (the date, the text of an error)."""

    version: bytes
    """Its status line's: aiohttp's parser refuses a request as HTTP/1.0 whatever it said."""
    status: int
    framing: str
    """"length", "chunked", "none" (empty by its status or method), "to the end", or "cut" (it never ended)."""
    closes: bool
    """It says `Connection: close`."""

    def __str__(self) -> str:
        return f"{self.version.decode()} {self.status} {self.framing}{' close' if self.closes else ''}"


def parse(received: bytes, methods: list[bytes]) -> list[Answer]:
    """The answers in `received`, in order (the request at the same place says whether one has a body)."""
    answers: list[Answer] = []
    at = 0
    finals = 0
    while at < len(received):
        end = received.find(b"\r\n\r\n", at)
        status_line = re.match(rb"HTTP/(1\.[01]) (\d{3})", received[at:])
        if end < 0 or status_line is None:
            answers.append(Answer(b"", int(status_line.group(2)) if status_line else 0, "cut", False))
            break
        version, status = status_line.group(1), int(status_line.group(2))
        headers = {}
        for line in received[at:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        at = end + 4
        closes = headers.get(b"connection") == b"close"
        if 100 <= status < 200:
            answers.append(Answer(version, status, "none", closes))
            continue
        method = methods[finals] if finals < len(methods) else b"POST"
        finals += 1
        if method == b"HEAD" or status in (204, 304):
            answers.append(Answer(version, status, "none", closes))
        elif headers.get(b"transfer-encoding") == b"chunked":
            while True:
                size_end = received.find(b"\r\n", at)
                try:
                    size = int(received[at:size_end].split(b";")[0], 16) if size_end >= 0 else -1
                except ValueError:
                    size = -1
                if size < 0 or size_end + 2 + size + 2 > len(received):
                    answers.append(Answer(version, status, "cut", closes))
                    return answers
                at = size_end + 2 + size + 2
                if size == 0:
                    break
            answers.append(Answer(version, status, "chunked", closes))
        elif b"content-length" in headers:
            at += int(headers[b"content-length"])
            answers.append(Answer(version, status, "length" if at <= len(received) else "cut", closes))
        else:
            answers.append(Answer(version, status, "to the end", closes))
            break
    return answers


def finals_in(received: bytes, methods: list[bytes]) -> int:
    return sum(1 for answer in parse(received, methods) if answer.status >= 200 and answer.framing != "cut")


def exchange(port: int, data: bytes, methods: list[bytes], quiet: float | None = None) -> tuple[bytes, bool]:
    """Send `data` on a fresh connection; (what came back, whether the router closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_SECONDS) as connection:
        try:
            connection.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before it read all of it: read the answer
        received = b""
        closed = False
        while len(received) < READ_LIMIT:
            answered = finals_in(received, methods) >= len(methods)
            connection.settimeout(quiet or (QUIET_ANSWERED if answered else QUIET_WAITING))
            try:
                chunk = connection.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    return received, closed


@dataclass(frozen=True)
class Seen:
    """One door's answers to one connection."""

    answers: tuple[Answer, ...]
    closed: bool
    received: bytes

    def __str__(self) -> str:
        return f"[{', '.join(map(str, self.answers))}]{' closed' if self.closed else ' open'}"

    def same(self, other: Seen) -> bool:
        return (self.answers, self.closed) == (other.answers, other.closed)

    def as_lane_may(self, reference: Seen) -> bool:
        """Whether these, the lane's answers, are what aiohttp's server (`reference`) would answer.

        The same answers, or: aiohttp's parser refuses a read that holds a whole request and then a
        malformed one with one 400 for both, and closes, where the lane answers the request and then
        hands the malformed one to aiohttp. Had the malformed one come in a later read, aiohttp
        would have answered both too: which it does rests on how the bytes were cut on the way.
        """
        if self.same(reference):
            return True
        refusal = reference.answers[:1] == reference.answers[-1:] and reference.answers[0].version == b"1.0" \
            and reference.answers[0].status == 400
        return refusal and reference.closed and self.closed and len(self.answers) > 1 \
            and self.answers[-1:] == reference.answers


def seen(port: int, data: bytes, methods: list[bytes], quiet: float | None = None) -> Seen:
    received, closed = exchange(port, data, methods, quiet)
    return Seen(tuple(parse(received, methods)), closed, received)


# -- the run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doors(tmp_path_factory):
    """Two routers on one config, "lane" (the default) and "aiohttp" (`SWAPLAB_LANE=off`), their model loaded."""
    routers = {}
    try:
        for name, lane in (("lane", "on"), ("aiohttp", "off")):
            directory = tmp_path_factory.mktemp(name)
            routers[name] = Router(write_config(directory, CONFIG), directory, env={"SWAPLAB_LANE": lane})
        for router in routers.values():
            # The model starts on its first request: load it now, so every example's answer comes at once.
            request = urllib.request.Request(f"{router.url}/v1/chat/completions", data=chat(), method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                assert response.status == 200
        yield routers
    finally:
        children = [child for router in routers.values()
                    for child in psutil.Process(router.pid).children(recursive=True)]
        for router in routers.values():
            router.close()
        gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left running after the routers stopped: {alive}"


class Doors:
    """Sends one connection's bytes to both doors at once and says how their answers differ."""

    def __init__(self, routers: dict[str, Router]):
        self.routers = routers
        self.outputs = {name: Output(router) for name, router in routers.items()}
        for output in self.outputs.values():
            output.new()  # what the routers wrote before is another test's
        self.pool = ThreadPoolExecutor(len(routers))
        self.statuses: dict[int, int] = {}

    def both(self, data: bytes, methods: list[bytes], quiet: float | None = None) -> dict[str, Seen]:
        futures = {name: self.pool.submit(seen, router.port, data, methods, quiet)
                   for name, router in self.routers.items()}
        return {name: future.result() for name, future in futures.items()}

    def difference(self, data: bytes, methods: list[bytes]) -> str | None:
        """What differs between the doors' answers to `data` (None: nothing), or what either did wrong."""
        answers = self.both(data, methods)
        if not answers["lane"].as_lane_may(answers["aiohttp"]):
            # Read again, quiet for long: an answer that came late is not a difference.
            answers = self.both(data, methods, QUIET_AGAIN)
        for answer in answers["lane"].answers:
            self.statuses[answer.status] = self.statuses.get(answer.status, 0) + 1
        shown = "\n".join(f"  {name}: {seen} {seen.received[:400]!r}" for name, seen in answers.items())
        for name, output in self.outputs.items():
            added = output.new()
            if any(bad in added for bad in BAD_OUTPUT):
                return f"{data[:1000]!r}\n{shown}\n{name}'s output:\n{added[-3000:]}"
        if any(answer.status >= 500 for seen in answers.values() for answer in seen.answers):
            return f"{data[:1000]!r}\n{shown}\nanswered 5xx"
        if not answers["lane"].as_lane_may(answers["aiohttp"]):
            return f"{data[:1000]!r}\n{shown}"
        return None


# What this fuzz found, each one connection's bytes: fixed in the lane, or not yet (and where).
REGRESSIONS = [
    # A head whose lines do not all end in CRLF, or that aiohttp's parser refuses before its end: aiohttp
    # answers 400 at the first byte it refuses; the lane waited for a CRLF CRLF that never came, then
    # closed the connection at `headerTimeout` without a word.
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\n\r\n{}", id="LF CRLF"),
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\r\nHost: 127.0.0.1\r\r\n\r\r\n", id="CR CRLF"),
    pytest.param(b"POST /v1/chat/completions?\xc3\xa9 HTTP/1.1\r\nHost: 127.0.0.1\r\n \r\n", id="refused url, no end"),
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nX@Y: 1\r\n\r", id="refused header, no end"),
    # Bytes after a request that says `Connection: close`, in the same read: aiohttp's parser refuses the read
    # (400, "Data after `Connection: close`"); the lane answered the request and closed.
    pytest.param(_plain(b"null", b"/v1/completions", b"Connection: close") + _plain(chat()), id="close, then more"),
    # A body with a `Content-Encoding`: aiohttp's parser decodes it (or refuses it, 400); the lane relayed
    # it as it came, still encoded, and the model answered what it made of it (a 500 for a bad gzip).
    pytest.param(_plain(chat(), b"/v1/chat/completions", b"Content-Encoding: br"), id="br"),
    # Both doors give these to aiohttp's server, whose guard refused a body it cannot decode with a 400 and
    # then raised the same error again in its lingering read (a traceback), and whose forwarder sent the
    # decoded body on with its `Content-Encoding: gzip` (the model answered 500).
    pytest.param(_plain(chat(), b"/v1/chat/completions", b"Content-Encoding: gzip"), id="not gzip"),
    pytest.param(_plain(compress(chat(), mtime=0), b"/v1/chat/completions", b"Content-Encoding: gzip"), id="gzip"),
    # A request, then bytes that are no request: the lane answered the request and waited for a head's end
    # that never came. Now it hands them to aiohttp, whose 400 follows its answer; aiohttp's server,
    # which had both in one read, answers the 400 alone (`Seen.as_lane_may`).
    pytest.param(_plain(b"", b"/v1/messages/count_tokens") + b'{"model": "alpha"}', id="pipelined, then malformed"),
]


@pytest.mark.parametrize("data", REGRESSIONS)
def test_a_found_difference_stays_fixed(doors, data):
    difference = Doors(doors).difference(data, [data.split(b" ", 1)[0]])
    assert difference is None, difference


def test_both_front_doors_answer_generated_requests_alike(doors):
    compare = Doors(doors)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(exchanges())
    @example(([b"POST"], _plain(chat())))
    @example(([b"POST", b"POST"], _plain(chat()) * 2))
    def check(connection):
        methods, data = connection
        difference = compare.difference(data, methods)
        assert difference is None, difference

    check()
    for router in doors.values():
        assert http_status(f"{router.url}/health") == 200
    print("statuses:", dict(sorted(compare.statuses.items())))
