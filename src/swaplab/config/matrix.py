"""llama-swap's matrix block (`routing.router.settings.matrix`, or top-level `matrix`): vars, evict_costs, sets.

Each set is an expression in llama-swap's DSL:

    expr  := and ( '|' and )*        OR, the lowest precedence
    and   := atom ( '&' atom )*      AND binds tighter: `a | b & c` is `a | (b & c)`
    atom  := IDENT | '+' IDENT | '(' expr ')'
    IDENT := [letters digits _ - .]+

An identifier is a var (first) or a model id; `+name` inlines set `name`. What an
expression means, and how it is evaluated without expanding it, is `config.matrixtree`'s.
Every fault uses llama-swap's words (internal/config/matrix.go, internal/matrix), after
the block's place (`matrix: set "s": parse: missing closing parenthesis`), at the line of
the key that holds it; all of them are reported, not only the first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swaplab.config.matrixtree import (
    MatrixAnd,
    MatrixModel,
    MatrixNode,
    MatrixOr,
    Projector,
    models_of,
)
from swaplab.config.model import MatrixConfig, MatrixSet
from swaplab.config.reader import Findings
from swaplab.config.tree import Item, from_plain
from swaplab.config.yamlreader import YamlSection

VAR_KEY = re.compile(r"[a-zA-Z0-9.-]{1,32}")
"""What a var's name may be (llama-swap's code; its schema says `^[a-zA-Z0-9]{1,8}$`)."""


# -- the DSL -----------------------------------------------------------------------------


class DslError(ValueError):
    """A set's expression cannot be read; the message is llama-swap's (`parse: missing closing parenthesis`)."""


@dataclass(frozen=True)
class Token:
    kind: str
    """`ident`, `ref`, `&`, `|`, `(`, `)` or `eof`."""
    text: str = ""


_OPERATORS = {"&", "|", "(", ")"}


def tokenize(text: str) -> list[Token]:
    """The expression's tokens, ending with `eof`; positions in faults count characters of `text`."""
    tokens = []
    index = 0
    while index < len(text):
        char = text[index]
        if char.isspace():
            index += 1
        elif char in _OPERATORS:
            tokens.append(Token(char, char))
            index += 1
        elif char == "+":
            start = index = index + 1
            while index < len(text) and _is_identifier_char(text[index]):
                index += 1
            if index == start:
                raise DslError(f"tokenize: expected set name after '+' at position {start}")
            tokens.append(Token("ref", text[start:index]))
        elif _is_identifier_char(char):
            start = index
            while index < len(text) and _is_identifier_char(text[index]):
                index += 1
            tokens.append(Token("ident", text[start:index]))
        else:
            raise DslError(f"tokenize: unexpected character {_go_rune(char)} at position {index}")
    tokens.append(Token("eof"))
    return tokens


def _is_identifier_char(char: str) -> bool:
    # Go's unicode.IsLetter and unicode.IsDigit (Nd, which is str.isdecimal).
    return char.isalpha() or char.isdecimal() or char in "_-."


ParseNode = tuple[str, Any]
"""`("ident", name)`, `("ref", set name)`, `("&", children)` or `("|", children)`."""


def parse(expression: str) -> ParseNode:
    """The expression's tree, names not yet resolved; DslError with llama-swap's message."""
    text = expression.strip()
    if not text:
        raise DslError("empty DSL expression")
    parser = _Parser(tokenize(text))
    try:
        root = parser.expression()
    except RecursionError:
        raise DslError("parse: expression nested too deeply") from None
    if parser.peek().kind != "eof":
        raise DslError(f"parse: unexpected token {_go_string(parser.peek().text)} after expression")
    return root


class _Parser:
    def __init__(self, tokens: list[Token]):
        self.tokens = tokens
        self.position = 0

    def peek(self) -> Token:
        return self.tokens[self.position]

    def next(self) -> Token:
        token = self.tokens[self.position]
        if token.kind != "eof":
            self.position += 1
        return token

    def expression(self) -> ParseNode:
        return self._chain("|", self._and)

    def _and(self) -> ParseNode:
        return self._chain("&", self._atom)

    def _chain(self, operator: str, operand: Callable[[], ParseNode]) -> ParseNode:
        children = [operand()]
        while self.peek().kind == operator:
            self.next()
            children.append(operand())
        return children[0] if len(children) == 1 else (operator, tuple(children))

    def _atom(self) -> ParseNode:
        token = self.next()
        if token.kind in ("ident", "ref"):
            return (token.kind, token.text)
        if token.kind == "(":
            inner = self.expression()
            if self.next().kind != ")":
                raise DslError("parse: missing closing parenthesis")
            return inner
        raise DslError(f"parse: unexpected token {_go_string(token.text)}")


