"""Where a model may run: the one decision to start it, stop others first, wait, or refuse.

Pure: plain data in, a `Placement` out; no processes, no clocks, no I/O. The fleet
gathers the residents (and, when NVML answers, each device's free memory), asks, and
acts on the answer.

Three regimes, chosen by the config:

- **No top-level `devices`**: llama-swap's group rules (`swap.must_stop`), exactly as
  llama-swap applies them. A per-model `devices` then only sets `CUDA_VISIBLE_DEVICES`.
- **With `devices`**: memory decides. Each model claims GiB on devices; models run
  together when, on every device they share, their claims fit its `vramGiB`:

  - a model claims `vramGiB[d]` on each device `d` of its `devices`, or the whole
    device where no amount is given; a model without `devices` claims every declared
    device whole (it could use any of them, so it is given all);
  - a device declared without `vramGiB` holds one model at a time (nothing to add up);
  - the implicit group of ungrouped models is neither `swap` nor `exclusive`, and no
    group's `exclusive` applies: running together is the point of declaring devices,
    and the claims say precisely what exclusivity only approximated. To keep a model
    alone, let it claim its devices whole;
  - an explicit group's `swap: true` still allows one member at a time;
  - a `persistent` group's member is never stopped to make room: a start it blocks is
    refused, naming it.

- **`routing.router.use: matrix`**: llama-swap's matrix solver (`fleet.matrix.solve`)
  decides who must leave, by its sets and evict costs; groups do not apply. With
  `devices` too, the matrix decides first and the claims then refine its decision: they
  may stop more models (never fewer: a set permits every subset of itself), cheapest
  evict cost first among those that must wait alike, or refuse the start as above. A
  model already stopping costs nothing to the solver: it is leaving anyway.

In every regime a model that must go but is busy (requests in flight or admitted work
queued), starting or stopping means *wait*, and nothing is stopped meanwhile; idle ready
models that must go are *evicted*, and the fleet asks again once they have stopped.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from swaplab.config.model import Config, DeviceConfig, MatrixConfig
from swaplab.fleet.matrix import evict_cost, solve
from swaplab.fleet.swap import must_stop

# Float claims such as 8.5 + 7.5 must fit a 16 GiB device exactly.
EPSILON_GIB = 1e-6

Claim = dict[int, float | None]
"""GiB per device id; None = the whole of a device whose size was not declared."""


@dataclass(frozen=True)
class Resident:
    """A model whose backend is not stopped."""

    model_id: str
    state: str
    """"starting", "ready" or "stopping"."""
    busy: bool = False
    """Requests in flight, or admitted work queued for it: never stopped while so."""
    last_used: float = 0.0
    """When its last request ended, on any monotonic scale; smaller = less recently used."""

    @property
    def idle(self) -> bool:
        return self.state == "ready" and not self.busy


@dataclass(frozen=True)
class Placement:
    action: Literal["start", "evict", "wait", "refuse"]
    evict: tuple[str, ...] = ()
    """With "evict": stop these (least recently used first), then ask again."""
    blocking: tuple[str, ...] = ()
    """With "wait": every model that must be gone before the target can start."""
    reason: str = ""
    """With "wait" and "refuse": a sentence naming the models and devices in the way; with
    "evict" under the matrix router, why these go (the set chosen, the devices short)."""
    short_devices: tuple[int, ...] = ()
    """Devices whose free memory (NVML) is short of the claim: with "refuse", or with
    "wait" while memory a backend just left may still be on its way back."""


START = Placement("start")


def place(
    config: Config,
    target: str,
    residents: Sequence[Resident],
    free_gib: Mapping[int, float] | None = None,
    settling: Collection[int] = (),
) -> Placement:
    """What to do so that `target` (a stopped model) can start, given who runs now.

    `free_gib`: free memory per device id as NVML reads it now, or None where unknown.
    `settling`: devices that a backend left moments ago, whose memory the driver may
    still be handing back; a shortfall there means wait, not refuse.
    """
    others = sorted((r for r in residents if r.model_id != target), key=lambda r: r.last_used)
    if config.router == "matrix" and config.matrix is not None:
        return _place_in_matrix(config, config.matrix, target, others, free_gib, settling)
    if not config.devices:
        victims = must_stop(config, target, [r.model_id for r in others])
        by_id = {r.model_id: r for r in others}
        return _evict_or_wait(target, [by_id[v] for v in victims])
    siblings = _swap_siblings(config, target)
    leaving = [r for r in others if r.model_id in siblings]
    return _place_on_devices(config, target, others, free_gib, settling, leaving)


def stands_in_way(config: Config, model_id: str, targets: Iterable[str], residents: Sequence[Resident]) -> bool:
    """Whether `model_id` stands in the way of any of `targets`: placement would evict it, or have
    them wait for it, to start one. A `model_id` not among `residents` is read as if it started now.
    The fleet's fairness asks, with the models whose requests have waited longer as `targets`."""
    if all(r.model_id != model_id for r in residents):
        residents = [*residents, Resident(model_id, "starting", busy=True)]
    for target in targets:
        placement = place(config, target, residents)
        if model_id in placement.evict or model_id in placement.blocking:
            return True
    return False


