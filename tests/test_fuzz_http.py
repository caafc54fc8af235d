"""Generated requests against one real router: no answer is the router's own failure.

Every route the router registers (read from its app, so a new route is fuzzed without
touching this file) meets generated methods, paths (percent-encoding, dot segments,
unicode, long), query strings, headers (Content-Type and Accept variants, odd Host, keys)
and bodies (random bytes, JSON of any shape, deep nesting, huge numbers, NaN, lone
surrogates, forms), sent as raw bytes over a real socket so that nothing normalizes them
on the way. Content-Length is always the body's length: framing is aiohttp's business.
A second, shorter run sends whole generated multipart forms (boundaries, part headers and
parameters, nesting, line endings) to the routes that read them.

What must hold, for each request and at the end:

- no 500 and no 5xx but 502, 503 and 504, and those with a body that says why. They are
  the router's legitimate answers: 502 a peer or a backend that cannot be reached (the
  peer here listens nowhere), 503 a model that cannot start or a feature turned off
  (`/api/performance` with the sampler off), 504 an upstream that timed out;
- the router's output holds no "Traceback" and no "Error handling request" (aiohttp's
  line for a handler that raised);
- `/health` answers 200 after, and no backend outlives the router.

Bounded by a fixed number of examples, derandomized and with no example database, so a
CI run is the same run every time; no assertion depends on how fast the machine is (a
socket timeout only ends a stream nobody reads to its end).
"""

from __future__ import annotations

import json
import re
import socket
import tempfile
import urllib.request
from functools import cache
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import write_config
from procs import SIM, Router, free_port, http_status

EXAMPLES = 3000
# Enough to see a status line from any route: a model's first request waits for the sim to start.
ANSWER_SECONDS = 30.0
# A stream (events, logs, a slow relay) is read this long at most after its headers, then dropped.
STREAM_SECONDS = 0.2
LEGITIMATE_5XX = {502, 503, 504}
BAD_OUTPUT = ("Traceback", "Error handling request")


def config_text(peer_port: int) -> str:
    return f"""
captureBuffer: 1
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --ttft-ms 0 --tokens-per-second 0 --default-max-tokens 3
    aliases: [alpha]
    filters:
      stripParams: "temperature"
      setParams: {{top_p: 0.5}}
peers:
  p:
    proxy: http://127.0.0.1:{peer_port}
    models: [x]
profiles:
  work:
    pins:
      assistant: a
"""


@cache
def registered_routes() -> tuple[tuple[str, str], ...]:
    """(method, path pattern) of every route `swaplab serve` registers, read from the app it composes."""
    from swaplab.config import load_config_text
    from swaplab.router.app import Router as RouterApp
    from swaplab.router.serve import compose

    directory = Path(tempfile.mkdtemp(prefix="swaplab-routes-"))
    config = load_config_text(config_text(9), "routes.yaml")
    app = compose(RouterApp(config, state_dir=directory / "state", db=directory / "routes.db"))
    return tuple(sorted({(route.method, resource.canonical) for resource in app.router.resources() for route in resource}))


# -- what a request is made of ----------------------------------------------------------------

NAMES = ["a", "alpha", "p/x", "x", "p", "assistant", "work", "nosuch", "", "a/", "A"]
ODD_SEGMENTS = [
    "..", ".", "%2e%2e", "%2E", "%2F", "a%2Fb", "%00", "%", "%zz", "%FF", "%C3%A9", "\u00e9", "\u2603", "~",
    "1", "0", "-1", "+5", "\u00b2", "9" * 30, str(2**63), str(2**63 - 1), "1.5", "\uff15", "health", "v1/models",
    "ui", "static", "vendor.json", "index.html", "../pyproject.toml", "x" * 3000,
]
segment = st.one_of(
    st.sampled_from(NAMES + ODD_SEGMENTS),
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n\x00"), max_size=20).map(
        lambda text: quote(text, safe="/")
    ),
)
NUMBERS = ["1", "0", "-1", "+5", "\u00b2", "\u0663", "9" * 30, str(2**63), str(2**63 - 1), "1.5", "\uff15", "1e3"]
# What each placeholder of a route pattern is filled with: ids are numbers more often than not.
PLACEHOLDER_VALUES = {
    "id": st.one_of(st.sampled_from(NUMBERS), segment),
    "model": st.one_of(st.sampled_from(NAMES), segment),
    "source": st.one_of(st.sampled_from(["router", "proxy", "upstream", "a"]), segment),
}
PLACEHOLDER = re.compile(r"\{(\w+)[^}]*\}")
SUFFIXES = ["/", "//", "/..", "/../health", "/.", ";x", "%2F..", "/a/v1/models", "/x"]

