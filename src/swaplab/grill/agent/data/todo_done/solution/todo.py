"""A to-do list kept in a JSON file: `python todo.py add TITLE`, `python todo.py list`, `python todo.py done N`."""

import json
import sys
from pathlib import Path

STORE = Path("todo.json")


def load(store=STORE):
    if not store.exists():
        return []
    return json.loads(store.read_text())


def save(items, store=STORE):
    store.write_text(json.dumps(items, indent=2))


def add(title, store=STORE):
    items = load(store)
    items.append({"title": title, "done": False})
    save(items, store)


def done(number, store=STORE):
    """Marks item `number` (counted from 1) done; False when there is no such item."""
    items = load(store)
    if not 1 <= number <= len(items):
        return False
    items[number - 1]["done"] = True
    save(items, store)
    return True


def lines(store=STORE):
    """The list as printed: one numbered line per item, [x] when it is done."""
    return [
        f"{number}. [{'x' if item['done'] else ' '}] {item['title']}"
        for number, item in enumerate(load(store), start=1)
    ]


def main(argv, store=STORE):
    """Runs one command; returns the exit status."""
    if len(argv) >= 2 and argv[0] == "add":
        add(" ".join(argv[1:]), store)
        return 0
    if argv == ["list"]:
        for line in lines(store):
            print(line)
        return 0
    if len(argv) == 2 and argv[0] == "done":
        if not argv[1].isdigit() or not done(int(argv[1]), store):
            print(f"no item {argv[1]}")
            return 1
        return 0
    print("usage: todo.py add TITLE | list | done N")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
