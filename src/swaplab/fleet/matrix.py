"""llama-swap's matrix solver: which running models must stop so that a target can start.

Pure, like `swap.must_stop` for groups: plain data in, a `MatrixDecision` out. The same
decision as llama-swap's (internal/matrix/program.go `Solve`), step for step:

1. a target already running evicts nothing, whatever else runs;
2. otherwise every set that can hold the target is projected onto {target} ∪ running
   (`config.matrixtree`), and each maximal projection holding the target costs the sum of
   the evict costs (default 1) of the running models it leaves out;
3. the strictly cheapest wins: ties go to the earlier set, then to the earlier projection;
4. a target in no set runs alone: everything running is evicted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from swaplab.config.matrix import set_containing
from swaplab.config.matrixtree import Projector
from swaplab.config.model import MatrixConfig

DEFAULT_EVICT_COST = 1


class MatrixDecision(NamedTuple):
    evict: tuple[str, ...]
    """Running models to stop, in the order of `running`."""
    set_name: str
    """The chosen set; "" when the target is in no set (or already runs outside any)."""
    target_set: tuple[str, ...]
    """One whole combination of the chosen set (sorted): what may run once the target has
    started (informational: only the target is started)."""


def solve(matrix: MatrixConfig, target: str, running: Sequence[str], costs: Mapping[str, int]) -> MatrixDecision:
    """The matrix's decision for starting `target` while `running` run (llama-swap passes them sorted)."""
    if target in running:
        chosen = set_containing(matrix, running)
        return MatrixDecision((), chosen.name if chosen is not None else "", tuple(running))
    projector = Projector([target, *running])
    best = None
    best_cost = 0
    for matrix_set in matrix.sets:
        if target not in matrix_set.models:
            continue
        for projection in projector.project(matrix_set.root):
            if target not in projection.members:
                continue
            cost = sum(costs.get(m, DEFAULT_EVICT_COST) for m in running if m not in projection.members)
            if best is None or cost < best_cost:
                best, best_cost = (matrix_set.name, projection), cost
    if best is None:
        return MatrixDecision(tuple(running), "", (target,))
    set_name, chosen = best
    evict = tuple(model for model in running if model not in chosen.members)
    return MatrixDecision(evict, set_name, chosen.combination)


def evict_cost(matrix: MatrixConfig, model_id: str) -> int:
    return matrix.evict_costs.get(model_id, DEFAULT_EVICT_COST)
