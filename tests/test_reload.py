"""Config reload on SIGHUP and with --watch-config: unchanged models keep running."""

from __future__ import annotations

import json
import signal
import urllib.request

from procs import SIM, alive, wait_until

BASE = """
startPort: {port}
models:
  a-steady:
    cmd: {sim} --port ${{PORT}} --model a-steady
    # a comment that the edit below changes: comments don't restart anything
  b-moving:
    cmd: {sim} --port ${{PORT}} --model b-moving {moving_flags}
"""


def states(router) -> dict[str, dict]:
    with urllib.request.urlopen(f"{router.url}/running") as response:
        return {entry["model"]: entry for entry in json.load(response)["running"]}


def load(router, model: str) -> None:
    request = urllib.request.Request(f"{router.url}/load?model={model}", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def setup(router_factory, tmp_path, *extra):
    from procs import free_port_block

    port = free_port_block()
    text = BASE.format(port=port, sim=SIM, moving_flags="")
    # Both models run together here, so each reload decision shows on its own.
    text += "groups:\n  together:\n    swap: false\n    members: [a-steady, b-moving]\n"
    router = router_factory(text, *extra)
    load(router, "a-steady")
    load(router, "b-moving")
    running = states(router)
    return router, port, running["a-steady"]["pid"], running["b-moving"]["pid"]


def rewrite(tmp_path, port, moving_flags="", comment="a comment", extra=""):
    text = BASE.format(port=port, sim=SIM, moving_flags=moving_flags).replace("a comment", comment)
    text += "groups:\n  together:\n    swap: false\n    members: [a-steady, b-moving]\n" + extra
    (tmp_path / "config.yaml").write_text(text)


def test_sighup_keeps_unchanged_models_and_restarts_changed_ones(router_factory, tmp_path):
    router, port, steady_pid, moving_pid = setup(router_factory, tmp_path)
    rewrite(tmp_path, port, moving_flags="--ttft-ms 5", comment="an edited comment")
    router.signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in router.output(), 30, "the reload")
    wait_until(lambda: not alive(moving_pid), 30, "the changed model to stop")
    assert states(router).get("a-steady", {}).get("pid") == steady_pid and alive(steady_pid)
    load(router, "b-moving")  # comes back with its new settings
    assert states(router)["b-moving"]["pid"] != moving_pid


def test_a_broken_config_is_refused_and_the_old_one_keeps_serving(router_factory, tmp_path):
    router, port, steady_pid, moving_pid = setup(router_factory, tmp_path)
    (tmp_path / "config.yaml").write_text("models:\n  a-steady:\n    cmd: ${nope}\n")
    router.signal(signal.SIGHUP)
    wait_until(lambda: "config reload refused" in router.output(), 30, "the refusal")
    assert f"{tmp_path / 'config.yaml'}:3: unknown macro '${{nope}}' found in a-steady.cmd" in router.output()
    running = states(router)
    assert running["a-steady"]["pid"] == steady_pid and running["b-moving"]["pid"] == moving_pid
    load(router, "b-moving")  # still the old config's models


def test_watch_config_reloads_on_change_and_removes_models(router_factory, tmp_path):
    router, port, steady_pid, moving_pid = setup(router_factory, tmp_path, "--watch-config")
    text = f"startPort: {port}\nmodels:\n  a-steady:\n    cmd: {SIM} --port ${{PORT}} --model a-steady\n"
    text += "    # a comment that the edit below changes: comments don't restart anything\n"
    (tmp_path / "config.yaml").write_text(text)
    wait_until(lambda: not alive(moving_pid), 30, "the removed model to stop")
    assert states(router)["a-steady"]["pid"] == steady_pid
    with urllib.request.urlopen(f"{router.url}/v1/models") as response:
        assert [entry["id"] for entry in json.load(response)["data"]] == ["a-steady"]


def test_a_changed_model_finishes_its_requests_before_it_restarts(router_factory, tmp_path):
    import http.client

    from procs import free_port_block

    port = free_port_block()
    text = BASE.format(port=port, sim=SIM, moving_flags="--tokens-per-second 20")
    router = router_factory(text)
    load(router, "b-moving")
    old_pid = states(router)["b-moving"]["pid"]
    connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=60)
    body = {"model": "b-moving", "stream": True, "max_tokens": 30, "messages": [{"role": "user", "content": "hi"}]}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    first = response.readline()
    assert first.startswith(b"data:")
    (tmp_path / "config.yaml").write_text(BASE.format(port=port, sim=SIM, moving_flags="--tokens-per-second 25"))
    router.signal(signal.SIGHUP)
    rest = response.read()  # the stream under way is not cut by the reload
    assert rest.rstrip().endswith(b"data: [DONE]")
    wait_until(lambda: not alive(old_pid), 30, "the old server to stop once idle")
    load(router, "b-moving")
    assert states(router)["b-moving"]["pid"] != old_pid


def test_entry_hash_ignores_comments_but_not_settings():
    from dataclasses import replace

    from swaplab.config import load_config_text
    from swaplab.config.identity import entry_hash

    text = BASE.format(port=7000, sim="sim", moving_flags="")
    model = load_config_text(text).models["b-moving"]
    commented = load_config_text(text.replace("a comment", "another comment")).models["b-moving"]
    assert entry_hash(model) == entry_hash(replace(model, raw_text="# elsewhere", line=99))
    assert entry_hash(model) == entry_hash(commented)
    assert entry_hash(model) != entry_hash(replace(model, cmd=model.cmd + ("--flag",)))
