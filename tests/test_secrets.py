"""What is never shown or stored (docs/security.md): credential headers, a backend's secrets, query strings,
the store's mode, the request log's path and address. Table tests of the pure decisions, then real routers
on real sims over real HTTP."""

from __future__ import annotations

import ipaddress
import json
import os
import stat

import aiohttp
import pytest
import yarl

from procs import PYTHON, SIM, eventually, run_swaplab
from routerclient import running
from swaplab.config import load_config_text
from swaplab.config.redact import (
    REDACTED, command_text, config_secrets, entry_text, redact_argv, redact_env, redact_text, secret_name,
)
from swaplab.results.store import connect, transaction
from swaplab.router.watch.captures import header_map
from swaplab.router.watch.logformat import client_address, log_safe
from test_llama_swap_api import EventStream

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]

# -- the decisions, as tables ------------------------------------------------------------------


@pytest.mark.parametrize("name, secret", [
    ("Authorization", True), ("Proxy-Authorization", True), ("x-api-key", True), ("api-key", True),
    ("X-Goog-Api-Key", True), ("x-auth-token", True), ("Cookie", True), ("Set-Cookie", True),
    ("X-Amz-Security-Token", True), ("WWW-Authenticate", True),
    ("Content-Type", False), ("User-Agent", False), ("X-Session-Id", False), ("X-Request-Id", False),
    ("x-ratelimit-remaining-tokens", False), ("Accept", False),
    ("--api-key", True), ("--hf-token", True), ("--api-key-file", False), ("--ssl-key-file", False),
    ("--max-tokens", False), ("--ctx-size", False),
    ("HF_TOKEN", True), ("OPENAI_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True),
    ("TOKENIZERS_PARALLELISM", False), ("HF_HUB_OFFLINE", False), ("CUDA_VISIBLE_DEVICES", False),
    ("apiKey", True), ("hfToken", True), ("author", False), ("", False),
])  # fmt: skip
def test_a_name_names_a_secret_by_its_last_word(name, secret):
    assert secret_name(name) is secret


def test_credential_headers_are_redacted_by_name_and_the_rest_kept():
    headers = [
        ("api-key", "azure-1"), ("X-Goog-Api-Key", "goog-2"), ("x-auth-token", "tok-3"),
        ("Proxy-Authorization", "Basic eA=="), ("Cookie", "sid=4"), ("Content-Type", "application/json"),
        ("X-Session-Id", "chat-1"), ("User-Agent", "curl/8"),
    ]
    assert header_map(headers) == {
        "Api-Key": "[REDACTED]", "X-Goog-Api-Key": "[REDACTED]", "X-Auth-Token": "[REDACTED]",
        "Proxy-Authorization": "[REDACTED]", "Cookie": "[REDACTED]", "Content-Type": "application/json",
        "X-Session-Id": "chat-1", "User-Agent": "curl/8",
    }


@pytest.mark.parametrize("argv, shown", [
    (("srv", "--api-key", "sk-1", "--port", "80"), "srv --api-key *** --port 80"),
    (("srv", "--api-key=sk-1", "--hf-token", "hf_x"), "srv --api-key=*** --hf-token ***"),
    (("srv", "--api-key", "--port", "80"), "srv --api-key --port 80"),  # a flag next: no value to mask
    (("srv", "--api-key-file", "/k/a.txt", "--max-tokens", "9"), "srv --api-key-file /k/a.txt --max-tokens 9"),
    (("env", "HF_TOKEN=hf_y", "TOKENIZERS_PARALLELISM=false", "srv"), "env HF_TOKEN=*** TOKENIZERS_PARALLELISM=false srv"),
    (("docker", "run", "-e", "HF_TOKEN=hf_z", "img"), "docker run -e HF_TOKEN=*** img"),
    (("sh", "-c", "exec srv --api-key sk-2 --port 1"), "sh -c 'exec srv --api-key *** --port 1'"),
    (("srv", "--peer", "http://u:pw-3@host:9/v1", "a b"), "srv --peer 'http://u:***@host:9/v1' 'a b'"),
    (("srv", "--note", "uses sk-router-9 here"), "srv --note 'uses *** here'"),
    (("srv", "--key-name", "", "--api-key", ""), "srv --key-name '' --api-key ''"),
])  # fmt: skip
def test_a_command_line_is_shown_with_its_secrets_masked(argv, shown):
    assert command_text(argv, ("sk-router-9",)) == shown


def test_masked_argv_keeps_every_other_argument_exactly():
    argv = ("srv", "--api-key", "sk-1", "--model", "/m/a b.gguf", "--hf-token=hf_x", "-c", "4096")
    assert redact_argv(argv) == ("srv", "--api-key", REDACTED, "--model", "/m/a b.gguf", "--hf-token=***", "-c", "4096")


def test_environment_entries_mask_secret_names_only():
    env = (("HF_TOKEN", "hf_abc"), ("OPENAI_API_KEY", "sk-q"), ("TOKENIZERS_PARALLELISM", "false"), ("EMPTY_TOKEN", ""))
    assert redact_env(env) == (
        ("HF_TOKEN", "***"), ("OPENAI_API_KEY", "***"), ("TOKENIZERS_PARALLELISM", "false"), ("EMPTY_TOKEN", ""),
    )


@pytest.mark.parametrize("text, shown", [
    ("cmd: srv --api-key sk-1 --port ${PORT}", "cmd: srv --api-key *** --port ${PORT}"),
    ("cmd: srv --api-key ${env.KEY} --port 1", "cmd: srv --api-key ${env.KEY} --port 1"),  # where it comes from
    ('cmd: srv --api-key="sk 1"', 'cmd: srv --api-key="***"'),
    ("env:\n  - HF_TOKEN=hf_abc\n  - \"OPENAI_API_KEY=sk-q\"\n  - TOKENIZERS_PARALLELISM=false",
     "env:\n  - HF_TOKEN=***\n  - \"OPENAI_API_KEY=***\"\n  - TOKENIZERS_PARALLELISM=false"),
    ("macros:\n  key: sk-123  # the backend's own\n  size: 4096", "macros:\n  key: ***  # the backend's own\n  size: 4096"),
    ("apiKey: 'peer-1'", "apiKey: '***'"),
    ("proxy: https://user:pw@host/v1", "proxy: https://user:***@host/v1"),
    ("description: max-tokens 100, --max-tokens 9", "description: max-tokens 100, --max-tokens 9"),
    ("description: copies sk-router-9 by hand", "description: copies *** by hand"),
])  # fmt: skip
def test_entry_text_is_masked_wherever_a_secret_sits(text, shown):
    assert redact_text(text, ("sk-router-9", "a")) == shown  # "a": too short to be looked for


def test_an_entry_masks_its_parsed_secrets_even_on_another_line():
    config = load_config_text(
        "apiKeys: [sk-router-key-0]\n"
        "peers:\n  far:\n    proxy: http://127.0.0.1:9\n    apiKey: peer-key-0\n    models: [m]\n"
        "models:\n  a:\n    cmd: |\n      srv --port ${PORT}\n      --api-key\n      sk-next-line-0\n"
        "    env:\n      - HF_TOKEN=hf_env_0\n"
        "    description: talks to far with peer-key-0\n"
    )
    model = config.models["a"]
    assert config_secrets(config) == ("sk-router-key-0", "peer-key-0")
    text = entry_text(model, config_secrets(config))
    for secret in ("sk-next-line-0", "hf_env_0", "peer-key-0"):
        assert secret in model.raw_text and secret not in text, secret
    assert "--api-key\n      ***" in text and "HF_TOKEN=***" in text


@pytest.mark.parametrize("text, safe", [
    ("/v1/models", "/v1/models"),
    ("/a\nRequest 6.6.6.6", "/a\\nRequest 6.6.6.6"),
    ("/a\x1b[31m", "/a\\x1b[31m"),
    ('/a" 200 0 "x', '/a\\" 200 0 \\"x'),
    ("/a\\x", "/a\\\\x"),
    ("/a\r\t\x00\x7f\x85\u2028", "/a\\r\\t\\x00\\x7f\\x85\\u2028"),
    ("/caf\u00e9", "/caf\u00e9"),
])  # fmt: skip
def test_log_safe_escapes_what_could_forge_a_line_or_reach_a_terminal(text, safe):
    assert log_safe(text) == safe


PROXIES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"))


@pytest.mark.parametrize("peer, forwarded, real, address", [
    ("1.2.3.4", "6.6.6.6", "7.7.7.7", "1.2.3.4"),  # an untrusted peer is the client, whatever it says
    ("10.0.0.1", "6.6.6.6, 5.5.5.5", None, "5.5.5.5"),  # the hop the proxy appended, not the client's own
    ("10.0.0.1", "5.5.5.5, 10.0.0.2", None, "5.5.5.5"),  # through two trusted proxies
    ("10.0.0.1", None, "7.7.7.7", "7.7.7.7"),
    ("10.0.0.1", "not-an-address", None, "10.0.0.1"),
    ("::1", "2001:db8::1", None, "2001:db8::1"),
    ("10.0.0.1", None, None, "10.0.0.1"),
])  # fmt: skip
def test_forwarded_for_is_believed_only_from_a_trusted_proxy(peer, forwarded, real, address):
    assert client_address(peer, forwarded, real, PROXIES) == address
    assert client_address(peer, forwarded, real, ()) == peer


def file_modes(db) -> dict[str, int]:
    return {path.name: stat.S_IMODE(path.stat().st_mode) for path in db.parent.glob(db.name + "*")}


def test_a_new_store_and_its_wal_and_shm_are_private(tmp_path):
    old = os.umask(0o022)  # the usual umask, which left the store world-readable
    try:
        db = tmp_path / "swaplab.db"
        connection = connect(db)
        with transaction(connection):
            connection.execute(
                "INSERT INTO activity (time, model, path, status, duration_ms) VALUES (1, 'a', '/x', 200, 1)"
            )
        assert file_modes(db) == {"swaplab.db": 0o600, "swaplab.db-wal": 0o600, "swaplab.db-shm": 0o600}
        connection.close()
    finally:
        os.umask(old)


# -- through a real router ---------------------------------------------------------------------


async def test_credential_headers_are_redacted_in_captures_and_in_flight_entries(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --tokens-per-second 5
""")
    sent = {
        "api-key": "azure-secret-1", "X-Goog-Api-Key": "goog-secret-2", "x-auth-token": "auth-secret-3",
        "Proxy-Authorization": "Basic cHJveHktc2VjcmV0LTQ=", "Cookie": "sid=cookie-secret-5",
        "X-Session-Id": "chat-1",
    }
    secrets = ("azure-secret-1", "goog-secret-2", "auth-secret-3", "cHJveHktc2VjcmV0LTQ=", "cookie-secret-5")
    url = router.url
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/api/events") as events:
            stream = EventStream(events)
            await stream.until("inflight")  # the opening snapshot
            body = {"model": "a", "stream": True, "max_tokens": 3, "messages": MESSAGES}
            async with session.post(url + CHAT, json=body, headers=sent) as answer:
                upsert = await stream.until("inflight", lambda m: m["operation"] == "upsert")
                await answer.read()
        shown = upsert["request"]["req_headers"]
        for name in ("Api-Key", "X-Goog-Api-Key", "X-Auth-Token", "Proxy-Authorization", "Cookie"):
            assert shown[name] == "[REDACTED]", name
        assert shown["X-Session-Id"] == "chat-1" and shown["Content-Type"] == "application/json"

        async def row() -> dict | None:
            async with session.get(f"{url}/api/activity") as response:
                rows = [r for r in (await response.json())["activity"] if r["path"] == CHAT]
            return rows[0] if rows else None

        recorded = await eventually(row, 20, "the request's activity row")
        async with session.get(f"{url}/api/captures/{recorded['capture_id']}") as response:
            assert response.status == 200
            captured = await response.json()
    headers = captured["req_headers"]
    for name in ("Api-Key", "X-Goog-Api-Key", "X-Auth-Token", "Proxy-Authorization", "Cookie"):
        assert headers[name] == "[REDACTED]", name
    assert headers["X-Session-Id"] == "chat-1" and headers["Content-Type"] == "application/json"
    for text in (json.dumps(upsert), json.dumps(captured)):
        assert not any(secret in text for secret in secrets)


def secret_backend_config() -> str:
    """A model whose cmd, env and macros hold secrets, behind `sh -c` so the sim never sees the flags."""
    return f"""
peers:
  far:
    proxy: http://someone:peer-pass-6@127.0.0.1:9
    apiKey: peer-secret-7
    models: [remote]
models:
  a:
    macros:
      key: macro-secret-8
    cmd: |
      sh -c 'exec "$0" -m swaplab sim --port "$1" --model a' {PYTHON} ${{PORT}}
      --api-key
      flag-secret-1
      --hf-token=flag-secret-2
      --api-key-file /etc/keys/a.txt
      --other-key ${{key}}
    env:
      - HF_TOKEN=env-secret-3
      - TOKENIZERS_PARALLELISM=false
"""


SECRETS = ("flag-secret-1", "flag-secret-2", "env-secret-3", "peer-pass-6", "peer-secret-7", "macro-secret-8")


async def test_a_backends_secrets_are_masked_in_running_models_events_and_the_catalogue(router_factory):
    router = router_factory(secret_backend_config())
    url = router.url
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/load?model=a") as loaded:
            assert loaded.status == 200, await loaded.text()
        shown = (await running(session, url))["a"]
        async with session.get(f"{url}/api/models") as response:
            models = {model["id"]: model for model in (await response.json())["models"]}
        async with session.get(f"{url}/api/events") as events:
            status = await EventStream(events).until("modelStatus")
        async with session.get(f"{url}/catalog/models/a.html") as response:
            assert response.status == 200
            page = await response.text()
        async with session.get(f"{url}/catalog/models/far_remote.html") as response:
            assert response.status == 200
            peer_page = await response.text()
    assert shown["state"] == "ready"
    assert "--api-key *** --hf-token=*** --api-key-file /etc/keys/a.txt --other-key ***" in shown["cmd"]
    entry = models["a"]["entry"]
    assert "--api-key\n      ***" in entry and "HF_TOKEN=***" in entry and "key: ***" in entry
    assert "TOKENIZERS_PARALLELISM=false" in entry and "/etc/keys/a.txt" in entry
    assert "--other-key ${key}" in entry  # a reference names where the value comes from
    assert "***" in page and "someone:***@" in peer_page
    for shown_text in (json.dumps(shown), json.dumps(models), json.dumps(status), page, peer_page):
        assert not any(secret in shown_text for secret in SECRETS), shown_text


def test_config_show_masks_a_models_cmd_and_env(tmp_path):
    path = tmp_path / "secrets.yaml"
    path.write_text(secret_backend_config())
    result = run_swaplab("config", "show", str(path), "--model", "a")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    cmd = document["cmd"]
    assert cmd[cmd.index("--api-key"):][:3] == ["--api-key", "***", "--hf-token=***"]
    assert ["HF_TOKEN", "***"] in document["env"] and ["TOKENIZERS_PARALLELISM", "false"] in document["env"]
    assert not any(secret in result.stdout for secret in SECRETS)


async def test_the_store_keeps_no_query_string_and_is_private(router_factory):
    old = os.umask(0o022)  # the router inherits it: the usual one, under which SQLite's files were 0644
    try:
        router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
""")
    finally:
        os.umask(old)
    async with aiohttp.ClientSession() as session:
        body = {"model": "a", "max_tokens": 1, "messages": MESSAGES}
        async with session.post(f"{router.url}{CHAT}?token=query-secret-9&x=1", json=body) as answer:
            assert answer.status == 200

        async def rows() -> list | None:
            async with session.get(f"{router.url}/api/activity") as response:
                return (await response.json())["activity"] or None

        [row] = await eventually(rows, 20, "the request's activity row")
    assert row["path"] == CHAT
    modes = file_modes(router.db)
    assert set(modes) == {"swaplab.db", "swaplab.db-wal", "swaplab.db-shm"} and set(modes.values()) == {0o600}, modes
    router.close()
    for stored in router.db.parent.glob(router.db.name + "*"):
        assert b"query-secret-9" not in stored.read_bytes(), stored


async def test_the_request_log_writes_the_raw_path_without_its_query_and_the_peers_address(router_factory, tmp_path):
    config = f"""
logRequests: true
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a
"""
    forged = "/v1/models%0aRequest%206.6.6.6%20%22GET%20/forged%22%1b[2J"
    (tmp_path / "plain").mkdir()
    (tmp_path / "trusting").mkdir()
    plain = router_factory(config, workdir=tmp_path / "plain")
    trusting = router_factory("security:\n  trustedProxies: [127.0.0.1/32]\n" + config, workdir=tmp_path / "trusting")
    async with aiohttp.ClientSession() as session:
        for router in (plain, trusting):
            target = yarl.URL(f"{router.url}{forged}?token=query-secret-10", encoded=True)
            async with session.get(target, headers={"X-Forwarded-For": "6.6.6.6, 5.5.5.5"}) as answer:
                await answer.read()

    def line_of(router) -> str | None:
        return next((line for line in router.output().splitlines() if "forged" in line), None)

    for router, address in ((plain, "127.0.0.1"), (trusting, "5.5.5.5")):
        line = await eventually(lambda: line_of(router), 10, "the request's log line")
        assert f'Request {address} "GET /v1/models%0aRequest%206.6.6.6%20%22GET%20/forged%22%1b[2J HTTP/1.1"' in line
        output = router.output()
        assert "query-secret-10" not in output and "\x1b" not in output
        assert not any(text.lstrip().startswith(("Request 6.6.6.6", '"GET /forged')) for text in output.splitlines())