def claims(config: Config, model_id: str) -> Claim:
    """GiB the model claims on each device; empty when the config declares no devices.

    A model the config no longer names (a reload removed it while its server still
    stops) claims every device whole: what it holds is no longer known.
    """
    if not config.devices:
        return {}
    model = config.models.get(model_id)
    estimated = _estimated(config, model_id)
    if estimated is not None:
        return dict(estimated)
    devices = model.devices if model is not None and model.devices else tuple(config.devices)
    claim: Claim = {}
    for device in devices:
        declared = config.devices.get(device)
        whole = declared.vram_gib if declared is not None and declared.vram_gib else None
        claim[device] = model.vram_gib.get(device, whole) if model is not None else whole
    return claim


def _estimated(config: Config, model_id: str) -> dict[int, float] | None:
    """The claim estimated from the model's file, where it declares none (config/estimates.py)."""
    model = config.models.get(model_id)
    estimate = config.estimates.get(model_id)
    if model is None or model.vram_gib or estimate is None:
        return None
    return estimate.claim


def estimate_detail(config: Config, model_id: str) -> str | None:
    """The arithmetic of the model's estimated claim; None where it declares its own or has none."""
    return config.estimates[model_id].detail if _estimated(config, model_id) is not None else None


def _explicit_amounts(config: Config, model_id: str) -> dict[int, float]:
    """GiB amounts stated for the model: declared `vramGiB`, else its estimate."""
    return dict(config.models[model_id].vram_gib or _estimated(config, model_id) or {})


def _arithmetic(config: Config, model_id: str) -> str:
    """", estimated: ..." for a model whose claim is an estimate; empty for a declared one."""
    detail = estimate_detail(config, model_id)
    return f" ({detail})" if detail is not None else ""


def claim_faults(config: Config, model_id: str) -> list[str]:
    """Why the model's claim can never be met on the declared devices (empty when it can)."""
    faults = []
    for device, amount in claims(config, model_id).items():
        declared = config.devices.get(device)
        if declared is None:
            faults.append(
                f"model {model_id!r} claims device {device}, which is not declared under devices "
                f"(declared: {', '.join(map(str, sorted(config.devices)))})"
            )
        elif declared.vram_gib and amount is not None and amount > declared.vram_gib + EPSILON_GIB:
            faults.append(
                f"model {model_id!r} needs {round(amount, 2):g} GiB on device {_device_name(declared)}, "
                f"which has {declared.vram_gib:g} GiB{_arithmetic(config, model_id)}"
            )
    return faults


# -- with the matrix --------------------------------------------------------------------