def _names(node: ParseNode) -> list[ParseNode]:
    """The tree's leaves and references, left to right."""
    kind, value = node
    if kind in ("ident", "ref"):
        return [node]
    return [leaf for child in value for leaf in _names(child)]


# -- sets ----------------------------------------------------------------------------------


def compile_sets(
    definitions: Sequence[tuple[str, str | None]],
    resolve: Callable[[str], str | None],
    fault: Callable[[str, str], None],
) -> tuple[MatrixSet, ...]:
    """The sets in tie-break order, each identifier resolved (`resolve`: var or model id -> model id).

    `definitions`: (name, DSL) in the order written; a DSL of None was unreadable (its fault
    already told). `fault(set name, message)` hears each fault ("" for the block's own); a
    set with a fault, or that references one, is left out. The order is llama-swap's:
    definition order, except that a set comes after every set it references (a depth-first
    topological order).
    """
    if not definitions:
        fault("", "matrix must define at least one set")
        return ()
    names = {name for name, _ in definitions}
    parsed: dict[str, ParseNode] = {}
    references: dict[str, list[str]] = {}
    for name, expression in definitions:
        if expression is None:
            continue
        try:
            tree = parse(expression)
        except DslError as error:
            fault(name, f"set {_go_string(name)}: {error}")
            continue
        valid = True
        refs: list[str] = []
        for kind, value in _names(tree):
            if kind == "ident" and resolve(value) is None:
                fault(name, f"set {_go_string(name)}: unknown var or model {_go_string(value)}")
                valid = False
            elif kind == "ref" and value not in names:
                fault(name, f"set {_go_string(name)} references undefined set {_go_string(value)}")
                valid = False
            elif kind == "ref" and value not in refs:
                refs.append(value)
        if valid:
            parsed[name] = tree
            references[name] = refs

    order = _topological_order([name for name, _ in definitions], parsed, references, fault)
    built: dict[str, MatrixNode] = {}
    sets = []
    expressions = dict(definitions)
    for name in order:
        built[name] = _build(parsed[name], resolve, built)
        sets.append(MatrixSet(name, expressions[name] or "", built[name], models_of(built[name])))
    return tuple(sets)


def _topological_order(
    names: list[str], parsed: dict[str, ParseNode], references: dict[str, list[str]], fault: Callable[[str, str], None]
) -> list[str]:
    visiting, done, failed = 1, 2, 3
    state: dict[str, int] = {}
    order: list[str] = []

    def visit(name: str) -> bool:
        seen = state.get(name)
        if seen == visiting:
            fault(name, f"circular reference detected involving set {_go_string(name)}")
            return False
        if seen is not None:
            return seen == done
        if name not in parsed:
            state[name] = failed  # its own fault is told already
            return False
        state[name] = visiting
        valid = True
        for dependency in references[name]:
            valid = visit(dependency) and valid  # visit every one, to find every fault
        state[name] = done if valid else failed
        if valid:
            order.append(name)
        return valid

    for name in names:
        visit(name)
    return order


def _build(node: ParseNode, resolve: Callable[[str], str | None], built: dict[str, MatrixNode]) -> MatrixNode:
    kind, value = node
    if kind == "ident":
        model = resolve(value)
        assert model is not None
        return MatrixModel(model)
    if kind == "ref":
        return built[value]
    children = tuple(_build(child, resolve, built) for child in value)
    return MatrixAnd(children) if kind == "&" else MatrixOr(children)


# -- the block ---------------------------------------------------------------------------


def read_matrix(
    section: YamlSection, model_ids: Collection[str], *, aliases: Mapping[str, str] | None = None
) -> MatrixConfig:
    """The matrix block read from `section`, each fault at its `FILE:LINE` in `section.findings`.

    `model_ids`: the config's model ids (a var must name one; an alias is refused);
    `aliases`: alias -> model id, only to say so when a var names an alias. Warns of unknown
    keys in the block. With faults, the sets that compiled are returned (the loader raises).
    """
    where = section.where()
    model_ids = set(model_ids)

    def fault(line: int, message: str) -> None:
        section.findings.fault(line, f"{where}: {message}")

    variables = _read_vars(section, model_ids, aliases or {}, fault)

    def resolve(identifier: str) -> str | None:
        if identifier in variables:
            return variables[identifier]
        return identifier if identifier in model_ids else None

    evict_costs = _read_evict_costs(section, resolve, fault)

    sets_entry = section.entry("sets")
    sets_section = section.section("sets")
    definitions: list[tuple[str, str | None]] = []
    lines: dict[str, int] = {}
    if sets_section is not None:
        for name, entry in sets_section.entries.items():
            lines[name] = entry.key_line
            readable = entry.item.is_scalar
            expression = sets_section.string(name)  # a list or a mapping is a fault here
            definitions.append((name, expression if readable else None))
    block_line = sets_entry.key_line if sets_entry is not None else section.item.line
    sets = compile_sets(definitions, resolve, lambda name, message: fault(lines.get(name, block_line), message))
    section.finish()
    return MatrixConfig(sets=sets, evict_costs=evict_costs, vars=variables)


