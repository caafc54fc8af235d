"""`--config-dir`: llama-swap's merge rules, each fault at the FILE:LINE of the file that holds it."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from procs import SIM, run_swaplab, wait_until

from swaplab.config import load_config_sources
from swaplab.config.model import Config
from swaplab.errors import ConfigError, SwaplabError

M1 = "models:\n  m1:\n    cmd: echo m1\n    proxy: http://localhost:9001\n"
M2 = "models:\n  m2:\n    cmd: echo m2\n    proxy: http://localhost:9002\n"
FAULTS = "faults"
"""An expectation: the exact `FILE:LINE: message` lines the load fails with."""

# (rule, files written in d/ (name -> text), what to look at, expected)
# "what to look at" is FAULTS or a function of the loaded Config.
MERGE_RULES: list[tuple[str, dict[str, str], Any, Any]] = [
    ("identity map: models are unioned, in file order",
     {"a.yaml": M1, "b.yaml": M2}, lambda c: list(c.models), ["m1", "m2"]),
    ("files merge in sorted name order, whatever order they were written in",
     {"z.yaml": M1, "a.yaml": M2}, lambda c: list(c.models), ["m2", "m1"]),
    ("identity map: the same model id twice is a fault at the second, naming the first",
     {"a.yaml": M1, "b.yaml": "# the same id again\n" + M1}, FAULTS,
     ['d/b.yaml:3: duplicate models "m1" (already defined at d/a.yaml:2)']),
    ("identity map: groups",
     {"a.yaml": M1 + "groups:\n  g1:\n    members: [m1]\n", "b.yaml": M2 + "groups:\n  g1:\n    members: [m2]\n"},
     FAULTS, ['d/b.yaml:6: duplicate groups "g1" (already defined at d/a.yaml:6)']),
    ("identity map: peers",
     {"a.yaml": "peers:\n  remote:\n    proxy: http://x:1\n    models: [a]\n",
      "b.yaml": "peers:\n  remote:\n    proxy: http://x:2\n    models: [b]\n"},
     FAULTS, ['d/b.yaml:2: duplicate peers "remote" (already defined at d/a.yaml:2)']),
    ("identity map: matrix, so two files cannot each bring sets",
     {"a.yaml": M1 + "matrix:\n  sets:\n    one: m1\n", "b.yaml": M2 + "matrix:\n  sets:\n    two: m2\n"},
     FAULTS, ['d/b.yaml:6: duplicate matrix "sets" (already defined at d/a.yaml:6)']),
    ("identity map: routing.router.settings.groups",
     {"a.yaml": M1 + "routing:\n  router:\n    settings:\n      groups:\n        g:\n          members: [m1]\n",
      "b.yaml": M2 + "routing:\n  router:\n    settings:\n      groups:\n        g:\n          members: [m2]\n"},
     FAULTS, ['d/b.yaml:9: duplicate groups "g" (already defined at d/a.yaml:9)']),
    ("identity map: profiles and selectors",
     {"a.yaml": M1 + "profiles:\n  p:\n    pins: {x: m1}\nselectors:\n  s:\n    strategy: pin\n    targets: [m1]\n",
      "b.yaml": M2 + "profiles:\n  p:\n    pins: {x: m2}\nselectors:\n  s:\n    strategy: pin\n    targets: [m2]\n"},
     FAULTS, ['d/b.yaml:6: duplicate profiles "p" (already defined at d/a.yaml:6)',
              'd/b.yaml:9: duplicate selectors "s" (already defined at d/a.yaml:9)']),
    ("other mappings merge key by key: macros from one file serve another",
     {"a.yaml": "macros:\n  greeting: hello\n", "b.yaml": M1.replace("echo m1", "echo ${greeting}")},
     lambda c: c.models["m1"].cmd, ("echo", "hello")),
    ("merged keys keep the first file's order: a later macro sees an earlier file's",
     {"a.yaml": "macros:\n  first: one\n", "b.yaml": "macros:\n  second: ${first}-two\n" + M1.replace("echo m1", "echo ${second}")},
     lambda c: c.models["m1"].cmd, ("echo", "one-two")),
    ("nested mappings merge, lists concatenate: hooks.on_startup.preload",
     {"a.yaml": M1 + "hooks:\n  on_startup:\n    preload: [m1]\n", "b.yaml": M2 + "hooks:\n  on_startup:\n    preload: [m2]\n"},
     lambda c: c.preload, ("m1", "m2")),
    ("lists concatenate: apiKeys",
     {"a.yaml": "apiKeys: [key-a]\n", "b.yaml": "apiKeys: [key-b]\n"}, lambda c: c.api_keys, ("key-a", "key-b")),
    ("equal scalars agree",
     {"a.yaml": "globalTTL: 100\n", "b.yaml": "globalTTL: 100\n"}, lambda c: c.global_ttl, 100),
    ("different scalars conflict, at the later file's key",
     {"a.yaml": "globalTTL: 100\n", "b.yaml": "# later\nglobalTTL: 200\n"}, FAULTS,
     ["d/b.yaml:2: conflict at \"globalTTL\": '200' differs from '100' set at d/a.yaml:1"]),
    ("the same text of another type conflicts (100 is a number, '100' a string)",
     {"a.yaml": "globalTTL: 100\n", "b.yaml": "globalTTL: '100'\n"}, FAULTS,
     ["d/b.yaml:1: conflict at \"globalTTL\": '100' differs from '100' set at d/a.yaml:1"]),
    ("a conflict deep inside: its dotted place",
     {"a.yaml": "hooks:\n  on_startup:\n    x: 1\n", "b.yaml": "hooks:\n  on_startup:\n    x: 2\n"}, FAULTS,
     ["d/b.yaml:3: conflict at \"hooks.on_startup.x\": '2' differs from '1' set at d/a.yaml:3"]),
    ("a mapping against a list: incompatible kinds",
     {"a.yaml": "startPort: 5800\n", "b.yaml": "startPort: [5800, 5801]\n"}, FAULTS,
     ['d/b.yaml:1: conflict at "startPort": incompatible YAML node kinds (a list here, a scalar at d/a.yaml:1)']),
    ("a null yields to a value",
     {"a.yaml": M1 + "groups:\n", "b.yaml": "groups:\n  g1:\n    members: [m1]\n"},
     lambda c: list(c.groups), ["g1"]),
    ("a ~ yields too (llama-swap's merge yields only to an empty value: docs/config.md's differences)",
     {"a.yaml": M1 + "groups: ~\n", "b.yaml": "groups:\n  g1:\n    members: [m1]\n"},
     lambda c: list(c.groups), ["g1"]),
    ("an empty identity map yields to another file's (llama-swap refuses it: docs/config.md's differences)",
     {"a.yaml": "models:\n", "b.yaml": M1}, lambda c: list(c.models), ["m1"]),
    ("a value stands against a later null",
     {"a.yaml": "globalTTL: 100\n", "b.yaml": "globalTTL:\n"}, lambda c: c.global_ttl, 100),
    ("an empty or comment-only file adds nothing",
     {"a.yaml": M1, "b.yaml": "", "c.yaml": "# nothing yet\n"}, lambda c: list(c.models), ["m1"]),
    ("only *.yml and *.yaml directly in the folder are read",
     {"a.yml": M1, "b.yaml": M2, "notes.md": "not: yaml: at all", "c.yaml.bak": M1, "sub/d.yaml": M1},
     lambda c: list(c.models), ["m1", "m2"]),
    ("${PORT} goes out in sorted model id order across the files",
     {"a.yaml": "startPort: 7000\nmodels:\n  zed:\n    cmd: s --port ${PORT}\n",
      "b.yaml": "models:\n  abe:\n    cmd: s --port ${PORT}\n"},
     lambda c: (c.models["abe"].proxy, c.models["zed"].proxy), ("http://localhost:7000", "http://localhost:7001")),
    ("a fault found once merged is in the file that holds it",
     {"a.yaml": M1, "b.yaml": "# m2\n" + M2 + "    ttl: soon\n"}, FAULTS,
     ["d/b.yaml:6: models.m2.ttl: expected a whole number, got 'soon'"]),
    ("a file whose top level is no mapping",
     {"a.yaml": M1, "b.yaml": "- m2\n"}, FAULTS,
     ["d/b.yaml:1: a config is a mapping of settings (healthCheckTimeout, models, ...)"]),
    ("every file that is not YAML is reported, each in itself",
     {"a.yaml": "models: [\n", "b.yaml": M1, "c.yaml": "globalTTL: 1\n  bad: indent\n"}, FAULTS,
     ["d/a.yaml:1: invalid YAML: the list opened with '[' at column 9 is never closed; add the ']' (the file ends inside it)",
      "d/c.yaml:2: invalid YAML: 'bad:' is indented more than the line above it, so YAML reads it as more of "
      "that line's value; indent it as the keys beside it"]),
]


def write(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(("files", "look", "expected"), [row[1:] for row in MERGE_RULES], ids=[row[0] for row in MERGE_RULES])
def test_merge_rule(tmp_path, monkeypatch, files: dict[str, str], look: Callable[[Config], Any] | str, expected: Any):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "d", files)
    if look == FAULTS:
        with pytest.raises(ConfigError) as raised:
            load_config_sources(None, "d")
        assert [str(fault) for fault in raised.value.faults] == expected
    else:
        assert look(load_config_sources(None, "d")) == expected


def test_config_file_merges_first_and_may_not_be_in_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, {"main.yaml": "macros:\n  tag: main\n" + M1, "d/extra.yaml": M2.replace("echo m2", "echo ${tag}")})
    config = load_config_sources("main.yaml", "d")
    assert list(config.models) == ["m1", "m2"] and config.models["m2"].cmd == ("echo", "main")
    assert config.path == "main.yaml"
    with pytest.raises(SwaplabError, match="--config d/extra.yaml is also present in --config-dir d; remove it from one"):
        load_config_sources("d/extra.yaml", "d")


@pytest.mark.parametrize(("config", "config_dir", "message"), [
    (None, None, "at least one of --config or --config-dir must be given"),
    (None, "empty", "no configuration sources found: --config-dir empty holds no *.yml or *.yaml file"),
    (None, "missing", "--config-dir missing: No such file or directory"),
])
def test_no_sources(tmp_path, monkeypatch, config, config_dir, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SwaplabError) as raised:
        load_config_sources(config, config_dir)
    assert str(raised.value) == message


def test_an_empty_folder_beside_a_config_is_the_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, {"main.yaml": M1})
    (tmp_path / "d").mkdir()
    assert list(load_config_sources("main.yaml", "d").models) == ["m1"]


def test_unknown_keys_warn_in_their_own_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "d", {"a.yaml": M1 + "    colour: blue\n", "b.yaml": "# b\n" + M2 + "    flavour: mint\n"})
    config = load_config_sources(None, "d")
    assert config.warnings == ("d/a.yaml:5: unknown key 'colour' ignored", "d/b.yaml:6: unknown key 'flavour' ignored")
    assert config.models["m2"].raw_text.startswith("  m2:\n    cmd: echo m2")  # the entry's text, from its own file


def test_config_check_reports_a_duplicate_id_at_its_file_and_line(tmp_path):
    directory = tmp_path / "conf.d"
    write(directory, {"10-base.yaml": M1, "20-more.yaml": "# more models\n" + M2 + M1.replace("models:\n", "")})
    result = run_swaplab("config", "check", "--config-dir", str(directory))
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        f'{directory}/20-more.yaml:6: duplicate models "m1" (already defined at {directory}/10-base.yaml:2)'
    ]
    (directory / "20-more.yaml").write_text(M2)
    result = run_swaplab("config", "show", "--config-dir", str(directory))
    assert result.returncode == 0, result.stderr
    assert list(json.loads(result.stdout)["models"]) == ["m1", "m2"]


def test_watch_config_reloads_when_a_file_is_added_to_the_folder(router_factory, tmp_path):
    directory = tmp_path / "conf.d"
    directory.mkdir()
    base = f"models:\n  a-steady:\n    cmd: {SIM} --port ${{PORT}} --model a-steady\n"
    router = router_factory(base, "--config-dir", str(directory), "--watch-config")

    def listed() -> list[str]:
        with urllib.request.urlopen(f"{router.url}/v1/models") as response:
            return [model["id"] for model in json.load(response)["data"]]

    assert listed() == ["a-steady"]
    (directory / "b.yaml").write_text(f"models:\n  b-new:\n    cmd: {SIM} --port ${{PORT}} --model b-new\n")
    wait_until(lambda: "b-new" in listed(), 30, "the new file's model")
    (directory / "c.yaml").write_text("models:\n  b-new:\n    cmd: echo again\n")
    wait_until(lambda: "config reload refused" in router.output(), 30, "the duplicate to be refused")
    assert f'{directory}/c.yaml:2: duplicate models "b-new" (already defined at {directory}/b.yaml:2)' in router.output()
    assert sorted(listed()) == ["a-steady", "b-new"]