def _place_in_matrix(
    config: Config,
    matrix: MatrixConfig,
    target: str,
    others: list[Resident],
    free_gib: Mapping[int, float] | None,
    settling: Collection[int],
) -> Placement:
    """The solver says who must leave; declared devices may then stop more, or refuse."""
    # A model already stopping costs nothing: no set is chosen to keep what is leaving anyway.
    costs = {r.model_id: 0 if r.state == "stopping" else evict_cost(matrix, r.model_id) for r in others}
    decision = solve(matrix, target, sorted(costs), costs)
    leaving = [r for r in others if r.model_id in decision.evict]
    if config.devices:
        placement = _place_on_devices(config, target, others, free_gib, settling, leaving, costs)
    else:
        placement = _evict_or_wait(target, leaving)
    if placement.action != "evict":
        return placement
    if not decision.set_name:
        reason = f"{target!r} is in no matrix set, so it runs alone"
    elif decision.evict:
        reason = f"matrix set {decision.set_name!r} runs {target!r} without {_join(repr(m) for m in decision.evict)}"
    else:
        reason = f"matrix set {decision.set_name!r} lets {target!r} run beside every model running"
    extra = [m for m in placement.evict if m not in decision.evict]
    if extra:
        reason += f"; its device claims also need {_join(repr(m) for m in extra)} stopped"
    return replace(placement, reason=reason)


# -- with devices ----------------------------------------------------------------------


def _place_on_devices(
    config: Config,
    target: str,
    others: list[Resident],
    free_gib: Mapping[int, float] | None,
    settling: Collection[int],
    leaving: list[Resident],
    evict_costs: Mapping[str, int] | None = None,
) -> Placement:
    """`leaving`: the models that must go whatever the claims (a swap group's members, the
    matrix's victims); `evict_costs`: the matrix's, to stop the cheapest first."""
    faults = claim_faults(config, target)
    if faults:
        return Placement("refuse", reason="; ".join(faults))
    want = claims(config, target)
    held = {r.model_id: claims(config, r.model_id) for r in others}

    siblings = leaving
    rest = [r for r in others if r not in siblings]
    # A persistent model already stopping (unloaded by hand) is leaving: wait for it.
    # Groups mean nothing under the matrix router.
    persistent = [
        r for r in rest
        if config.router != "matrix" and config.group_of(r.model_id).persistent and r.state != "stopping"
    ]

    def removal(resident: Resident) -> tuple[int, int]:
        return _cost_of_removal(resident), (evict_costs or {}).get(resident.model_id, 0)
    blocked = _overfull(config, want, (held[r.model_id] for r in persistent))
    if blocked:
        return Placement("refuse", reason=_persistent_reason(config, target, want, blocked, persistent, held))

    # Count first on the models already stopping (they are leaving anyway), then stop
    # idle ones before waiting for busy or starting ones, least recently used first, and
    # only those on a device still too full; then keep back any that proved unnecessary.
    movable = [r for r in rest if r not in persistent and held[r.model_id].keys() & want.keys()]
    order = sorted(movable, key=removal)
    keep = list(rest)
    removed: list[Resident] = []
    for resident in order:
        over = _overfull(config, want, (held[r.model_id] for r in keep))
        if not over:
            break
        if held[resident.model_id].keys() & set(over):
            keep.remove(resident)
            removed.append(resident)
    for resident in sorted(removed, key=lambda r: (*(-part for part in removal(r)), -r.last_used)):
        if not _overfull(config, want, (held[r.model_id] for r in [*keep, resident])):
            keep.append(resident)
            removed.remove(resident)

    needed = sorted(siblings + removed, key=lambda r: r.last_used)
    decision = _evict_or_wait(target, needed)
    if decision.action == "wait" or free_gib is None:
        return decision
    return _check_free_memory(config, target, decision, needed, held, free_gib, rest, settling)


def _cost_of_removal(resident: Resident) -> int:
    """0: stopping already; 1: idle, stopped at once; 2: busy or starting, waited for."""
    if resident.state == "stopping":
        return 0
    return 1 if resident.idle else 2


def _swap_siblings(config: Config, target: str) -> set[str]:
    """Members of the target's explicit `swap: true` group: one of them at a time."""
    for group in config.groups.values():
        if target in group.members and group.swap:
            return set(group.members) - {target}
    return set()


def _overfull(config: Config, want: Claim, held: Iterable[Claim]) -> list[int]:
    """Devices of `want` on which it does not fit beside the `held` claims."""
    on_device = {device: [amount] for device, amount in want.items()}
    for claim in held:
        for device, amount in claim.items():
            if device in on_device:
                on_device[device].append(amount)
    return [device for device, amounts in on_device.items() if not _fits(config.devices[device], amounts)]


