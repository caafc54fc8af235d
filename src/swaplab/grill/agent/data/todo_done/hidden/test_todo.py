import contextlib
import io
import json
from pathlib import Path

import todo

STORE = Path("hidden-todo.json")


def fresh(*titles):
    if STORE.exists():
        STORE.unlink()
    for title in titles:
        assert todo.main(["add", title], STORE) == 0
    return STORE


def run(argv, store):
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        status = todo.main(argv, store)
    return status, output.getvalue()


def test_add_and_list():
    store = fresh("buy milk", "call Sam")
    assert todo.lines(store) == ["1. [ ] buy milk", "2. [ ] call Sam"]
    assert run(["list"], store) == (0, "1. [ ] buy milk\n2. [ ] call Sam\n")


def test_done_marks_one_item():
    store = fresh("a", "b", "c")
    assert run(["done", "2"], store)[0] == 0
    assert todo.lines(store) == ["1. [ ] a", "2. [x] b", "3. [ ] c"]
    # Kept in the file, not only in memory.
    assert [item["done"] for item in json.loads(store.read_text())] == [False, True, False]


def test_done_twice_is_fine():
    store = fresh("a")
    assert run(["done", "1"], store)[0] == 0
    assert run(["done", "1"], store)[0] == 0
    assert todo.lines(store) == ["1. [x] a"]


def test_done_with_a_bad_number():
    store = fresh("a", "b")
    for bad in ("0", "3", "x"):
        status, printed = run(["done", bad], store)
        assert status == 1 and printed.strip() == f"no item {bad}", (bad, status, printed)
    assert todo.lines(store) == ["1. [ ] a", "2. [ ] b"]


def test_usage():
    assert run(["frobnicate"], fresh())[0] == 2
