"""A matrix set's expression as plain data, and its combinations projected onto the models a question is about.

A set's DSL (`config.matrix` parses it) denotes a family of model combinations: a model
is the one combination {model}; `a | b` the union of the families; `a & b` every union of
one combination from each side (duplicates collapse). A family can be astronomically
large (`(a1|..|a10) & (b1|..|b10) & ...`), so it is never expanded whole: a question
(which set lets `target` run beside the running models, can these models run together)
only cares about a few models, and every combination is *projected* onto those, where
almost all of them collapse into a handful of distinct states. Only the maximal states
are kept: a set permits every subset of a combination, so a state contained in another
can never be the better choice. This is llama-swap's evaluator (internal/matrix), which
has no expansion limit either.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MatrixModel:
    """A leaf: one model id (a var already resolved)."""

    model: str


@dataclass(frozen=True)
class MatrixAnd:
    """`a & b & ...`: one combination from each child, unioned."""

    children: tuple[MatrixNode, ...]


@dataclass(frozen=True)
class MatrixOr:
    """`a | b | ...`: the combinations of every child."""

    children: tuple[MatrixNode, ...]


MatrixNode = MatrixModel | MatrixAnd | MatrixOr
"""A `+ref` is not a node: the referenced set's own tree stands in its place (shared, not copied)."""


@dataclass(frozen=True)
class Projection:
    """One maximal state of a set seen through some relevant models."""

    members: frozenset[str]
    """The relevant models this state lets run together."""
    combination: tuple[str, ...]
    """One whole combination of the set that produces it (sorted): what llama-swap logs as the target set."""


# A state while projecting: the relevant models as bits, and a witness of the combination
# that produced it (a model id, or a (left, right) pair of witnesses; None for nothing),
# flattened only for the states that are asked for.
_Witness = str | tuple["_Witness", "_Witness"] | None
_State = tuple[int, _Witness]


class Projector:
    """Projections of sets onto one list of relevant models; a subtree shared by several sets is evaluated once."""

    def __init__(self, relevant: Iterable[str]):
        self.bits: dict[str, int] = {}
        for model in relevant:
            self.bits.setdefault(model, 1 << len(self.bits))
        self._memo: dict[int, list[_State]] = {}
        self._alive: list[MatrixNode] = []  # the memo is keyed by id(): keep its nodes alive

    def project(self, root: MatrixNode) -> list[Projection]:
        """The maximal states of the expression, in the order llama-swap's evaluator produces them."""
        return [Projection(self._members(mask), _flatten(witness)) for mask, witness in self._evaluate(root)]

    def masks(self, root: MatrixNode) -> list[int]:
        """The same states as bit masks over the relevant models (bit i = the i-th distinct relevant model)."""
        return [mask for mask, _ in self._evaluate(root)]

    def full_mask(self) -> int:
        return (1 << len(self.bits)) - 1

    def _members(self, mask: int) -> frozenset[str]:
        return frozenset(model for model, bit in self.bits.items() if mask & bit)

    def _evaluate(self, node: MatrixNode) -> list[_State]:
        known = self._memo.get(id(node))
        if known is not None:
            return known
        states: list[_State]
        if isinstance(node, MatrixModel):
            states = [(self.bits.get(node.model, 0), node.model)]
        elif isinstance(node, MatrixOr):
            states = []
            for child in node.children:
                for mask, witness in self._evaluate(child):
                    _add_maximal(states, mask, witness)
        else:
            # Projecting each child before combining gives the same unions as the whole
            # Cartesian product, and pruning after each child keeps the product small.
            states = [(0, None)]
            for child in node.children:
                combined: list[_State] = []
                right_states = self._evaluate(child)
                for left_mask, left_witness in states:
                    for right_mask, right_witness in right_states:
                        _add_maximal(combined, left_mask | right_mask, (left_witness, right_witness))
                states = combined
        self._memo[id(node)] = states
        self._alive.append(node)
        return states


def _add_maximal(states: list[_State], mask: int, witness: _Witness) -> None:
    """Add a state unless one already there contains it; drop those it contains (it goes last)."""
    for kept, _ in states:
        if mask & ~kept == 0:
            return
    states[:] = [state for state in states if state[0] & ~mask != 0]
    states.append((mask, witness))


def _flatten(witness: _Witness) -> tuple[str, ...]:
    models: set[str] = set()
    pending = [witness]
    while pending:
        current = pending.pop()
        if current is None:
            continue
        if isinstance(current, str):
            models.add(current)
        else:
            pending.extend(current)
    return tuple(sorted(models))


def models_of(root: MatrixNode) -> frozenset[str]:
    """Every model the expression mentions (a set that lacks one can never run it)."""
    found: set[str] = set()
    seen: set[int] = set()
    pending: list[MatrixNode] = [root]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MatrixModel):
            found.add(node.model)
        else:
            pending.extend(node.children)
    return frozenset(found)


def maximal_combinations(root: MatrixNode, models: Sequence[str]) -> tuple[frozenset[str], ...]:
    """Every maximal combination of the expression (its projection onto all of its `models`)."""
    return tuple(projection.members for projection in Projector(models).project(root))