QUERY_KEYS = ["model", "limit", "source", "after", "api_key", "start", "end", "page", "sort", "order",
              "min_id", "max_id", "no-history", "stream"]
QUERY_VALUES = NAMES + ODD_SEGMENTS + ["", "abc", "2027-01-15T08:00:00Z", "desc", "asc", "id", "true", "router"]
query_word = st.one_of(
    st.sampled_from(QUERY_VALUES),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
)
query = st.lists(
    st.tuples(st.one_of(st.sampled_from(QUERY_KEYS), query_word), query_word, st.booleans()), max_size=4
).map(lambda pairs: "&".join(
    # Percent-encoded as a client would, or raw where it stays one token of the request line.
    f"{quote(key, safe='')}={quote(value, safe='')}" if encoded or not _raw_ok(key + value) else f"{key}={value}"
    for key, value, encoded in pairs
))


def _raw_ok(text: str) -> bool:
    return all(33 <= ord(character) < 127 and character not in "#&" for character in text)


CONTENT_TYPES = [
    "application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.api+json",
    "+json", "json", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=XyZ", "multipart/form-data", "multipart/form-data; boundary=",
    "multipart/form-data; boundary=\"a b\"", "application/octet-stream", "", ";", "*/*", "audio/wav",
    "application/json; boundary=XyZ", "text/event-stream",
]
header_value = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
header_name = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"),
                      min_size=1, max_size=20)
plain_headers = st.fixed_dictionaries(
    {},
    optional={
        "Content-Type": st.one_of(st.sampled_from(CONTENT_TYPES), header_value),
        "Accept": st.sampled_from(["text/plain", "text/html", "text/event-stream", "application/json", "*/*", ""]),
        "Authorization": st.one_of(st.just("Bearer sk-nothing"), header_value),
        "X-Session-Id": header_value,
        "X-Forwarded-For": st.sampled_from(["1.2.3.4", "::1", "not an address", "127.0.0.1, 10.0.0.1"]),
    },
)
# What the Host and Origin policy refuses (403): drawn now and then, so most requests reach their handler.
hostile_headers = st.fixed_dictionaries(
    {},
    optional={
        "Origin": st.sampled_from(["http://evil.example", "null", "http://127.0.0.1", "http://localhost:1"]),
        "Sec-Fetch-Site": st.sampled_from(["cross-site", "same-origin", "none"]),
        "Access-Control-Request-Method": st.sampled_from(["POST", "GET", "DELETE"]),
        "Access-Control-Request-Headers": st.one_of(st.just("content-type, authorization"), header_value),
        "Host": st.sampled_from(["evil.example", "localhost", "[::1]", "127.0.0.1", ""]),
    },
)
headers = st.tuples(
    plain_headers,
    st.one_of(st.just({}), st.just({}), st.just({}), st.just({}), st.just({}), hostile_headers),
    st.lists(st.tuples(header_name, header_value), max_size=2),
).map(lambda parts: [*parts[0].items(), *parts[1].items(), *parts[2]])

json_value = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
        st.integers(), st.integers(min_value=2**63, max_value=10**400), st.text(max_size=30),
        st.sampled_from(NAMES),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(["model", "messages", "prompt", "input", "stream", "name",
                                                   "temperature", "top_p", "role", "content"]), st.text(max_size=8)),
                        children, max_size=4),
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                 "content": st.one_of(st.text(max_size=20), json_value)})
model_document = st.fixed_dictionaries(
    {"model": st.one_of(st.sampled_from(NAMES), json_value)},
    optional={
        "messages": st.one_of(st.lists(message, max_size=3), json_value),
        "prompt": st.one_of(st.text(max_size=20), json_value),
        "input": st.one_of(st.text(max_size=20), json_value),
        "stream": st.one_of(st.booleans(), json_value),
        "max_tokens": st.integers(min_value=-2, max_value=4),
        "temperature": json_value,
        "name": st.one_of(st.sampled_from(["work", "nosuch"]), json_value),
    },
)


def _json(document) -> bytes:
    return json.dumps(document, allow_nan=True).encode()


def _deep(depth: int, inner: bytes) -> bytes:
    return b'{"model": "a", "x": ' + b"[" * depth + inner + b"]" * depth + b"}"


def _form(pairs: list[tuple[str, str]]) -> bytes:
    return "&".join(f"{quote(key)}={quote(value)}" for key, value in pairs).encode()


