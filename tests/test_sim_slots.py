"""`swaplab sim`'s llama.cpp slots: the per-slot prompt cache (`timings.cache_n`), and `/slots` save,
restore and erase with their faults, spoken to over real HTTP on loopback; the slot choice as a table."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from procs import Sim, run_swaplab

from swaplab.sim.slots import RESTORE_FAILED, choose_slot, decode_slot_file

PROMPT = "the quick brown fox"


def call(url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    """POST `body` as JSON (GET without one); the status and the parsed answer."""
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def complete(sim: Sim, prompt: str, **extra: Any) -> dict[str, int]:
    status, answer = call(f"{sim.url}/v1/completions", {"prompt": prompt, "max_tokens": 2, **extra})
    assert status == 200, answer
    return answer["timings"]


def slot_action(sim: Sim, slot: int, action: str, body: Any = None) -> tuple[int, Any]:
    return call(f"{sim.url}/slots/{slot}?action={action}", {} if body is None else body)


# -- the choice, without processes -------------------------------------------------------

@pytest.mark.parametrize(
    ("cached", "busy", "prompt", "slot"),
    [
        ([()], [False], ["a"], 0),
        ([(), ()], [False, False], ["a"], 0),  # nothing shared: the first idle slot
        ([("a",), ("b", "c")], [False, False], ["b", "c", "d"], 1),  # the longest shared prefix
        ([("b",), ("b", "c")], [False, False], ["b", "c"], 1),
        ([("b", "c"), ("b",)], [True, False], ["b", "c"], 1),  # a busy slot is passed over
        ([("b",), ()], [True, True], ["b"], 0),  # all busy: the sim does not queue, it shares
    ],
)
def test_choose_slot(cached, busy, prompt, slot):
    assert choose_slot(cached, busy, prompt) == slot


# -- the prompt cache --------------------------------------------------------------------

def test_a_follow_up_sharing_the_prefix_reuses_the_slot_cache(start_sim):
    sim = start_sim("--timings")
    assert complete(sim, PROMPT) == {"prompt_n": 4, "cache_n": 0, "predicted_n": 2}
    # The slot holds prompt and answer (" tok0 tok1"): a follow-up that carries both reuses them.
    assert complete(sim, f"{PROMPT} tok0 tok1 jumps") == {"prompt_n": 1, "cache_n": 6, "predicted_n": 2}
    # Diverging after two words: only those two are reused.
    assert complete(sim, "the quick red fox") == {"prompt_n": 2, "cache_n": 2, "predicted_n": 2}
    status, slots = call(f"{sim.url}/slots")
    assert status == 200
    # As llama.cpp lists a slot that held a task: how many tokens it holds.
    assert slots == [{"id": 0, "n_ctx": 4096, "is_processing": False, "prompt": "the quick red fox tok0 tok1",
                      "n_prompt_tokens": 6, "next_token": [{"n_decoded": 0}]}]


def test_chat_streams_its_timings_in_the_last_chunk(start_sim):
    sim = start_sim("--timings")
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
    assert call(f"{sim.url}/v1/chat/completions", body)[1]["timings"]["cache_n"] == 0
    follow_up = {
        "messages": [*body["messages"], {"role": "assistant", "content": " tok0 tok1"}, {"role": "user", "content": "more"}],
        "max_tokens": 2, "stream": True,
    }
    request = urllib.request.Request(f"{sim.url}/v1/chat/completions", data=json.dumps(follow_up).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: {")]
    assert json.loads(events[-1])["timings"] == {"prompt_n": 1, "cache_n": 6, "predicted_n": 2}


def test_parallel_slots_keep_their_own_prompts(start_sim):
    sim = start_sim("--parallel", "2")
    complete(sim, "alpha beta")
    complete(sim, "gamma delta", id_slot=1)
    # Without id_slot each follow-up finds the slot holding its prefix.
    assert complete(sim, "alpha beta tok0 tok1 x")["cache_n"] == 4
    assert complete(sim, "gamma delta tok0 tok1 y")["cache_n"] == 4
    assert [slot["prompt"] for slot in call(f"{sim.url}/slots")[1]] == [
        "alpha beta tok0 tok1 x tok0 tok1", "gamma delta tok0 tok1 y tok0 tok1",
    ]
    status, answer = call(f"{sim.url}/v1/completions", {"prompt": "a", "id_slot": 2})
    assert status == 400 and "Invalid slot ID" in answer["error"]["message"]


# -- save, restore, erase ----------------------------------------------------------------

def test_a_saved_slot_survives_a_restart(start_sim, tmp_path):
    saves = tmp_path / "slots"
    first = start_sim("--slot-save-path", str(saves))
    complete(first, PROMPT)
    status, saved = slot_action(first, 0, "save", {"filename": "demo.bin"})
    assert status == 200, saved
    assert saved["id_slot"] == 0 and saved["filename"] == "demo.bin" and saved["n_saved"] == 6
    assert saved["n_written"] == (saves / "demo.bin").stat().st_size
    assert set(saved["timings"]) == {"save_ms"}
    assert sorted(path.name for path in saves.iterdir()) == ["demo.bin"]  # no temporary left behind
    first.close()

    second = start_sim("--slot-save-path", str(saves))
    status, restored = slot_action(second, 0, "restore", {"filename": "demo.bin"})
    assert status == 200, restored
    assert restored["n_restored"] == 6 and restored["n_read"] == saved["n_written"]
    assert set(restored["timings"]) == {"restore_ms"}
    assert complete(second, f"{PROMPT} tok0 tok1 jumps")["cache_n"] == 6
    stats = call(f"{second.url}/sim/stats")[1]
    assert (stats["slot_saves"], stats["slot_restores"]) == (0, 1)

    assert slot_action(second, 0, "erase") == (200, {"id_slot": 0, "n_erased": 9})
    assert complete(second, PROMPT)["cache_n"] == 0


@pytest.mark.parametrize("filename", ["../escape.bin", "sub/dir.bin", "..", "back\\slash", "", 7])
def test_a_filename_that_could_leave_the_directory_is_refused(start_sim, tmp_path, filename):
    sim = start_sim("--slot-save-path", str(tmp_path / "slots"))
    for action in ("save", "restore"):
        status, answer = slot_action(sim, 0, action, {"filename": filename})
        assert (status, answer["error"]["message"]) == (400, "Invalid filename")
    assert not (tmp_path / "escape.bin").exists()


def test_restoring_a_missing_or_damaged_file_fails_and_empties_the_slot(start_sim, tmp_path):
    saves = tmp_path / "slots"
    sim = start_sim("--slot-save-path", str(saves))
    complete(sim, PROMPT)
    assert slot_action(sim, 0, "save", {"filename": "good.bin"})[0] == 200
    whole = (saves / "good.bin").read_bytes()
    (saves / "truncated.bin").write_bytes(whole[:-5])
    (saves / "foreign.bin").write_bytes(b"GGUF llama.cpp state from elsewhere")
    for filename in ("missing.bin", "truncated.bin", "foreign.bin"):
        status, answer = slot_action(sim, 0, "restore", {"filename": filename})
        assert (status, answer["error"]["message"]) == (400, RESTORE_FAILED), filename
    assert call(f"{sim.url}/slots")[1][0]["prompt"] == ""
    assert call(f"{sim.url}/sim/stats")[1]["slot_restores"] == 0
    assert decode_slot_file(whole) == PROMPT.split() + ["tok0", "tok1"]


def test_without_a_save_path_slot_actions_are_refused(start_sim):
    sim = start_sim()
    for action, body in (("save", {"filename": "x.bin"}), ("restore", {"filename": "x.bin"}), ("erase", {})):
        status, answer = slot_action(sim, 0, action, body)
        assert status == 501 and answer["error"]["type"] == "not_supported_error"
        assert "does not support slots action" in answer["error"]["message"]


def test_an_unknown_slot_or_action_is_refused(start_sim, tmp_path):
    sim = start_sim("--slot-save-path", str(tmp_path))
    assert slot_action(sim, 1, "erase")[0] == 400
    assert slot_action(sim, 0, "copy", {"filename": "x.bin"})[0] == 400


# -- faults ------------------------------------------------------------------------------

def test_save_error_answers_500_and_writes_nothing(start_sim, tmp_path):
    saves = tmp_path / "slots"
    sim = start_sim("--slot-save-path", str(saves), "--slot-fault", "save-error")
    complete(sim, PROMPT)
    status, answer = slot_action(sim, 0, "save", {"filename": "x.bin"})
    assert status == 500 and "save-error" in answer["error"]["message"]
    assert not saves.exists() or not list(saves.iterdir())
    assert call(f"{sim.url}/sim/stats")[1]["slot_saves"] == 0


def test_save_hang_never_answers_and_the_sim_serves_on(start_sim, tmp_path):
    saves = tmp_path / "slots"
    sim = start_sim("--slot-save-path", str(saves), "--slot-fault", "save-hang")
    complete(sim, PROMPT)
    with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
        call(f"{sim.url}/slots/0?action=save", {"filename": "x.bin"}, timeout=1.0)
    assert complete(sim, PROMPT)["cache_n"] == 4
    assert not saves.exists() or not list(saves.iterdir())
    assert call(f"{sim.url}/sim/stats")[1]["slot_saves"] == 0


def test_restore_faults(start_sim, tmp_path):
    saves = tmp_path / "slots"
    writer = start_sim("--slot-save-path", str(saves))
    complete(writer, PROMPT)
    assert slot_action(writer, 0, "save", {"filename": "x.bin"})[0] == 200
    writer.close()

    failing = start_sim("--slot-save-path", str(saves), "--slot-fault", "restore-error")
    status, answer = slot_action(failing, 0, "restore", {"filename": "x.bin"})
    assert status == 500 and "restore-error" in answer["error"]["message"]
    assert call(f"{failing.url}/sim/stats")[1]["slot_restores"] == 0
    failing.close()

    # restore-corrupt answers as a good restore does; only the follow-up's cache_n tells.
    corrupting = start_sim("--slot-save-path", str(saves), "--slot-fault", "restore-corrupt")
    status, restored = slot_action(corrupting, 0, "restore", {"filename": "x.bin"})
    assert status == 200 and restored["n_restored"] == 6
    assert complete(corrupting, f"{PROMPT} tok0 tok1 jumps")["cache_n"] == 0


def test_bad_slot_options_stop_the_sim(tmp_path):
    for options, message in (
        (["--slot-fault", "save-error"], "--slot-fault needs --slot-save-path"),
        (["--slot-save-path", str(tmp_path), "--slot-fault", "slow"], "--slot-fault must be one of"),
        (["--parallel", "0"], "--parallel must be at least 1"),
    ):
        result = run_swaplab("sim", "--port", "0", "--model", "m", *options, timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr
