"""The keys of llama-swap's current schema, read with llama-swap's semantics: tables of
configs, what they resolve to, and each fault at its FILE:LINE in llama-swap's words.

llama-swap's own test corpus runs in tests/test_llama_swap_corpus.py; these tables pin
down what the corpus leaves out (lines, warnings, swaplab's decisions where it differs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configtext import faults_of, load
from swaplab.config.tree import go_float
from swaplab.config.model import (
    Capabilities,
    GroupConfig,
    ProfileConfig,
    SelectorConfig,
    Timeouts,
)

SWAPLAB = Path(sys.executable).parent / "swaplab"
TWO = """\
models:
  a: {cmd: "s --port ${PORT}", aliases: [alias-a]}
  b: {cmd: "s --port ${PORT}"}
"""



# -- filters.setParamsByID ---------------------------------------------------------------


def test_set_params_by_id_keys_become_aliases_after_macro_expansion():
    config = load(
        """\
        startPort: 6300
        macros: {flavour: think}
        models:
          m:
            cmd: s --port ${PORT}
            aliases: [m-explicit]
            filters:
              setParams: {temperature: 0.7}
              setParamsByID:
                "${MODEL_ID}": {temperature: 0.1}
                "${MODEL_ID}:${flavour}": {chat_template_kwargs: {enable_thinking: true}, model: nope}
                "m:${PORT}": {top_k: 5}
                m-explicit: {top_p: 0.5}
        peers:
          cloud:
            proxy: https://api.example.com
            models: [big]
            filters:
              setParamsByID:
                cloud/big: {temperature: 0.3}
        """
    )
    model = config.models["m"]
    # The own id is not an alias, an explicit alias is not repeated; macros (and ${PORT}) apply to keys.
    assert model.aliases == ("m-explicit", "m:think", "m:6300")
    assert model.filters.set_params_by_id == {
        "m": {"temperature": 0.1},
        "m:think": {"chat_template_kwargs": {"enable_thinking": True}},
        "m:6300": {"top_k": 5},
        "m-explicit": {"top_p": 0.5},
    }
    assert config.resolve_alias("m:think") == "m"
    # A peer's setParamsByID is read (and applied by the router), its keys are no aliases.
    assert config.peers["cloud"].filters.set_params_by_id == {"cloud/big": {"temperature": 0.3}}
    assert config.resolve_alias("cloud/big") is None
    assert config.warnings == ("test.yaml:11: models.m.filters.setParamsByID.m:think.model: 'model' cannot be set; ignored",)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            """\
            models:
              a:
                cmd: s --port ${PORT}
                filters:
                  setParamsByID:
                    b: {temperature: 0}
              b: {cmd: "s --port ${PORT}"}
            """,
            [(6, "model a filters.setParamsByID: key 'b' conflicts with an existing model ID")],
        ),
        (
            """\
            models:
              a:
                cmd: s --port ${PORT}
                filters:
                  setParamsByID:
                    shared: {temperature: 0}
              b:
                cmd: s --port ${PORT}
                aliases: [shared]
            """,
            [(6, "duplicate alias 'shared' in model a filters.setParamsByID, already used by model b")],
        ),
        (
            """\
            models:
              a:
                cmd: s --port ${PORT}
                filters: {setParamsByID: {both: {temperature: 0}}}
              b:
                cmd: s --port ${PORT}
                filters: {setParamsByID: {both: {temperature: 1}}}
            """,
            [(7, "duplicate alias 'both' in model b filters.setParamsByID, already used by model a")],
        ),
        (
            """\
            macros: {FIRST: shared, SECOND: shared}
            models:
              a:
                cmd: s --port ${PORT}
                filters:
                  setParamsByID:
                    "${FIRST}": {temperature: 0.1}
                    "${SECOND}": {temperature: 0.2}
            """,
            [(8, 'model a filters.setParamsByID: keys "${FIRST}" and "${SECOND}" resolve to the same value')],
        ),
        (
            """\
            models:
              a:
                cmd: s --port ${PORT}
                filters:
                  setParamsByID:
                    "a:${nope}": {temperature: 0.1}
            """,
            [(6, "unknown macro '${nope}' found in model a filters.setParamsByID key")],
        ),
        (
            """\
            models:
              a:
                cmd: s --port ${PORT}
                filters:
                  setParamsByID:
                    variant: [1, 2]
            """,
            [(6, "models.a.filters.setParamsByID.variant: expected a mapping of parameters, got a list")],
        ),
        (
            """\
            models:
              local:
                cmd: s --port ${PORT}
                filters:
                  setParamsByID:
                    peer/model: {temperature: 0.5}
            peers:
              peer: {proxy: "http://example.com", models: [model]}
            """,
            [(2, 'model local alias "peer/model" conflicts with fully qualified peer model name')],
        ),
    ],
)
def test_set_params_by_id_faults(text, expected):
    assert faults_of(text) == expected


def test_the_legacy_strip_params_is_read_when_strip_params_is_empty_and_never_unknown():
    config = load(
        """\
        models:
          a: {cmd: "s --port ${PORT}", filters: {stripParams: "top_k", strip_params: "top_p"}}
          b: {cmd: "s --port ${PORT}", filters: {strip_params: "top_p, model"}}
        peers:
          p: {proxy: "http://h:1", models: [x], filters: {strip_params: top_p}}
        """
    )
    assert config.models["a"].filters.strip_params == ("top_k",)
    assert config.models["b"].filters.strip_params == ("top_p",)
    # llama-swap reads the old spelling for a model only; a peer's is unknown to it too.
    assert config.warnings == ("test.yaml:5: unknown key 'strip_params' ignored (did you mean 'stripParams'?)",)


# -- capabilities, compat ----------------------------------------------------------------


def test_capabilities_and_compat_are_read_and_validated():
    config = load(
        """\
        macros: {ctx: 32000, vision: image}
        models:
          a:
            cmd: s --port ${PORT}
            capabilities: {in: [text, "${vision}"], out: [text], tools: true, context: "${ctx}"}
            compat: {ignoreWebsockets: true}
          b:
            cmd: s --port ${PORT}
            capabilities: {tools: false, reranker: false}
          comfyui_auto:
            cmd: comfy --port ${PORT}
            concurrencyLimit: 4
            compat: {ignoreWebsockets: false}
        """
    )
    a = config.models["a"]
    assert a.capabilities == Capabilities(input=("text", "image"), output=("text",), tools=True, context=32000)
    assert a.ignore_websockets is True
    assert not config.models["b"].capabilities and config.models["b"].ignore_websockets is False
    # llama-swap's /comfyui model: at least 50 at once, websockets always ignored.
    comfy = config.models["comfyui_auto"]
    assert (comfy.concurrency_limit, comfy.ignore_websockets) == (50, True)

    assert faults_of(
        """\
        models:
          a:
            cmd: s --port ${PORT}
            capabilities:
              in: [text, video]
              out: [smell]
              context: -1
              tools: maybe
        """
    ) == [
        (5, 'model a: capabilities.in: invalid modality "video", must be one of: text, audio, image'),
        (6, 'model a: capabilities.out: invalid modality "smell", must be one of: text, audio, image'),
        (7, "model a: capabilities.context: must be >= 0"),
        (8, "models.a.capabilities.tools: expected true or false, got 'maybe'"),
    ]


def test_timeouts_default_as_llama_swap_and_zero_is_no_limit():
    config = load(
        """\
        models:
          a: {cmd: "s --port ${PORT}"}
          b:
            cmd: s --port ${PORT}
            timeouts: {connect: 5, keepalive: 0, responseHeader: 60, tlsHandshake: 3, expectContinue: 0, idleConn: 9}
        peers:
          p: {proxy: "http://h:1", models: [x]}
        """
    )
    assert config.models["a"].timeouts == Timeouts(
        connect=30, response_header=None, idle_conn=90, keepalive=30, tls_handshake=10, expect_continue=1
    )
    assert config.models["b"].timeouts == Timeouts(
        connect=5, response_header=60, idle_conn=9, keepalive=None, tls_handshake=3, expect_continue=None
    )
    assert config.peers["p"].timeouts.response_header == 60  # a peer's default, as llama-swap's


def test_a_model_without_cmd_loads_with_a_warning():
    config = load(
        """\
        models:
          remote-managed:
            proxy: http://127.0.0.1:9000
          comments-only:
            proxy: http://127.0.0.1:9001
            cmd: |
              # nothing left once comments go
        """
    )
    assert config.models["remote-managed"].cmd == () and config.models["comments-only"].cmd == ()
    assert config.warnings == (
        "test.yaml:2: models.remote-managed: no cmd, so starting this model fails (llama-swap loads it too)",
    )
    # Without cmd there is no ${PORT}, so the default proxy cannot stand (llama-swap's rule).
    assert faults_of("models:\n  a: {ttl: 5}\n") == [
        (
            2,
            "model a: proxy uses ${PORT} but cmd does not - ${PORT} is only available when used in cmd "
            "(the default proxy http://localhost:${PORT} needs it: set proxy)",
        )
    ]


# -- routing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "routing, router, groups",
    [
        ("", "group", {}),
        ("groups:\n  pair: {swap: false, members: [a, b]}\n", "group", {"pair": ("a", "b")}),
        (
            "routing:\n  router:\n    settings:\n      groups:\n        pair: {swap: false, members: [a, b]}\n",
            "group",
            {"pair": ("a", "b")},
        ),
        (
            # `use: group` leaves the matrix block unread and unvalidated, as in llama-swap.
            "routing:\n  router:\n    use: group\n    settings:\n"
            "      groups: {pair: {members: [a]}}\n      matrix: {sets: {bad: 'nosuch & ('}}\n",
            "group",
            {"pair": ("a",)},
        ),
        ("matrix:\n  sets: {both: 'a & b'}\n", "matrix", {}),
        (
            "routing:\n  router:\n    use: matrix\n    settings:\n"
            "      groups: {pair: {members: [nosuch]}}\n      matrix: {vars: {x: a}, sets: {both: 'x & b'}}\n",
            "matrix",
            {},
        ),
        ("groups: {}\nrouting: {router: {use: matrix, settings: {matrix: {sets: {s: a}}}}}\n", "matrix", {}),
    ],
)
def test_the_router_and_its_block(routing, router, groups):
    config = load(TWO + routing)
    assert config.router == router
    assert {group.id: group.members for group in config.groups.values()} == groups
    assert (config.matrix is not None) == (router == "matrix")
    assert config.warnings == ()


def test_the_matrix_is_read_by_the_matrix_reader():
    config = load(TWO + "routing:\n  router:\n    use: matrix\n    settings:\n      matrix:\n"
                        "        vars: {A: a}\n        evict_costs: {A: 5}\n        sets: {both: 'A & b', solo: b}\n")
    assert [matrix_set.name for matrix_set in config.matrix.sets] == ["both", "solo"]
    assert config.matrix.evict_costs == {"a": 5} and config.matrix.vars == {"A": "a"}


@pytest.mark.parametrize(
    "routing, expected",
    [
        (
            "groups: {g: {members: [a]}}\nrouting: {router: {use: group}}\n",
            [(4, "config uses both the legacy top-level 'matrix'/'groups' keys and the new 'routing.router' "
                 "block; please migrate the top-level keys into 'routing.router' and remove them")],
        ),
        (
            "groups: {g: {members: [a]}}\nmatrix: {sets: {s: a}}\n",
            [(5, "config cannot use both 'groups' and 'matrix'")],
        ),
        (
            "routing:\n  router:\n    use: matrix\n",
            [(6, "routing.router.use is 'matrix' but routing.router.settings.matrix is not set")],
        ),
        ("routing:\n  router:\n    use: fancy\n", [(6, 'routing.router.use: unknown router "fancy" (valid: group, matrix)')]),
        ("routing:\n  scheduler:\n    use: lifo\n", [(6, 'routing.scheduler.use: unknown scheduler "lifo" (valid: fifo)')]),
        (
            "routing:\n  scheduler:\n    settings:\n      fifo:\n        priority: {ghost: 3}\n",
            [(8, 'routing.scheduler.settings.fifo.priority references unknown model "ghost"')],
        ),
        (
            "routing:\n  router: {settings: {groups: {one: {members: [a, a]}, two: {members: [a, ghost]}}}}\n",
            [
                (5, "duplicate model member a found in group: one"),
                (5, "model member a is used in multiple groups: one and two"),
                (5, "routing.router.settings.groups.two.members: 'ghost' is not a model"),
            ],
        ),
    ],
)
def test_routing_faults(routing, expected):
    assert faults_of(TWO + routing) == expected


def test_fifo_priority_keys_name_models_by_id_or_alias():
    config = load(TWO + "routing:\n  scheduler:\n    use: fifo\n    settings:\n      fifo:\n"
                        "        priority: {alias-a: 10, b: -2}\n")
    # llama-swap accepts an alias key and never applies it; swaplab applies it to its model.
    assert config.priority == {"a": 10, "b": -2}
    # The model's own id wins over an alias of it; two aliases disagreeing is a fault.
    assert load(TWO + "routing: {scheduler: {settings: {fifo: {priority: {alias-a: 1, a: 2}}}}}\n").priority == {"a": 2}
    text = "models:\n  a: {cmd: 's --port ${PORT}', aliases: [x, y]}\nrouting:\n  scheduler:\n    settings:\n"
    text += "      fifo:\n        priority:\n          x: 1\n          y: 2\n"
    assert faults_of(text) == [
        (9, "routing.scheduler.settings.fifo.priority: 'x' and 'y' both name model 'a', with different priorities")
    ]


# -- profiles and selectors --------------------------------------------------------------

NAMES = """\
models:
  a:
    cmd: s --port ${PORT}
    aliases: [alias-a]
    filters: {setParamsByID: {"a:think": {temperature: 0}}}
  b: {cmd: "s --port ${PORT}"}
