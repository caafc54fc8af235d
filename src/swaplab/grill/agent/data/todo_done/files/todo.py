"""A to-do list kept in a JSON file: `python todo.py add TITLE`, `python todo.py list`."""

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


def lines(store=STORE):
    """The list as printed: one numbered line per item."""
    return [f"{number}. {item['title']}" for number, item in enumerate(load(store), start=1)]


def main(argv, store=STORE):
    """Runs one command; returns the exit status."""
    if len(argv) >= 2 and argv[0] == "add":
        add(" ".join(argv[1:]), store)
        return 0
    if argv == ["list"]:
        for line in lines(store):
            print(line)
        return 0
    print("usage: todo.py add TITLE | list")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