def _fits(device: DeviceConfig, amounts: list[float | None]) -> bool:
    if not device.vram_gib or None in amounts:
        return len(amounts) <= 1
    return sum(a for a in amounts if a is not None) <= device.vram_gib + EPSILON_GIB


def _check_free_memory(
    config: Config,
    target: str,
    decision: Placement,
    needed: list[Resident],
    held: dict[str, Claim],
    free_gib: Mapping[int, float],
    rest: list[Resident],
    settling: Collection[int],
) -> Placement:
    """Refuse a start that the memory actually free cannot hold, rather than let it OOM.

    Only explicit amounts (declared `vramGiB`, or an estimate) are checked: a whole-device claim takes what is
    there, and no device ever reports all of its nominal size free. Memory of the models
    being stopped counts as free (at most their claims come back).
    """
    shortfalls = []
    for device, amount in _explicit_amounts(config, target).items():
        if device not in free_gib:
            continue
        returning = [held[r.model_id].get(device, 0.0) for r in needed]
        if None in returning:
            continue  # a whole device of unknown size comes back: no bound to check against
        available = free_gib[device] + sum(a for a in returning if a is not None)
        if amount > available + EPSILON_GIB:
            shortfalls.append((device, amount, available))
    if not shortfalls:
        return decision
    devices = tuple(device for device, _, _ in shortfalls)
    stopping_there = [
        r.model_id for r in rest if r.state == "stopping" and held[r.model_id].keys() & set(devices)
    ]
    if stopping_there or set(devices) & set(settling):
        return Placement(
            "wait",
            reason=f"model {target!r} waits for the memory of stopped models to be released on device "
            f"{', '.join(map(str, devices))}",
            short_devices=devices,
        )
    after = f" even after stopping {_join(repr(r.model_id) for r in needed)}" if needed else ""
    sentences = [
        f"model {target!r} needs {round(amount, 2):g} GiB on device {_device_name(config.devices[device])}, "
        f"which has {available:.1f} GiB free{after} (other processes hold the rest)"
        for device, amount, available in shortfalls
    ]
    sentences[-1] += _arithmetic(config, target)
    return Placement("refuse", reason="; ".join(sentences), short_devices=devices)


def _persistent_reason(
    config: Config, target: str, want: Claim, blocked: list[int], persistent: list[Resident], held: dict[str, Claim]
) -> str:
    parts = []
    blockers: list[str] = []
    for device in blocked:
        holders = [r.model_id for r in persistent if device in held[r.model_id]]
        blockers += [m for m in holders if m not in blockers]
        amounts = _join(f"{m!r} holds {_gib(held[m][device])}" for m in holders)
        parts.append(f"on device {_device_name(config.devices[device])} it needs {_gib(want[device])}, "
                     f"where persistent {amounts}")
    return (
        f"model {target!r} cannot start: {'; '.join(parts)}; a persistent model is never stopped "
        f"to make room: unload {_join(repr(m) for m in blockers)} (POST /unload?model=...) or lower the claims"
    )


# -- shared ------------------------------------------------------------------------------


def _evict_or_wait(target: str, victims: list[Resident]) -> Placement:
    if not victims:
        return START
    held = [v for v in victims if not v.idle]
    if held:
        return Placement(
            "wait",
            blocking=tuple(v.model_id for v in victims),
            reason=f"model {target!r} waits for {_join(_why(v) for v in held)} before it can start",
        )
    return Placement("evict", evict=tuple(v.model_id for v in victims))


def _why(resident: Resident) -> str:
    if resident.state != "ready":
        return f"{resident.model_id!r} ({resident.state})"
    return f"{resident.model_id!r} (busy)"


def _join(items: Iterable[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _device_name(device: DeviceConfig) -> str:
    return f"{device.id} ({device.name})" if device.name else str(device.id)


def _gib(amount: float | None) -> str:
    return "the whole device" if amount is None else f"{amount:g} GiB"
