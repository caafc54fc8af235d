"""The router's event loop (issue 28): uvloop's where it is installed, asyncio's otherwise, chosen by
SWAPLAB_EVENT_LOOP; a router on either serves, streams and stops its backends."""

from __future__ import annotations

import subprocess
import sys

import aiohttp
import pytest

from procs import SIM, eventually
from routerclient import running
from swaplab.errors import SwaplabError
from swaplab.router.serve import event_loop

CONFIG = f"""
models:
  sim:
    cmd: {SIM} --port ${{PORT}} --model sim
"""


def test_the_loop_is_uvloops_when_installed_and_asyncios_when_asked_or_absent(monkeypatch):
    uvloop = pytest.importorskip("uvloop", reason="the fast extra is part of `make test`'s install")
    monkeypatch.delenv("SWAPLAB_EVENT_LOOP", raising=False)
    factory, name = event_loop()
    assert factory is uvloop.new_event_loop and name == f"uvloop {uvloop.__version__}"
    monkeypatch.setenv("SWAPLAB_EVENT_LOOP", "asyncio")
    assert event_loop() == (None, "asyncio (as SWAPLAB_EVENT_LOOP asks)")
    monkeypatch.setenv("SWAPLAB_EVENT_LOOP", "libuv")
    with pytest.raises(SwaplabError, match="say asyncio, uvloop or auto"):
        event_loop()
    monkeypatch.setenv("SWAPLAB_EVENT_LOOP", "auto")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    factory, name = event_loop()
    assert factory is None and "uvloop is not installed" in name
    monkeypatch.setenv("SWAPLAB_EVENT_LOOP", "uvloop")
    with pytest.raises(SwaplabError, match="pip install 'swaplab\\[fast\\]'"):
        event_loop()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_a_router_on_either_loop_serves_streams_and_stops_its_backend(router_factory, loop):
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    router = router_factory(CONFIG, env={"SWAPLAB_EVENT_LOOP": loop})
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            assert (await response.read()).endswith(b"data: [DONE]\n\n")
        pid = (await running(session, router.url))["sim"]["pid"]
        async with session.post(f"{router.url}/unload") as response:
            assert response.status == 200
        await eventually(lambda: _gone(pid), 10, "the sim's process to end after /unload")
    assert f"event loop: {loop}" in router.output()


def _gone(pid: int) -> bool:
    from procs import alive

    return not alive(pid)


SETTLE = """
import gc, weakref
from swaplab.router.serve import settle_heap

class Config:  # an old config: a cycle, alive at the start
    pass

old = Config()
old.me = old
gone = weakref.ref(old)
settle_heap()
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()  # the start's objects, out of the collector's way
assert gone() is not None
del old  # a reload replaced it: only the collector can free a cycle, and it was frozen
settle_heap()
assert gone() is None, "the old config's cycle outlived the reload"
assert gc.get_freeze_count() > 1000
print("ok")
"""


def test_the_heap_of_the_start_is_frozen_and_a_reload_frees_what_it_replaced():
    """Full collections walked everything the router holds from its start (up to 24 ms a pause in a
    burst, measured); `settle_heap` freezes it, and after a reload frees the old config's cycles first."""
    done = subprocess.run([sys.executable, "-c", SETTLE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
