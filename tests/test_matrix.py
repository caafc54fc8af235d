"""The matrix block as tables: the DSL's tokens and meaning, each fault in llama-swap's words at its line.

The expectations are llama-swap's own (internal/matrix/dsl_test.go and
internal/config/matrix_test.go at 0bdb3720), which build their configs as Go structs; here
the same configs are written as YAML, the way a user writes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swaplab.config.matrix import (
    DslError,
    Token,
    can_contain_all,
    matrix_from_data,
    read_matrix,
    set_containing,
    tokenize,
)
from swaplab.config.matrixtree import Projector
from swaplab.config.reader import Findings
from swaplab.config.yamlreader import YamlSection
from swaplab.config.yamltree import parse
from swaplab.errors import ConfigError


CORPUS = Path(__file__).parent / "fixtures" / "llama-swap"


def read(text: str, models: str = "gemma qwen mistral voxtral llama70B reranker", **aliases: str):
    """The `matrix:` block of a YAML text, and the faults and warnings found reading it."""
    findings = Findings("m.yaml")
    root = parse(text, "m.yaml").root
    section = YamlSection(findings, root.value["matrix"].item, ("matrix",))
    matrix = read_matrix(section, set(models.split()), aliases=aliases)
    return matrix, [str(fault) for fault in findings.faults], list(findings.warnings)


def sets_of(matrix) -> dict[str, list[list[str]]]:
    return {s.name: [sorted(c) for c in s.combinations] for s in matrix.sets}


# -- the DSL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, tokens", [
    ("abc", [Token("ident", "abc")]),
    ("model-name.v2", [Token("ident", "model-name.v2")]),  # one identifier
    ("(a | +base) & b", [
        Token("(", "("), Token("ident", "a"), Token("|", "|"), Token("ref", "base"),
        Token(")", ")"), Token("&", "&"), Token("ident", "b"),
    ]),
    ("modèle_1 &\tb", [Token("ident", "modèle_1"), Token("&", "&"), Token("ident", "b")]),  # unicode letters, any space
])
def test_tokens(text, tokens):
    assert tokenize(text) == [*tokens, Token("eof")]


@pytest.mark.parametrize("text, message", [
    ("+", "tokenize: expected set name after '+' at position 1"),
    ("a @ b", "tokenize: unexpected character '@' at position 2"),
])
def test_tokenizer_faults(text, message):
    with pytest.raises(DslError, match=f"^{message}$".replace("+", r"\+")):
        tokenize(text)


@pytest.mark.parametrize("expression, combinations", [
    ("a", [["a"]]),
    ("a & b", [["a", "b"]]),
    ("a | b | c", [["a"], ["b"], ["c"]]),
    ("(a | b) & (c | d)", [["a", "c"], ["a", "d"], ["b", "c"], ["b", "d"]]),
    ("a | b & c", [["a"], ["b", "c"]]),  # AND binds tighter
    ("(a | b) & c", [["a", "c"], ["b", "c"]]),
    ("a & a", [["a"]]),  # duplicates collapse
    ("a | (a & b)", [["a", "b"]]),  # {a} is a subset of {a, b}: the set already permits it
    ("  a  ", [["a"]]),
])
def test_what_an_expression_means(expression, combinations):
    matrix = matrix_from_data({"sets": {"test": expression}}, ["a", "b", "c", "d"])
    assert sets_of(matrix) == {"test": combinations}


def test_references_inline_the_set_they_name():
    matrix = matrix_from_data(
        {"sets": {"llms": "g | q | m", "with_tts": "+llms & v", "mega": "+with_tts & e"}}, ["g", "q", "m", "v", "e"]
    )
    assert sets_of(matrix)["mega"] == [["e", "g", "v"], ["e", "q", "v"], ["e", "m", "v"]]
    assert matrix.sets[2].models == {"e", "g", "m", "q", "v"}


def test_set_order_is_definition_order_with_each_reference_ahead_of_its_user():
    matrix = matrix_from_data(
        {"sets": {"first": "a", "uses_later": "+later & b", "other": "c", "later": "d | +first"}},
        ["a", "b", "c", "d"],
    )
    assert [s.name for s in matrix.sets] == ["first", "later", "uses_later", "other"]


def test_a_product_is_never_expanded_to_answer_a_question():
    # 10^6 combinations; the questions project them onto a handful of models.
    groups = " & ".join("(" + " | ".join(f"m-{d}-{c}" for c in range(10)) + ")" for d in range(6))
    models = ["target"] + [f"m-{d}-{c}" for d in range(6) for c in range(10)]
    matrix = matrix_from_data({"sets": {"large": f"target & {groups}"}}, models)
    assert can_contain_all(matrix, ["target", "m-0-3", "m-5-9"])
    assert not can_contain_all(matrix, ["m-0-3", "m-0-4"])
    projections = Projector(["target", "m-0-1", "m-0-2"]).project(matrix.sets[0].root)
    assert [sorted(p.members) for p in projections] == [["m-0-1", "target"], ["m-0-2", "target"]]
    assert len(projections[0].combination) == 7


def test_can_contain_all_and_the_set_that_does():
    models = ["a", "b", "c"]
    together = matrix_from_data({"sets": {"pool": "a & b"}}, models)
    apart = matrix_from_data({"sets": {"pool": "a | b"}}, models)
    assert can_contain_all(together, ["a", "b"]) and not can_contain_all(apart, ["a", "b"])
    assert can_contain_all(apart, []) and can_contain_all(apart, ["a"])
    assert not can_contain_all(together, ["c"])  # in no set
    both = matrix_from_data({"sets": {"one": "a | b", "two": "(a | c) & b", "three": "a & b & c"}}, models)
    assert set_containing(both, ["a", "b"]).name == "two"
    assert set_containing(both, []) is None


def test_the_conformance_corpus_large_symbolic_set_holds_the_spillover_targets():
    text = (CORPUS / "selectors_test__TestConfig_Selectors_SpilloverCoexistence__4.yaml").read_text()
    models = list(parse(text, "x").root.value["models"].item.value)
    matrix, faults, _ = read(text, " ".join(models))
    assert not faults
    assert can_contain_all(matrix, ["target", "model-0-0"])


# -- reading the block -------------------------------------------------------------------------


BASIC = """
matrix:
  vars:
    g: gemma
    q: qwen
    m: mistral
    v: voxtral
    L: llama70B
  evict_costs:
    L: 30
    v: 50
  sets:
    standard: "(g | q | m) & v"
    full: L