peers:
  remote: {proxy: "http://h:1", models: [remote-model, shared]}
  other: {proxy: "http://h:2", models: [shared]}
"""


def test_profiles_load_with_every_kind_of_target():
    config = load(
        NAMES
        + """\
selectors:
  pick: {strategy: pin, targets: [a]}
profiles:
  coding:
    description: for code
    pins:
      direct: a
      alias: alias-a
      variant: "a:think"
      peer: remote/remote-model
      bare-peer: remote-model
      selector: pick
      b: a
      off: ~
      also-off: ""
"""
    )
    assert config.profiles["coding"] == ProfileConfig(
        id="coding",
        description="for code",
        pins={
            "direct": "a", "alias": "alias-a", "variant": "a:think", "peer": "remote/remote-model",
            "bare-peer": "remote-model", "selector": "pick", "b": "a", "off": "", "also-off": "",
        },
    )  # fmt: skip


@pytest.mark.parametrize(
    "profiles, expected",
    [
        (
            "profiles:\n  old:\n    - a\n",
            [(11, "profiles.old: profile must be a mapping with description and pins; "
                  "the legacy list syntax is no longer supported")],
        ),
        ("profiles:\n  empty: {description: nothing}\n", [(11, "profiles.empty.pins must contain at least one entry")]),
        ("profiles:\n  p: {pins: {x: ghost}}\n", [(11, 'profiles.p.pins.x references unknown model "ghost"')]),
        # A bare peer name two peers list is ambiguous: no name.
        ("profiles:\n  p: {pins: {x: shared}}\n", [(11, 'profiles.p.pins.x references unknown model "shared"')]),
        # Pins do not chain.
        (
            "profiles:\n  p:\n    pins:\n      first: a\n      second: first\n",
            [(14, 'profiles.p.pins.second references unknown model "first"')],
        ),
        (
            "profiles:\n  p:\n    pins:\n      remote/remote-model: a\n",
            [(13, 'profile p pin "remote/remote-model" conflicts with fully qualified peer model name')],
        ),
        ("profiles:\n  ' ':\n    pins: {x: a}\n", [(11, "profiles: profile names cannot be empty")]),
    ],
)
def test_profile_faults(profiles, expected):
    assert faults_of(NAMES + profiles) == expected


def test_selectors_load_with_defaults():
    config = load(
        NAMES
        + """\
