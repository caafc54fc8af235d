from pathlib import Path

import todo

STORE = Path("test-todo.json")


def fresh():
    if STORE.exists():
        STORE.unlink()
    return STORE


def test_add_and_list():
    store = fresh()
    assert todo.main(["add", "buy", "milk"], store) == 0
    assert todo.main(["add", "call", "Sam"], store) == 0
    assert todo.lines(store) == ["1. [ ] buy milk", "2. [ ] call Sam"]


def test_usage():
    assert todo.main(["frobnicate"], fresh()) == 2