"""


def test_a_block_read_whole():
    matrix, faults, warnings = read(BASIC)
    assert not faults and not warnings
    assert matrix.vars == {"g": "gemma", "q": "qwen", "m": "mistral", "v": "voxtral", "L": "llama70B"}
    assert matrix.evict_costs == {"llama70B": 30, "voxtral": 50}
    assert sets_of(matrix) == {
        "standard": [["gemma", "voxtral"], ["qwen", "voxtral"], ["mistral", "voxtral"]],
        "full": [["llama70B"]],
    }
    assert matrix.sets[0].expression == "(g | q | m) & v"


def test_identifiers_are_vars_first_then_model_ids():
    matrix, faults, _ = read("""
matrix:
  vars: {g: gemma, qwen: gemma}
  sets:
    direct: gemma & voxtral
    mixed: g | qwen
    dedup: g & gemma
""")
    assert not faults
    assert sets_of(matrix) == {"direct": [["gemma", "voxtral"]], "mixed": [["gemma"]], "dedup": [["gemma"]]}


def test_evict_costs_resolved_a_var_before_a_model_of_the_same_name():
    matrix, faults, _ = read("""
matrix:
  vars: {g: gemma, L: llama70B, qwen: voxtral}
  evict_costs: {L: 30, g: 5, mistral: 10, qwen: 7}
  sets: {s: g}