groups:
  pool: {swap: false, members: [a, b]}
selectors:
  coding:
    strategy: spillover
    targets: [alias-a, b, remote/remote-model]
    name: Coding
    description: the coding pool
    unlisted: true
    metadata: {purpose: code}
  warmest: {strategy: warm, targets: ["a:think", b]}
"""
    )
    assert config.selectors["coding"] == SelectorConfig(
        id="coding", strategy="spillover", targets=("alias-a", "b", "remote/remote-model"), spillover=1,
        name="Coding", description="the coding pool", unlisted=True, metadata={"purpose": "code"},
    )  # fmt: skip
    assert config.selectors["warmest"].targets == ("a:think", "b")
    assert config.groups["pool"] == GroupConfig(id="pool", swap=False, members=("a", "b"))


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("' ': {strategy: pin, targets: [a]}", "selectors: selector names cannot be empty"),
        ("a: {strategy: pin, targets: [b]}", 'selectors.a: name conflicts with model ID "a"'),
        ("alias-a: {strategy: pin, targets: [b]}", 'selectors.alias-a: name conflicts with model alias "alias-a"'),
        ("a:think: {strategy: pin, targets: [b]}", 'selectors.a:think: name conflicts with model alias "a:think"'),
        (
            "remote/remote-model: {strategy: pin, targets: [b]}",
            'selector ID "remote/remote-model" conflicts with fully qualified peer model name',
        ),
        ("s: {targets: [a]}", "selectors.s.strategy is required"),
        ("s: {strategy: random, targets: [a]}", 'selectors.s.strategy: unknown strategy "random" (valid: warm, pin, spillover)'),
        ("s: {strategy: pin}", "selectors.s.targets must contain at least one entry"),
        ("s: {strategy: pin, targets: [a, ghost]}", 'selectors.s.targets[1] references unknown model "ghost"'),
        ("s: {strategy: warm, targets: [a, remote-model]}", 'selectors.s.targets[1] must resolve to a local model for strategy "warm"'),
        ("s: {strategy: spillover, targets: [a], settings: {spillover: 0}}", "selectors.s.settings.spillover must be >= 1"),
        ("s: {strategy: spillover, targets: [a, alias-a]}", 'selectors.s.targets contains duplicate resolved model "a"'),
        (
            "s: {strategy: spillover, targets: [remote-model, remote/remote-model]}",
            'selectors.s.targets contains duplicate resolved model "remote/remote-model"',
        ),
        ("s: {strategy: spillover, targets: [a, b]}", "selectors.s spillover targets must share a group with swap: false"),
    ],
)
def test_selector_faults(selector, expected):
    text = NAMES + "selectors:\n  t: {strategy: pin, targets: [b]}\n  " + selector + "\n"
    assert faults_of(text) == [(12, expected)]


def test_a_selector_never_targets_a_selector():
    text = NAMES + "selectors:\n  t: {strategy: pin, targets: [a]}\n  s: {strategy: pin, targets: [b, t]}\n"
    assert faults_of(text) == [(12, 'selectors.s.targets[1] references selector "t"; selector chaining is not supported')]


@pytest.mark.parametrize(
    "routing, fault",
    [
        ("groups:\n  pool: {swap: false, members: [a, b]}\n", None),
        ("groups:\n  pool: {swap: true, members: [a, b]}\n", "selectors.s spillover targets must share a group with swap: false"),
        (
            "groups:\n  one: {swap: false, members: [a]}\n  two: {swap: false, members: [b]}\n",
            "selectors.s spillover targets must share one routing group",
        ),
        ("matrix:\n  sets: {pool: 'a & b'}\n", None),
        ("matrix:\n  sets: {big: '(a | c) & b'}\n", None),
        ("matrix:\n  sets: {pool: 'a | b'}\n", "selectors.s.targets must all appear together in one expanded matrix set"),
    ],
)
def test_spillover_targets_must_be_able_to_run_together(routing, fault):
    text = "models:\n  a: {cmd: 's --port ${PORT}'}\n  b: {cmd: 's --port ${PORT}'}\n  c: {cmd: 's --port ${PORT}'}\n"
    text += routing + "selectors:\n  s: {strategy: spillover, targets: [a, b]}\n"
    if fault is None:
        assert load(text).selectors["s"].targets == ("a", "b")
    else:
        line = text.count("\n") - 1
        assert faults_of(text) == [(line + 1, fault)]


# -- hooks.on_startup.preload: a selector's name ----------------------------------------

PRELOAD_BASE = NAMES + "groups:\n  pool: {swap: false, members: [a, b]}\n"


@pytest.mark.parametrize(
    "selector, preload, expected",
    [
        # at launch nothing runs and nothing is reserved: every strategy takes its first target
        ("{strategy: pin, targets: [alias-a, b]}", "[s]", ("a",)),
        ("{strategy: warm, targets: [b, a]}", "[s]", ("b",)),
        ("{strategy: spillover, targets: [a, b]}", "[s]", ("a",)),
        ("{strategy: pin, targets: ['a:think']}", "[s]", ("a",)),
        # warm and spillover take a target an earlier preload starts; pin does not look
        ("{strategy: warm, targets: [a, b]}", "[b, s]", ("b",)),
        ("{strategy: spillover, targets: [a, b]}", "[b, s]", ("b",)),
        ("{strategy: pin, targets: [a, b]}", "[b, s]", ("b", "a")),
    ],
)
def test_preload_of_a_selector_starts_the_model_it_picks_at_launch(selector, preload, expected):
    # llama-swap keeps only model ids and aliases (internal/config/load.go:270-283) and starts
    # nothing for a selector's name; swaplab starts what the selector would route to
    config = load(PRELOAD_BASE + f"selectors:\n  s: {selector}\nhooks: {{on_startup: {{preload: {preload}}}}}\n")
    assert (config.preload, config.warnings) == (expected, ())


def test_preload_of_a_selector_that_picks_a_peer_model_starts_nothing_and_says_so():
    config = load(
        PRELOAD_BASE
        + "selectors:\n  s: {strategy: pin, targets: [remote/remote-model, a]}\n"
        + "hooks: {on_startup: {preload: [s]}}\n"
    )
    assert config.preload == ()
    assert config.warnings == (
        (
            "test.yaml:14: hooks.on_startup.preload: 's' is a selector whose pick at launch, "
            "'remote/remote-model', is a peer's model; not preloaded"
        ),
    )


# -- upstream.ignorePaths ----------------------------------------------------------------

DEFAULT_IGNORE = (r".*\.(js|json|css|png|gif|jpg|jpeg|ico|txt)$",)


@pytest.mark.parametrize(
    "upstream, patterns",
    [
        ("", DEFAULT_IGNORE),
        ("upstream: {}\n", DEFAULT_IGNORE),
        ("upstream: {ignorePaths: []}\n", DEFAULT_IGNORE),  # llama-swap: an empty list cannot disable it
        ("upstream:\n  ignorePaths:\n    - ^/ws$|^/api/jobs$\n    - '[.]map$'\n", ("^/ws$|^/api/jobs$", "[.]map$")),
    ],
)
def test_ignore_paths(upstream, patterns):
    assert load(TWO + upstream).ignore_paths == patterns


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("[invalid(", "unterminated character set at position 0 (swaplab matches with Python's re)"),
        (r"^/x(?=y)", "lookaround (RE2, which llama-swap uses, has none)"),
        (r"(a)\1", r"backreference \1 (RE2, which llama-swap uses, has none)"),
        (r"a*+", "possessive repeat (RE2, which llama-swap uses, has none)"),
        (r"(?>ab)", "atomic group (RE2, which llama-swap uses, has none)"),
        (r"a\Z", r"\Z (RE2, which llama-swap uses, has none; its \z is Python's \Z)"),
        (r"(?x)a b", "flag x (RE2, which llama-swap uses, has none)"),
        ("[[:alpha:]]+", "a POSIX class such as [[:alpha:]] (Python's re reads it as a set of characters)"),
        (r"\z", "bad escape \\z at position 0 (swaplab matches with Python's re)"),
    ],
)
def test_an_ignore_path_both_engines_cannot_read_alike_is_a_fault(pattern, why):
    text = TWO + f"upstream:\n  ignorePaths:\n    - '{pattern}'\n"
    assert faults_of(text) == [(6, f'upstream.ignorePaths: invalid regular expression "{pattern}": {why}')]


def test_ignore_paths_the_engines_read_alike_pass():
    text = TWO + r"upstream: {ignorePaths: ['[(?=]x', '\(?=y', '[]a]', 'a{2}', '\\1', '(?i)^/A(?:b)$']}" + "\n"
    assert load(text).ignore_paths == ("[(?=]x", r"\(?=y", "[]a]", "a{2}", r"\\1", "(?i)^/A(?:b)$")


# -- what the server records and prints --------------------------------------------------


def test_telemetry_defaults():
    config = load(TWO)
    assert (config.log_time_format, config.log_to_stdout, config.log_requests) == ("", "proxy", False)
    assert (config.metrics_max_in_memory, config.capture_buffer_mb, config.store_path) == (1000, 5, None)
    assert config.session_id_headers == ("X-Session-ID", "X-Litellm-Session-Id")
    assert (config.performance_disabled, config.performance_every) == (False, 5.0)


def test_telemetry_values(tmp_path):
    store = tmp_path / "activity.sqlite"
    config = load(
        TWO
        + f"""\
