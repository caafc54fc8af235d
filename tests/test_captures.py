"""Captures (`captureBuffer`) and session ids (`ui.activity.session_id`) through a real router on sims."""

from __future__ import annotations

import base64
import gzip
import json

import aiohttp
import pytest

from procs import SIM, eventually
from swaplab.router.watch.captures import MIB, Capture, CaptureStore, canonical_header, header_map

CHAT = "/v1/chat/completions"


# -- the store and the redaction, as plain data ---------------------------------------------


def stored(capture_id: int, size: int) -> Capture:
    return Capture(capture_id, "POST", "", {}, b"", 200, {}, b"x" * size)


def test_the_store_drops_the_oldest_first_and_refuses_what_cannot_fit_at_all():
    store = CaptureStore(1)
    for capture_id in (1, 2, 3):
        assert store.add(stored(capture_id, 400_000))
    assert [capture_id in store for capture_id in (1, 2, 3)] == [False, True, True]
    assert not store.add(stored(4, MIB + 1))  # alone over the budget: nothing is dropped for it
    assert (2 in store, 3 in store, 4 in store) == (True, True, False)
    assert store.size == 800_000
    store.resize(0)
    assert len(store) == 0 and store.size == 0 and not store.enabled


def test_ids_are_distinct_and_exact_as_json_numbers():
    ids = [CaptureStore(1).new_id() for _ in range(3)] + [CaptureStore(1).new_id() for _ in range(3)]
    one = CaptureStore(1)
    ids += [one.new_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids) and all(0 < capture_id < 2**53 for capture_id in ids)


@pytest.mark.parametrize("name, canonical", [
    ("x-api-key", "X-Api-Key"), ("CONTENT-TYPE", "Content-Type"), ("x-session-id", "X-Session-Id"),
    ("te", "Te"), ("bad name", "bad name"),
])
def test_header_names_are_gos_canonical_ones(name, canonical):
    assert canonical_header(name) == canonical


def test_credentials_and_configured_keys_are_redacted_wherever_they_appear():
    headers = [
        ("authorization", "Bearer sk-1"), ("Proxy-Authorization", "Basic eA=="), ("X-API-KEY", "sk-1"),
        ("cookie", "a=b"), ("Set-Cookie", "a=b"), ("X-Forwarded", "token peer-key here"), ("X-Plain", "fine"),
        ("x-plain", "a second value"),
    ]
    assert header_map(headers, ("sk-1", "peer-key", "")) == {
        "Authorization": "[REDACTED]", "Proxy-Authorization": "[REDACTED]", "X-Api-Key": "[REDACTED]",
        "Cookie": "[REDACTED]", "Set-Cookie": "[REDACTED]", "X-Forwarded": "[REDACTED]", "X-Plain": "fine",
    }


def test_the_json_is_llama_swaps_with_a_compressed_body_shown_plain():
    capture = Capture(
        7, "POST", "/v1/chat/completions", {"Content-Type": "application/json"}, b'{"a":1}', 200,
        {"Content-Encoding": "gzip", "Content-Type": "application/json"}, gzip.compress(b'{"ok":true}'),
    )
    assert capture.to_json() == {
        "id": 7, "req_method": "POST", "req_path": "/v1/chat/completions",
        "req_headers": {"Content-Type": "application/json"}, "req_body": base64.b64encode(b'{"a":1}').decode(),
        "resp_status": 200, "resp_headers": {"Content-Type": "application/json"},
        "resp_body": base64.b64encode(b'{"ok":true}').decode(),
    }
    assert Capture(8, "GET", "/x", {}, b"", 0, {}, b"").to_json()["req_body"] is None  # Go's nil []byte


# -- through a real router --------------------------------------------------------------------