""")
    assert not faults
    assert matrix.evict_costs == {"llama70B": 30, "gemma": 5, "mistral": 10, "voxtral": 7}


@pytest.mark.parametrize("key", ["abcdefghijklmnopqrstuvwxyzABCDEF", "model-var", "model.var", "7b"])
def test_var_names_allowed(key):
    _, faults, _ = read(f"matrix:\n  vars: {{'{key}': gemma}}\n  sets: {{s: '{key}'}}\n")
    assert faults == []


RULE = "must contain only alphanumeric, '-' or '.' characters and be 1-32 characters long"


@pytest.mark.parametrize("block, expected", [
    # var names and what they name
    ("vars: {abcdefghijklmnopqrstuvwxyzABCDEFG: gemma}\n  sets: {s: gemma}",
     [f'm.yaml:2: matrix: var key "abcdefghijklmnopqrstuvwxyzABCDEFG" {RULE}']),
    ("vars: {a_b: gemma}\n  sets: {s: gemma}", [f'm.yaml:2: matrix: var key "a_b" {RULE}']),
    ("vars: {'': gemma}\n  sets: {s: gemma}", [f'm.yaml:2: matrix: var key "" {RULE}']),
    ("vars:\n    x: nonexistent\n  sets: {s: gemma}",
     ['m.yaml:3: matrix: var key "x" references unknown model "nonexistent"']),
    ("vars:\n    x: gem\n  sets: {s: gemma}",  # an alias
     ['m.yaml:3: matrix: var key "x" references unknown model "gem" (it is an alias of "gemma": a var names a model id)']),
    ("vars:\n    x: [gemma]\n  sets: {s: gemma}", ["m.yaml:3: matrix.vars.x: expected a string, got a list"]),
    # evict_costs
    ("evict_costs:\n    gemma: 0\n  sets: {s: gemma}",
     ['m.yaml:3: matrix: evict_cost for "gemma" must be a positive integer, got 0']),
    ("evict_costs:\n    gemma: -1\n  sets: {s: gemma}",
     ['m.yaml:3: matrix: evict_cost for "gemma" must be a positive integer, got -1']),
    ("evict_costs:\n    unknown: 5\n  sets: {s: gemma}", ['m.yaml:3: matrix: evict_costs: unknown var or model "unknown"']),
    ("evict_costs:\n    gemma: lots\n  sets: {s: gemma}", ["m.yaml:3: matrix.evict_costs.gemma: expected a whole number, got 'lots'"]),
    # sets
    ("vars: {g: gemma}", ["m.yaml:2: matrix: matrix must define at least one set"]),
    ("sets: {}", ["m.yaml:2: matrix: matrix must define at least one set"]),
    ("sets:\n    s: g & nonexistent", ['m.yaml:3: matrix: set "s": unknown var or model "g"',
                                      'm.yaml:3: matrix: set "s": unknown var or model "nonexistent"']),
    ("sets:\n    a: +nonexistent", ['m.yaml:3: matrix: set "a" references undefined set "nonexistent"']),
    ("sets:\n    a: +b\n    b: +a", ['m.yaml:3: matrix: circular reference detected involving set "a"']),
    ("sets:\n    a: +a\n    b: gemma", ['m.yaml:3: matrix: circular reference detected involving set "a"']),
    ("sets:\n    s: ''", ['m.yaml:3: matrix: set "s": empty DSL expression']),
    ("sets:\n    s: (gemma", ['m.yaml:3: matrix: set "s": parse: missing closing parenthesis']),
    ("sets:\n    s: gemma)", ['m.yaml:3: matrix: set "s": parse: unexpected token ")" after expression']),
    ("sets:\n    s: ()", ['m.yaml:3: matrix: set "s": parse: unexpected token ")"']),
    ("sets:\n    s: gemma &", ['m.yaml:3: matrix: set "s": parse: unexpected token ""']),
    ("sets:\n    s: gemma @ qwen", ['m.yaml:3: matrix: set "s": tokenize: unexpected character \'@\' at position 6']),
    ("sets:\n    s: gemma & +", ['m.yaml:3: matrix: set "s": tokenize: expected set name after \'+\' at position 9']),
    ("sets:\n    s: [gemma]", ["m.yaml:3: matrix.sets.s: expected a string, got a list"]),
    ("sets: [gemma]", ["m.yaml:2: matrix.sets: expected a mapping, got a list",
                       "m.yaml:2: matrix: matrix must define at least one set"]),
])
def test_faults(block, expected):
    _, faults, _ = read(f"matrix:\n  {block}\n", "gemma qwen", gem="gemma")
    assert faults == expected


def test_every_fault_is_told_and_a_broken_set_does_not_break_its_users_twice():
    _, faults, _ = read("""
matrix:
  vars: {a_b: gemma}
  sets:
    broken: (gemma
    user: +broken & qwen
    fine: gemma | qwen
""")
    assert faults == [
        f'm.yaml:3: matrix: var key "a_b" {RULE}',
        'm.yaml:5: matrix: set "broken": parse: missing closing parenthesis',
    ]


def test_unknown_keys_in_the_block_are_warnings():
    _, faults, warnings = read("matrix:\n  set: {s: gemma}\n  sets: {s: gemma}\n")
    assert not faults
    assert warnings == ["m.yaml:2: unknown key 'set' ignored (did you mean 'sets'?)"]


def test_matrix_from_data_raises_every_fault():
    with pytest.raises(ConfigError) as raised:
        matrix_from_data({"vars": {"x": "nope"}, "sets": {"s": "y"}}, ["gemma"])
    assert [fault.message for fault in raised.value.faults] == [
        'matrix: var key "x" references unknown model "nope"',
        'matrix: set "s": unknown var or model "y"',
    ]