def _read_vars(
    section: YamlSection, model_ids: Collection[str], aliases: Mapping[str, str], fault: Callable[[int, str], None]
) -> dict[str, str]:
    variables: dict[str, str] = {}
    block = section.section("vars")
    if block is None:
        return variables
    for key, entry in block.entries.items():
        readable = entry.item.is_scalar
        model = block.string(key)
        if not readable:
            continue
        if not VAR_KEY.fullmatch(key):
            fault(entry.key_line, f"var key {_go_string(key)} must contain only alphanumeric, '-' or '.' "
                                  "characters and be 1-32 characters long")
        if model not in model_ids:
            hint = ""
            if model in aliases:
                hint = f" (it is an alias of {_go_string(aliases[model])}: a var names a model id)"
            fault(entry.key_line, f"var key {_go_string(key)} references unknown model {_go_string(model)}{hint}")
            continue
        variables[key] = model
    return variables


def _read_evict_costs(
    section: YamlSection, resolve: Callable[[str], str | None], fault: Callable[[int, str], None]
) -> dict[str, int]:
    """Model id -> cost; a key that is a var names the var's model, even where a model has its name."""
    costs: dict[str, int] = {}
    block = section.section("evict_costs")
    if block is None:
        return costs
    for key, entry in block.entries.items():
        block.read_keys.add(key)
        cost: int | None = 0  # null decodes as 0 in llama-swap
        if entry.item.value is not None:
            cost = block.integer(key, None)  # type: ignore[arg-type]
            if cost is None:
                continue  # not a whole number: told
        if cost <= 0:
            fault(entry.key_line, f"evict_cost for {_go_string(key)} must be a positive integer, got {cost}")
            continue
        model = resolve(key)
        if model is None:
            fault(entry.key_line, f"evict_costs: unknown var or model {_go_string(key)}")
            continue
        costs[model] = cost
    return costs


def matrix_from_data(data: Mapping[str, Any], model_ids: Collection[str]) -> MatrixConfig:
    """A matrix block given as plain data (`{"vars": ..., "evict_costs": ..., "sets": {...}}`), for a
    Config built in code; ConfigError listing every fault."""
    findings = Findings("<matrix>")
    item = from_plain(dict(data), Item(None, 1))
    matrix = read_matrix(YamlSection(findings, item, ("matrix",)), model_ids)
    findings.raise_faults()
    return matrix


# -- questions -----------------------------------------------------------------------------


def set_containing(matrix: MatrixConfig, model_ids: Sequence[str]) -> MatrixSet | None:
    """The first set (in tie-break order) one of whose combinations holds every one of `model_ids`."""
    if not model_ids:
        return None
    projector = Projector(model_ids)
    required = projector.full_mask()
    wanted = set(model_ids)
    for matrix_set in matrix.sets:
        if not wanted <= matrix_set.models:
            continue
        if any(required & ~mask == 0 for mask in projector.masks(matrix_set.root)):
            return matrix_set
    return None


def can_contain_all(matrix: MatrixConfig, model_ids: Sequence[str]) -> bool:
    """Can these models all run at once under the matrix (one expanded set holds them all)?

    What a spillover selector's local targets must satisfy; true for no models.
    """
    return not model_ids or set_containing(matrix, model_ids) is not None


def _go_string(text: str) -> str:
    """`text` quoted as Go's %q quotes a string (close enough for the characters a config holds)."""
    return json.dumps(text, ensure_ascii=False)


def _go_rune(char: str) -> str:
    """`char` quoted as Go's %q quotes a rune."""
    if char in "'\\":
        return f"'\\{char}'"
    if char.isprintable():
        return f"'{char}'"
    return "'" + json.dumps(char)[1:-1] + "'"