logTimeFormat: RFC3339
logToStdout: both
logRequests: true
metricsMaxInMemory: 0
captureBuffer: 0
store: {{path: {store}}}
ui:
  activity:
    session_id: [" X-Session-ID ", "", x-session-id, X-Other]
performance: {{disabled: true, every: 1m30s}}
"""
    )
    assert (config.log_time_format, config.log_to_stdout, config.log_requests) == ("rfc3339", "both", True)
    assert (config.metrics_max_in_memory, config.capture_buffer_mb) == (1000, 0)  # <= 0 is llama-swap's default
    assert config.store_path == str(store)
    assert config.session_id_headers == ("X-Session-ID", "X-Other")
    assert (config.performance_disabled, config.performance_every) == (True, 90.0)
    assert load(TWO + "ui: {activity: {session_id: []}}\n").session_id_headers == ()


@pytest.mark.parametrize(
    "every, seconds",
    [("5s", 5), ("1h", 3600), ("2h10s", 7210), ("1.5m", 90), ("5000ms", 5), ("0s", 5), ("0", 5)],
)
def test_performance_every_is_a_go_duration(every, seconds):
    assert load(TWO + f"performance: {{every: {every}}}\n").performance_every == seconds


def test_telemetry_faults(tmp_path):
    unwritable = tmp_path / "locked"
    unwritable.mkdir()
    unwritable.chmod(0o500)
    try:
        faults = faults_of(
            TWO
            + """\
