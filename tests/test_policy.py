"""The Host and Origin policy as a table: plain facts of a request in, the verdict out (no server)."""

from __future__ import annotations

import pytest

from swaplab.config.security import Cors, Security
from swaplab.router.door.policy import Caller, Facts, decide, is_loopback_host, split_host

DEFAULT = Security()
CONFIGURED = Security(cors=Cors(allowed_origins=("https://app.example",), allow_credentials=True,
                                exposed_headers=("X-Request-Id",)), allowed_hosts=("mybox.lan",))
ANY = Security(cors=Cors(allowed_origins=("*",)), allowed_hosts=("*",))

LOCAL = "127.0.0.1:8080"


@pytest.mark.parametrize(("facts", "security", "status", "caller"), [
    # Clients without a browser: no Origin.
    (Facts("POST", "/v1/chat/completions", host=LOCAL), DEFAULT, 0, Caller.NO_BROWSER),
    (Facts("GET", "/running"), DEFAULT, 0, Caller.NO_BROWSER),  # HTTP/1.0, no Host at all
    (Facts("GET", "/running", host="localhost:8080"), DEFAULT, 0, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="[::1]:8080"), DEFAULT, 0, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="127.0.0.2"), DEFAULT, 0, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="ui.localhost:8080"), DEFAULT, 0, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="10.0.0.5:8080"), DEFAULT, 0, Caller.NO_BROWSER),  # no name, no rebinding
    (Facts("GET", "/running", host="[fe80::1]:8080"), DEFAULT, 0, Caller.NO_BROWSER),
    # DNS rebinding: the page's own name in Host while the router is on loopback.
    (Facts("GET", "/api/captures/1", host="attacker.example:8080"), DEFAULT, 403, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="127.0.0.1.nip.io:8080"), DEFAULT, 403, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="localhost.attacker.example"), DEFAULT, 403, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="mybox.lan:8080"), CONFIGURED, 0, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="other.lan:8080"), CONFIGURED, 403, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="anything.example"), ANY, 0, Caller.NO_BROWSER),
    # Listening on every address keeps any Host, unless allowedHosts is set.
    (Facts("GET", "/running", host="gpu-box:8080", listen_loopback=False), DEFAULT, 0, Caller.NO_BROWSER),
    (Facts("GET", "/running", host="gpu-box:8080", listen_loopback=False), CONFIGURED, 403, Caller.NO_BROWSER),
    # The page at /ui and llama-swap's page served by the router: same origin.
    (Facts("POST", "/api/models/unload", host=LOCAL, origin="http://127.0.0.1:8080"), DEFAULT, 0, Caller.SAME_ORIGIN),
    (Facts("POST", "/load", host="mybox.lan", origin="http://mybox.lan"), CONFIGURED, 0, Caller.SAME_ORIGIN),
    # Loopback origins (a dev server on another port): allowed, as Ollama allows them.
    (Facts("POST", "/v1/chat/completions", host=LOCAL, origin="http://localhost:5173"), DEFAULT, 0, Caller.ALLOWED),
    (Facts("POST", "/v1/chat/completions", host=LOCAL, origin="http://[::1]:3000"), DEFAULT, 0, Caller.ALLOWED),
    # A foreign page: refused whatever changes state, a read goes on without a grant.
    (Facts("POST", "/v1/chat/completions", host=LOCAL, origin="http://evil.example"), DEFAULT, 403, Caller.FOREIGN),
    (Facts("POST", "/api/inflight/3/cancel", host=LOCAL, origin="http://evil.example"), DEFAULT, 403, Caller.FOREIGN),
    (Facts("PUT", "/api/profiles/active", host=LOCAL, origin="http://evil.example"), DEFAULT, 403, Caller.FOREIGN),
    (Facts("GET", "/unload", host=LOCAL, origin="http://evil.example"), DEFAULT, 403, Caller.FOREIGN),
    (Facts("GET", "/upstream/m/props", host=LOCAL, origin="http://evil.example"), DEFAULT, 403, Caller.FOREIGN),
    (Facts("GET", "/props", host=LOCAL, origin="http://evil.example"), DEFAULT, 403, Caller.FOREIGN),
    (Facts("GET", "/upstream/m/ws", host=LOCAL, origin="http://evil.example", upgrade=True), DEFAULT, 403,
     Caller.FOREIGN),
    (Facts("GET", "/v1/models", host=LOCAL, origin="http://evil.example"), DEFAULT, 0, Caller.FOREIGN),
    (Facts("GET", "/v1/models", host=LOCAL, origin="null"), DEFAULT, 0, Caller.FOREIGN),
    (Facts("POST", "/load", host=LOCAL, origin="null"), DEFAULT, 403, Caller.FOREIGN),
    # An <img> or a form sends no Origin on GET, but Sec-Fetch-Site says where it came from.
    (Facts("GET", "/unload", host=LOCAL, fetch_site="cross-site"), DEFAULT, 403, Caller.FOREIGN),
    (Facts("GET", "/ui/", host=LOCAL, fetch_site="cross-site"), DEFAULT, 0, Caller.FOREIGN),
    (Facts("GET", "/unload", host=LOCAL, fetch_site="same-origin"), DEFAULT, 0, Caller.NO_BROWSER),
    # Configured origins.
    (Facts("POST", "/v1/chat/completions", host=LOCAL, origin="https://app.example"), CONFIGURED, 0, Caller.ALLOWED),
    (Facts("POST", "/v1/chat/completions", host=LOCAL, origin="https://app.example:443"), CONFIGURED, 0,
     Caller.ALLOWED),
    (Facts("POST", "/v1/chat/completions", host=LOCAL, origin="http://app.example"), CONFIGURED, 403, Caller.FOREIGN),
    (Facts("POST", "/v1/chat/completions", host=LOCAL, origin="https://evil.example"), ANY, 0, Caller.ALLOWED),
])  # fmt: skip
def test_verdicts(facts, security, status, caller):
    verdict = decide(facts, security)
    assert verdict.status == status, verdict.message
    if status == 403:
        assert "security." in verdict.message  # it names the key that allows it
    else:
        assert verdict.caller is caller


