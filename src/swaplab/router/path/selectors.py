"""llama-swap's selectors: a requested selector id resolved to one of its targets before placement.

- `pin`: always the first target.
- `warm`: the first target whose model is ready, else the first starting, else the first.
- `spillover`: counts the requests it has sent to each target and still in flight
  (reservations, released when the request ends) and fills a running target up to
  `spillover` of them before waking a cold one (`choose_spillover`). A websocket to a
  model with `compat.ignoreWebsockets` holds none: it stays outside admission, open as
  long as it likes, so its reservation is given back as soon as it is chosen.

The decisions are pure functions over the targets' states; `Selectors` holds the one
piece of state, the reservation counters, for one config (a reload starts afresh).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from swaplab.config.model import Config, SelectorConfig
from swaplab.fleet import State
from swaplab.router.path.targets import LocalTarget, resolve


@dataclass(frozen=True)
class Candidate:
    """One target of a selector as it stands now."""

    target: str
    """The name as written in the selector (an id, an alias, a peer's model)."""
    key: str
    """What its reservations count against: the local model id, or `peer/model`."""
    state: State | None
    """The local model's state; None for a peer's model."""


WARMTH = ((State.READY,), tuple(state for state in State if state.arriving), (State.SLEEPING,))
"""What `warm` prefers, best first: ready, then on its way (starting, waking), then asleep (a
wake takes seconds where a cold start takes minutes)."""


def choose_warm(candidates: list[Candidate]) -> str:
    """The first ready target, else the first starting or waking, else the first asleep, else the first."""
    for wanted in WARMTH:
        for candidate in candidates:
            if candidate.state in wanted:
                return candidate.target
    return candidates[0].target


def choose_spillover(
    candidates: list[Candidate], reserved: dict[str, int], spillover: int, turn: int
) -> tuple[Candidate, bool] | None:
    """llama-swap's spillover decision (`server/selector.go`), or None when no target can take the request.

    Active targets are local models ready, starting or waking, and any target with
    reservations; cold ones are stopped or sleeping local models (sleeping ones first: a
    wake is faster than a start) and peers without reservations; a model stopping or
    falling asleep is neither. With no active target the first cold one wakes. Otherwise the least
    reserved active target takes the request while it holds fewer than `spillover`; when
    every active one is full, the first cold target wakes, and with none left the least
    reserved active one takes it anyway. Ties among the least reserved go round-robin by
    `turn`; the second value says whether the choice used up that turn.
    """
    active: list[Candidate] = []
    cold: list[Candidate] = []
    for candidate in candidates:
        held = reserved.get(candidate.key, 0)
        if candidate.state is None:
            (active if held > 0 else cold).append(candidate)
        elif candidate.state.leaving:
            continue
        elif candidate.state.serving or held > 0:
            active.append(candidate)
        else:
            cold.append(candidate)
    cold.sort(key=lambda candidate: candidate.state is not State.SLEEPING)  # a sleeper wakes fastest
    if not active:
        return (cold[0], False) if cold else None
    least = min(reserved.get(candidate.key, 0) for candidate in active)
    if least >= spillover and cold:
        return cold[0], False
    tied = [candidate for candidate in active if reserved.get(candidate.key, 0) == least]
    return tied[turn % len(tied)], True


class NoTarget(Exception):
    """A spillover selector found no target that can take the request (503)."""


@dataclass
class Choice:
    """The target a selector chose, and how to give back its reservation once the request ends."""

    target: str
    release: Callable[[], None] | None = None


@dataclass
class _Spillover:
    reserved: dict[str, int] = field(default_factory=dict)
    turn: int = 0


class Selectors:
    """The selectors of one config, and the spillover reservations in flight under it."""

    def __init__(self, config: Config):
        self.config = config
        self._keys: dict[str, list[tuple[str, str, str | None]]] = {}
        for selector in config.selectors.values():
            self._keys[selector.id] = [_keyed(config, target) for target in selector.targets]
        self._spillover = {s.id: _Spillover() for s in config.selectors.values() if s.strategy == "spillover"}

    def choose(self, selector: SelectorConfig, state_of: Callable[[str], State], *, websocket: bool = False) -> Choice:
        """The target `selector` routes this request (a `websocket` upgrade?) to; `NoTarget` when spillover finds none."""
        if selector.strategy == "pin":
            return Choice(selector.targets[0])
        candidates = [
            Candidate(target, key, state_of(model_id) if model_id is not None else None)
            for target, key, model_id in self._keys[selector.id]
        ]
        if selector.strategy == "warm":
            return Choice(choose_warm(candidates))
        spillover = self._spillover[selector.id]
        decision = choose_spillover(candidates, spillover.reserved, selector.spillover, spillover.turn)
        if decision is None:
            raise NoTarget(
                f"selector {json.dumps(selector.id, ensure_ascii=False)} has no available spillover targets"
            )
        chosen, took_turn = decision
        if took_turn:
            spillover.turn += 1
        model = self.config.models.get(chosen.key) if chosen.state is not None else None
        if websocket and model is not None and model.ignore_websockets:
            return Choice(chosen.target)  # as llama-swap: reserved while choosing, given back at once
        spillover.reserved[chosen.key] = spillover.reserved.get(chosen.key, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                spillover.reserved[chosen.key] -= 1

        return Choice(chosen.target, release)


def _keyed(config: Config, target: str) -> tuple[str, str, str | None]:
    """A target with the key its reservations count against and, for a local model, its id."""
    resolved = resolve(config, target)
    if isinstance(resolved, LocalTarget):
        return target, resolved.model_id, resolved.model_id
    if resolved is None:  # the config reader refuses this; a target nothing serves stays cold
        return target, target, None
    return target, f"{resolved.peer.id}/{resolved.model}", None