async def exchange(session, url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    """POST `body`; the status and the raw bytes the client received."""
    async with session.post(url, json=body, headers=headers) as response:
        return response.status, await response.read()


async def activity(session, url: str, count: int, headers: dict | None = None) -> list[dict]:
    """The newest `count` activity rows, oldest first, once that many are written (rows are written in batches)."""

    async def written() -> list[dict] | None:
        async with session.get(f"{url}/api/activity", params={"limit": str(count)}, headers=headers) as response:
            rows = (await response.json())["activity"]
        return rows[::-1] if len(rows) == count else None

    return await eventually(written, 20, f"{count} activity rows")


async def capture(session, url: str, capture_id, headers: dict | None = None) -> tuple[int, dict]:
    async with session.get(f"{url}/api/captures/{capture_id}", headers=headers) as response:
        return response.status, await response.json(content_type=None)


def decoded(field: str | None) -> bytes:
    return base64.b64decode(field) if field is not None else b""


async def test_a_capture_holds_both_sides_with_credentials_redacted(router_factory):
    router = router_factory(f"""
apiKeys: [sk-router-key]
peers:
  far:
    proxy: http://127.0.0.1:9
    apiKey: peer-secret-9
    models: [remote]
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
    filters:
      setParams: {{temperature: 0.25}}
""")
    key = {"Authorization": "Bearer sk-router-key"}
    sent_headers = {
        **key, "X-Session-ID": "chat-1", "Cookie": "theme=dark", "X-Relay-Note": "via peer-secret-9",
        "X-Copied-Key": "sk-router-key", "X-Plain": "kept",
    }
    plain = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    # Long enough that most of its chunks leave the observation's last-KiB window.
    streamed = {**plain, "max_tokens": 6000, "stream": True, "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as session:
        status, plain_answer = await exchange(session, router.url + CHAT, plain, sent_headers)
        assert status == 200
        async with session.get(f"{router.url}/upstream/a/sim/last-request", headers=key) as response:
            plain_upstream = (await response.json())["body"]
        status, streamed_answer = await exchange(session, router.url + CHAT, streamed, key)
        assert status == 200 and len(streamed_answer) > 100_000
        async with session.get(f"{router.url}/upstream/a/sim/last-request", headers=key) as response:
            streamed_upstream = (await response.json())["body"]
        rows = await activity(session, router.url, 2, key)  # the GETs under /upstream/ leave none, as in llama-swap
        assert len(rows) == 2 and all(row["has_capture"] and isinstance(row["capture_id"], int) for row in rows)
        assert rows[0]["capture_id"] != rows[1]["capture_id"]
        status, first = await capture(session, router.url, rows[0]["capture_id"], key)
        assert status == 200
        status, second = await capture(session, router.url, rows[1]["capture_id"], key)
        assert status == 200
        status, _ = await capture(session, router.url, rows[1]["capture_id"])  # the key guards it
        assert status == 401
        # The router's own answer is captured too: the peer refuses the connection.
        status, refused = await exchange(session, router.url + CHAT, {**plain, "model": "far/remote"}, key)
        assert status == 502, refused
        row = (await activity(session, router.url, 3, key))[-1]
        assert row["status"] == 502 and row["peer"] == "far"
        status, third = await capture(session, router.url, row["capture_id"], key)
        assert status == 200

    assert set(first) == {
        "id", "req_method", "req_path", "req_headers", "req_body", "resp_status", "resp_headers", "resp_body",
    }
    assert first["id"] == rows[0]["capture_id"]
    assert (first["req_method"], first["req_path"], first["resp_status"]) == ("POST", CHAT, 200)
    headers = first["req_headers"]
    for name in ("Authorization", "Cookie", "X-Relay-Note", "X-Copied-Key"):
        assert headers[name] == "[REDACTED]", name
    assert headers["X-Session-Id"] == "chat-1" and headers["X-Plain"] == "kept"  # Go's canonical names
    # The body as the upstream got it, after the filters; the response as the client got it.
    assert json.loads(decoded(first["req_body"])) == plain_upstream == {**plain, "temperature": 0.25}
    assert decoded(first["resp_body"]) == plain_answer
    assert first["resp_headers"]["Content-Type"].startswith("application/json")

    assert second["req_headers"]["Authorization"] == "[REDACTED]"
    assert json.loads(decoded(second["req_body"])) == streamed_upstream
    assert decoded(second["resp_body"]) == streamed_answer
    assert second["resp_headers"]["Content-Type"].startswith("text/event-stream")
    assert third["resp_status"] == 502 and decoded(third["resp_body"]) == refused
    assert json.loads(decoded(third["req_body"]))["model"] == "remote"  # as the peer was to get it
    for shown in (first, second, third):
        text = json.dumps(shown)
        assert "sk-router-key" not in text and "peer-secret-9" not in text and "theme=dark" not in text
    # Nor does any credential reach the store on disk (its file and write-ahead log), or the log.
    router.close()
    for stored in router.db.parent.glob(router.db.name + "*"):
        raw = stored.read_bytes()
        assert b"sk-router-key" not in raw and b"peer-secret-9" not in raw and b"theme=dark" not in raw, stored
    logged = router.log_path.read_text(errors="replace")
    assert "sk-router-key" not in logged and "peer-secret-9" not in logged


async def test_an_unknown_capture_is_llama_swaps_404(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    async with aiohttp.ClientSession() as session:
        status, body = await capture(session, router.url, 12345)
        assert status == 404
        assert body == {
            "src": "llama-swap",
            "error": {"message": "capture not found", "type": "invalid_request_error", "param": None, "code": "not_found"},
        }
        status, body = await capture(session, router.url, "not-a-number")
        assert status == 400 and body["error"]["message"] == "invalid capture ID"
        async with session.get(f"{router.url}/api/captures/7", headers={"Accept": "text/plain"}) as response:
            assert response.status == 404 and await response.text() == "llama-swap: capture not found"


async def test_the_budget_drops_the_oldest_and_keeps_nothing_too_big(router_factory):
    router = router_factory(f"""
logLevel: debug
captureBuffer: 1
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    url = router.url + CHAT

    def request(tokens: int) -> dict:
        return {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}

    async with aiohttp.ClientSession() as session:
        sizes = []
        for _ in range(3):
            status, answer = await exchange(session, url, request(2200))  # about 0.4 MiB each
            assert status == 200
            sizes.append(len(answer))
        assert 2 * max(sizes) < 1024 * 1024 < 3 * min(sizes), sizes
        rows = await activity(session, router.url, 3)
        assert [row["has_capture"] for row in rows] == [False, True, True]  # two fit in 1 MiB; the oldest went
        assert (await capture(session, router.url, rows[0]["capture_id"]))[0] == 404
        assert (await capture(session, router.url, rows[2]["capture_id"]))[0] == 200

        status, answer = await exchange(session, url, request(8000))  # over the whole MiB alone
        assert status == 200 and len(answer) > 1024 * 1024
        rows = await activity(session, router.url, 4)
        assert rows[3]["capture_id"] is not None and not rows[3]["has_capture"]
        assert (await capture(session, router.url, rows[3]["capture_id"]))[0] == 404
        assert [row["has_capture"] for row in rows[1:3]] == [True, True]  # nothing made room for it
    too_big = f"capture {rows[3]['capture_id']} not kept"
    assert too_big in router.output()


async def test_capture_buffer_0_captures_nothing(router_factory):
    router = router_factory(f"""
captureBuffer: 0
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with aiohttp.ClientSession() as session:
        for stream in (False, True):
            status, _ = await exchange(session, router.url + CHAT, {**body, "stream": stream})
            assert status == 200
        rows = await activity(session, router.url, 2)
        assert [(row["capture_id"], row["has_capture"]) for row in rows] == [(None, False), (None, False)]
        assert (await capture(session, router.url, 1))[0] == 404


async def test_the_session_id_comes_from_the_first_configured_header_that_has_one(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    cases = [
        ({"X-Session-ID": "s-one"}, "s-one"),
        ({"X-Litellm-Session-Id": "s-two"}, "s-two"),
        ({"X-Litellm-Session-Id": "s-later", "x-session-id": "s-first"}, "s-first"),  # the list's order, any case
        ({"X-Session-ID": "  ", "X-Litellm-Session-Id": "s-three"}, "s-three"),  # blank counts as absent
        ({}, None),
    ]
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        for headers, _ in cases:
            assert (await exchange(session, router.url + CHAT, body, headers))[0] == 200
        rows = await activity(session, router.url, len(cases))
    assert [row["session_id"] for row in rows] == [expected for _, expected in cases]


async def test_session_ids_follow_a_configured_list_and_an_empty_one_turns_them_off(router_factory, tmp_path):
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"X-Session-ID": "s-default", "X-Conversation": "conv-9"}
    seen = []
    for number, setting in enumerate(("[X-Conversation]", "[]")):
        workdir = tmp_path / f"router-{number}"  # a store of its own
        workdir.mkdir()
        router = router_factory(f"""
ui:
  activity:
    session_id: {setting}
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""", workdir=workdir)
        async with aiohttp.ClientSession() as session:
            assert (await exchange(session, router.url + CHAT, body, headers))[0] == 200
            [row] = await activity(session, router.url, 1)
        seen.append(row["session_id"])
    assert seen == ["conv-9", None]