logToStdout: stderr
performance: {every: 1s}
store:
  path: "  "
"""
        )
        assert faults == [
            (4, "logToStdout must be one of: proxy, upstream, both, none"),
            (5, "performance: every must be at least 5s, got 1s"),
            (7, "store.path must not be empty"),
        ]
        assert faults_of(TWO + "performance: {every: 15}\n") == [
            (4, "performance.every: expected a duration such as 15s or 1m30s, got '15' (a duration needs a unit)")
        ]
        assert faults_of(TWO + f"store: {{path: {tmp_path}}}\n") == [
            (4, f"store.path: {tmp_path} is a directory, not a file")
        ]
        if os.geteuid() != 0:  # root writes anywhere
            assert faults_of(TWO + f"store: {{path: {unwritable}/a.db}}\n") == [
                (4, f"store.path: directory {unwritable} is not writable: permission denied")
            ]
    finally:
        unwritable.chmod(0o700)
    assert load(TWO + "logTimeFormat: sometime\n").warnings == (
        "test.yaml:4: logTimeFormat 'sometime' is not one of ansic, unixdate, rubydate, rfc822, rfc822z, rfc850, "
        "rfc1123, rfc1123z, rfc3339, rfc3339nano, kitchen, stamp, stampmilli, stampmicro, stampnano; "
        "logs carry no timestamp (as in llama-swap)",
    )


# -- macros in every top-level value -----------------------------------------------------


def test_global_macros_expand_in_every_top_level_value_keeping_their_type():
    config = load(
        """\
        macros:
          base: 7000
          ttl: 120
          loading: true
          who: a
          header: X-Macro-Session
          key: sk-macro
          ctx: 8192
        startPort: "${base}"
        globalTTL: "${ttl}"
        sendLoadingState: ${loading}
        apiKeys: ["${key}"]
        hooks: {on_startup: {preload: ["${who}"]}}
        ui: {activity: {session_id: ["${header}"]}}
        models:
          a: {cmd: "s --port ${PORT} -c ${ctx}"}
          b: {cmd: "s --port ${PORT}"}
        peers:
          cloud: {proxy: "https://api.example.com", apiKey: "${key}", models: ["${who}-big"]}
        routing: {scheduler: {settings: {fifo: {priority: {a: "${ttl}"}}}}}
        selectors:
          pick: {strategy: pin, targets: ["${who}"], name: "pick ${who}"}
        profiles:
          p: {pins: {x: "${who}"}}
        """
    )
    assert (config.start_port, config.global_ttl, config.send_loading_state) == (7000, 120, True)
    assert config.models["a"].cmd == ("s", "--port", "7000", "-c", "8192") and config.models["a"].ttl == 120
    assert config.api_keys == ("sk-macro",) and config.preload == ("a",)
    assert config.session_id_headers == ("X-Macro-Session",)
    assert config.peers["cloud"].api_key == "sk-macro" and config.peers["cloud"].models == ("a-big",)
    assert config.priority == {"a": 120}
    assert config.selectors["pick"].targets == ("a",) and config.selectors["pick"].name == "pick a"
    assert config.profiles["p"].pins == {"x": "a"}
    assert config.macros[:2] == (("base", 7000), ("ttl", 120))


def test_a_macro_left_in_a_top_level_value_is_a_fault_at_its_line():
    assert faults_of(
        """\
        macros: {known: 1}
        globalTTL: ${known}
        peers:
          cloud:
            proxy: https://api.example.com
            apiKey: ${secret}
            models: [big]
            filters: {setParams: {n: "${nope}"}}
        selectors:
          s: {strategy: pin, targets: ["${PORT}"]}
        mystery: ${not-checked}
        models:
          a: {cmd: "s --port ${PORT}"}
        """
    ) == [
        (6, "peers.cloud.apiKey: unknown macro '${secret}'"),
        (8, "peers.cloud.filters.setParams.n: unknown macro '${nope}'"),
        (10, "selectors.s.targets[0]: unknown macro '${PORT}' (${PORT} is only available in a model)"),
        (10, 'selectors.s.targets[0] references unknown model "${PORT}"'),
    ]


def test_an_env_macro_in_a_flow_list_works_as_in_llama_swap():
    # `[${env.KEY}]` is YAML only once the variable is in: llama-swap substitutes the raw text first.
    config = load("apiKeys: [${env.KEY}]\nmodels:\n  a: {cmd: 's --port ${PORT}'}\n", {"KEY": "sk-1"})
    assert config.api_keys == ("sk-1",)


# -- settings llama-swap clamps ----------------------------------------------------------


@pytest.mark.parametrize(
    "text, health, unload, warnings",
    [
        ("healthCheckTimeout: 5\n", 15, 10, ("test.yaml:1: healthCheckTimeout 5 is below the minimum 15; using 15",)),
        ("healthCheckTimeout: 15\nunloadTimeout: 0\n", 15, 10, ()),
        ("unloadTimeout: 2.5\n", 120, 2.5, ()),
    ],
)
def test_the_clamps_llama_swap_applies(text, health, unload, warnings):
    config = load(text + TWO)
    assert (config.health_check_timeout, config.unload_timeout, config.warnings) == (health, unload, warnings)


def test_negative_ttl_and_timeouts_are_llama_swap_faults():
    assert faults_of(
        """\
        globalTTL: -1
        unloadTimeout: -1
        models:
          a: {cmd: "s --port ${PORT}", ttl: -2, unloadTimeout: -1}
        """
    ) == [
        (1, "globalTTL must be >= 0, got -1"),
        (2, "unloadTimeout must be >= 0, got -1"),
        (4, "model a: invalid TTL value -2"),
        (4, "model a: invalid unloadTimeout value -1"),
    ]


# -- config check --strict ---------------------------------------------------------------


def test_check_strict_makes_warnings_faults(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(TWO + "colour: blue\n")
    env = {key: value for key, value in os.environ.items()}

    def check(*flags):
        return subprocess.run(
            [str(SWAPLAB), "config", "check", *flags, str(path)], capture_output=True, text=True, env=env, timeout=60
        )

    plain = check()
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "", f"{path}:4: unknown key 'colour' ignored\n")
    strict = check("--strict")
    assert (strict.returncode, strict.stdout, strict.stderr) == (1, f"{path}:4: unknown key 'colour' ignored\n", "")
    path.write_text(TWO)
    assert check("--strict").returncode == 0


def test_show_prints_the_new_keys_as_json(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        TWO
        + "routing:\n  router:\n    use: matrix\n    settings:\n      matrix: {vars: {A: a}, sets: {both: 'A & b'}}\n"
        + "selectors:\n  s: {strategy: pin, targets: [a]}\nprofiles:\n  p: {pins: {x: s}}\n"
    )
    result = subprocess.run([str(SWAPLAB), "config", "show", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["router"] == "matrix"
    assert document["matrix"] == {
        "vars": {"A": "a"}, "evict_costs": {}, "sets": [{"name": "both", "expression": "A & b", "models": ["a", "b"]}]
    }
    assert document["selectors"]["s"]["targets"] == ["a"] and document["profiles"]["p"]["pins"] == {"x": "s"}


# -- configs llama-swap accepts ----------------------------------------------------------


def test_an_alias_equal_to_its_own_model_id_loads_as_in_llama_swap():
    # llama-swap's load.go maps the alias to its own model and finds no duplicate; the id names it already.
    config = load(
        """\
        models:
          qwen: {cmd: "s --port ${PORT}", aliases: [qwen, fast]}
          gemma: {cmd: "s --port ${PORT}", aliases: [gemma]}
        """
    )
    assert config.models["qwen"].aliases == ("fast",)
    assert config.models["gemma"].aliases == ()
    assert (config.resolve_alias("qwen"), config.resolve_alias("fast"), config.resolve_alias("gemma")) == (
        "qwen", "qwen", "gemma"
    )


def test_the_other_alias_faults_stay():
    assert faults_of(
        """\
        models:
          a: {cmd: "s --port ${PORT}", aliases: [a, shared]}
          b: {cmd: "s --port ${PORT}", aliases: [shared, a, twice, twice]}
        """
    ) == [
        (3, "duplicate alias shared found in model: b (already an alias of a)"),
        (3, "models.b.aliases: 'a' is already a model id"),
        (3, "models.b.aliases: 'twice' is listed twice"),
    ]


# Go's `%v` of a float64 (strconv.FormatFloat(v, 'g', -1, 64)): shortest digits, exponent form
# when the exponent is < -4 or >= 6 (ftoa.go's "use precision 6 for this decision"), two
# exponent digits at least. The outputs follow those rules; 1e+06, 999999.5, 1.234567e+06,
# 0.0001, 1e-05 and 6.088634523481149e+11 are Go 1.25's, as measured and noted upstream.
GO_FLOATS = [
    (1000000.0, "1e+06"),
    (1e6 + 0.5, "1.0000005e+06"),
    (999999.0, "999999"),
    (999999.5, "999999.5"),
    (1234567.0, "1.234567e+06"),
    (123456.789, "123456.789"),
    (100000.0, "100000"),
    (608863452348.1149, "6.088634523481149e+11"),
    (0.0001, "0.0001"),
    (0.00001, "1e-05"),
    (0.000123, "0.000123"),
    (1.5e-7, "1.5e-07"),
    (0.7, "0.7"),
    (3.14, "3.14"),
    (1.0, "1"),
    (-2.5, "-2.5"),
    (-1e6, "-1e+06"),
    (1e21, "1e+21"),
    (1e100, "1e+100"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (0.1 + 0.2, "0.30000000000000004"),
    (2.0**53, "9.007199254740992e+15"),
    (0.0, "0"),
    (-0.0, "-0"),
    (float("inf"), "+Inf"),
    (float("-inf"), "-Inf"),
    (float("nan"), "NaN"),
]


@pytest.mark.parametrize(("value", "go"), GO_FLOATS, ids=[go for _, go in GO_FLOATS])
def test_a_float_prints_as_gos_percent_v(value, go):
    assert go_float(value) == go


@pytest.mark.parametrize(
    ("written", "go"),
    [
        ("1000000.0", "1e+06"),  # a float macro as users write it for rope-freq-base
        ("1e6", "1e+06"),
        ("10000.0", "10000"),
        ("0.00001", "1e-05"),
        ("-0.0", "-0"),
        ("1000000", "1000000"),  # an int stays an int
        ("0x10", "16"),
        ("1_000", "1000"),
        ("9223372036854775807", "9223372036854775807"),  # int64's largest
        ("18446744073709551615", "18446744073709551615"),  # uint64's largest
        ("100000000000000000000", "1e+20"),  # past uint64 yaml.v3 decodes a float64
        ("true", "true"),
        ("'1000000.0'", "1000000.0"),  # a string is written as it is
    ],
)
def test_a_macro_value_is_written_into_a_string_as_llama_swap_writes_it(written, go):
    config = load(
        f"""\
        macros:
          value: {written}
        models:
          a: {{cmd: "s --port ${{PORT}} --value ${{value}}"}}
        """
    )
    assert config.models["a"].cmd == ("s", "--port", "5800", "--value", go)