def _multipart(parts: list[tuple[str, bytes]]) -> bytes:
    body = b"".join(
        b'--XyZ\r\nContent-Disposition: form-data; name="' + name.encode() + b'"\r\n\r\n' + value + b"\r\n"
        for name, value in parts
    )
    return body + b"--XyZ--\r\n"


form_pair = st.tuples(st.one_of(st.just("model"), st.text(max_size=8)), st.one_of(st.sampled_from(NAMES), st.text(max_size=12)))
body = st.one_of(
    st.just(b""),
    st.binary(max_size=300),
    json_value.map(_json),
    model_document.map(_json),
    model_document.map(_json).flatmap(lambda raw: st.integers(0, len(raw)).map(lambda cut: raw[:cut])),
    model_document.map(_json).map(lambda raw: raw.replace(b'"', b"'", 1)),
    st.tuples(st.integers(1000, 3000), st.sampled_from([b"", b"1", b"NaN", b'"\\ud800"'])).map(lambda d: _deep(*d)),
    st.integers(18, 6000).map(lambda digits: b'{"model": "a", "seed": ' + b"9" * digits + b"}"),
    st.sampled_from([b'{"model": "a", "t": NaN, "x": "\\udc00"}', b'{"model": "a\\ud800"}', b'{"model": "a", "t": 1e999}',
                     b'\xef\xbb\xbf{"model": "a"}', '{"model": "a"}'.encode("utf-16"), b'{"model": "a\xff"}',
                     b'{"name": ' + b"[" * 5000 + b"]" * 5000 + b"}", b"null", b'"a"', b"[]", b"{}"]),
    st.lists(form_pair, max_size=4).map(_form),
    st.lists(st.tuples(st.one_of(st.just("model"), st.just("file"), st.text("abc", max_size=4)),
                       st.one_of(st.sampled_from([n.encode() for n in NAMES]), st.binary(max_size=40))),
             max_size=3).map(_multipart),
)

# Whole multipart forms, their Content-Type drawn with them: boundaries RFC 2046 allows and does
# not (non-ASCII, too long, quoted), parts with odd headers and parameters (nested multipart,
# unbalanced quotes, `(` runs, no name), CRLF or bare LF, with or without the closing delimiter.
BOUNDARIES = ["XyZ", "a b", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "\u00e9", "x" * 71, "(", "a;b", "=", " x"]
boundary_text = st.one_of(st.sampled_from(BOUNDARIES), st.text(st.characters(codec="utf-8", exclude_characters="\r\n\x00"),
                                                                 min_size=1, max_size=12))
PART_PARAMETERS = ['name="model"', "name=model", 'name="file"; filename="a.wav"', 'name=""', "name", 'name="a',
                   'name="a\\"b"', "x=" + "(" * 5000, "filename*=UTF-8''%e2%82%ac", 'name="\u00e9"']
part_header = st.one_of(
    st.lists(st.one_of(st.sampled_from(PART_PARAMETERS), st.text("abc=;\"( \\", max_size=12)), max_size=3).map(
        lambda parameters: "Content-Disposition: " + "; ".join(["form-data", *parameters])),
    st.sampled_from(["Content-Type: audio/wav", "Content-Type: multipart/mixed; boundary=In", "no colon", " folded",
                     "Content-Transfer-Encoding: base64", "X: " + "y" * 9000]),
)
form_part = st.tuples(st.lists(part_header, max_size=3),
                      st.one_of(st.sampled_from([n.encode() for n in NAMES]), st.binary(max_size=30)))


@st.composite
def multipart_forms(draw) -> tuple[str, bytes]:
    """(Content-Type, body) of a generated multipart form."""
    boundary = draw(boundary_text)
    quoted = draw(st.booleans())
    newline = draw(st.sampled_from([b"\r\n", b"\n"]))
    delimiter = b"--" + boundary.encode("utf-8", "surrogateescape")
    body = draw(st.sampled_from([b"", b"preamble" + newline]))
    for headers, value in draw(st.lists(form_part, max_size=4)):
        body += delimiter + newline + b"".join(h.encode() + newline for h in headers) + newline + value + newline
    body += draw(st.sampled_from([delimiter + b"--" + newline, delimiter + b"--", b"", delimiter + newline]))
    if draw(st.integers(0, 9)) == 0:
        body = body.replace(delimiter + newline, (delimiter + newline) * 2, 1)  # a part with nothing
    parameter = f'"{boundary}"' if quoted else boundary
    return f"multipart/form-data; boundary={parameter}", body


METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "FOO", "TRACE"]