def test_grants_only_to_allowed_origins():
    foreign = decide(Facts("GET", "/v1/models", host=LOCAL, origin="http://evil.example"), DEFAULT)
    assert foreign.headers == ()
    loopback = dict(decide(Facts("GET", "/v1/models", host=LOCAL, origin="http://localhost:3000"), DEFAULT).headers)
    assert loopback == {"Access-Control-Allow-Origin": "http://localhost:3000", "Vary": "Origin"}
    configured = dict(decide(Facts("POST", "/v1/messages", host=LOCAL, origin="https://app.example"), CONFIGURED).headers)
    assert configured["Access-Control-Allow-Credentials"] == "true"
    assert configured["Access-Control-Expose-Headers"] == "X-Request-Id"
    same = decide(Facts("GET", "/running", host=LOCAL, origin="http://127.0.0.1:8080"), DEFAULT)
    assert same.headers == ()  # same-origin needs no grant


def test_preflights():
    asked = Facts("OPTIONS", "/upstream/m/completion", host=LOCAL, origin="http://localhost:5173",
                  preflight_method="POST", preflight_headers="content-type, x-api-key", private_network=True)
    verdict = decide(asked, DEFAULT)
    headers = dict(verdict.headers)
    assert verdict.status == 204
    assert headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert headers["Access-Control-Allow-Headers"] == "content-type, x-api-key"
    assert headers["Access-Control-Allow-Private-Network"] == "true"
    assert "PUT" in headers["Access-Control-Allow-Methods"]
    # Never echo text that is not a header name.
    odd = Facts("OPTIONS", "/v1/models", host=LOCAL, origin="http://localhost:5173", preflight_method="GET",
                preflight_headers="x\r\nSet-Cookie: a=b")
    assert dict(decide(odd, DEFAULT).headers)["Access-Control-Allow-Headers"] == ""
    foreign = Facts("OPTIONS", "/v1/chat/completions", host=LOCAL, origin="http://evil.example",
                    preflight_method="POST", private_network=True)
    refused = decide(foreign, DEFAULT)
    assert refused.status == 403 and refused.headers == ()
    # An OPTIONS that is no preflight goes on (to the key check, then its route).
    assert decide(Facts("OPTIONS", "/upstream/m/x", host=LOCAL), DEFAULT).status == 0


@pytest.mark.parametrize(("header", "expected"), [
    ("127.0.0.1:8080", ("127.0.0.1", 8080)),
    ("[::1]:8080", ("::1", 8080)),
    ("[::1]", ("::1", None)),
    ("LocalHost.", ("localhost", None)),
    ("a:b:c", ("a:b:c", None)),
    ("host:99999999999999999999", ("host", None)),
    ("host:\u00b2", ("host", None)),  # a digit to str.isdigit, not to int()
])  # fmt: skip
def test_split_host(header, expected):
    assert split_host(header) == expected


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("x.localhost", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("localhost.example", False), ("10.0.0.1", False), ("", False),
])  # fmt: skip
def test_loopback_names(host, loopback):
    assert is_loopback_host(host) is loopback