@st.composite
def requests(draw, routes: tuple[tuple[str, str], ...]) -> tuple[str, str, list[tuple[str, str]], bytes]:
    method, pattern = draw(st.sampled_from(routes))
    if method == "*" or draw(st.integers(0, 4)) == 0:
        method = draw(st.sampled_from(METHODS))
    path = PLACEHOLDER.sub(lambda found: draw(PLACEHOLDER_VALUES.get(found.group(1), segment)), pattern)
    if draw(st.integers(0, 4)) == 0:
        path += draw(st.sampled_from(SUFFIXES))
    if draw(st.integers(0, 9)) == 0:
        path = "/" + draw(segment) + path  # a prefix no route has
    if draw(st.integers(0, 19)) == 0:
        path = path + "/" + "y" * draw(st.integers(1, 9000))  # past aiohttp's line limit, at times
    target = path + (("?" + q) if (q := draw(query)) else "")
    return method, target, draw(headers), draw(body)


# -- sending ---------------------------------------------------------------------------------


def send(port: int, method: str, target: str, header_list: list[tuple[str, str]], payload: bytes) -> tuple[int, bytes]:
    """The status and the first bytes of the answer to one request written byte for byte; (0, b"") if none came."""
    names = {name.lower() for name, _ in header_list}
    lines = [f"{method} {target} HTTP/1.1"]
    if "host" not in names:
        lines.append(f"Host: 127.0.0.1:{port}")
    lines += [f"{name}: {value}" for name, value in header_list]
    lines += [f"Content-Length: {len(payload)}", "Connection: close"]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_SECONDS) as connection:
        try:
            connection.sendall(head + payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before reading all of it (a 413, a 400 at the request line): read the answer
        received = b""
        try:
            while b"\r\n\r\n" not in received:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                received += chunk
            connection.settimeout(STREAM_SECONDS)
            while len(received) < 65536:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    match = re.match(rb"HTTP/1\.[01] (\d{3})", received)
    return (int(match.group(1)) if match else 0), received


# -- the run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    router = Router(write_config(directory, config_text(free_port())), directory)
    yield router
    children = psutil.Process(router.pid).children(recursive=True)
    router.close()
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left running after the router stopped: {alive}"


class Output:
    """The router's output read so far, so each request is judged by what it added."""

    def __init__(self, router: Router):
        self.router = router
        self.seen = 0

    def new(self) -> str:
        text = self.router.output()
        added, self.seen = text[self.seen:], len(text)
        return added


def test_no_generated_request_is_the_router_s_failure(router):
    _run(router, requests(registered_routes()), EXAMPLES)


FORM_EXAMPLES = 150
FORM_ROUTES = ["/v1/audio/transcriptions", "/v1/chat/completions", "/v1/audio/transcriptions?model=a",
               "/v1/images/edits?model=nosuch", "/upstream/a/v1/audio/transcriptions"]


def test_no_generated_form_is_the_router_s_failure(router):
    forms = st.tuples(st.sampled_from(FORM_ROUTES), multipart_forms()).map(
        lambda drawn: ("POST", drawn[0], [("Content-Type", drawn[1][0])], drawn[1][1]))
    _run(router, forms, FORM_EXAMPLES)


def _run(router: Router, generated, examples: int) -> None:
    """Send each generated request: no answer may be the router's failure, in the answer or its output."""
    output = Output(router)
    statuses: dict[int, int] = {}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(generated)
    def check(request):
        method, target, header_list, payload = request
        status, answer = send(router.port, method, target, header_list, payload)
        statuses[status] = statuses.get(status, 0) + 1
        added = output.new()
        shown = f"{method} {target[:300]} {header_list} {payload[:300]!r} -> {answer[:600]!r}\n{added[-3000:]}"
        assert not any(bad in added for bad in BAD_OUTPUT), shown
        assert status != 0, f"no answer: {shown}"
        if status >= 500:
            _, _, content = answer.partition(b"\r\n\r\n")
            assert status in LEGITIMATE_5XX and (content.strip() or method == "HEAD"), shown

    check()
    assert http_status(f"{router.url}/health") == 200
    assert not any(bad in output.new() for bad in BAD_OUTPUT), router.output()[-5000:]
    # The sim's own output too: a 500 it answered reached the client as the model's answer.
    with urllib.request.urlopen(f"{router.url}/logs?limit=100000") as response:
        logs = response.read().decode(errors="replace")
    assert "Traceback" not in logs, logs[-5000:]
    print("statuses:", dict(sorted(statuses.items())))
