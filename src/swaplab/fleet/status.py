"""The fleet as `/running` shows it: one JSON-ready entry per backend and per device, and
what the kvCache store holds.

Functions over what the fleet hands them (its backends and its counts, the store, NVML's
readings); reading them changes nothing. The fleet keeps its state; how it reads is here.
"""

from __future__ import annotations

import time

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from swaplab.config.model import Config, ModelConfig
from swaplab.config.redact import command_text, config_secrets
from swaplab.fleet.backend import SLEEP_FAULT_LIMIT, Backend, State
from swaplab.fleet.devices import DeviceReading
from swaplab.fleet.kvcache import SavedCache
from swaplab.fleet.kvstore import KvStore, saves_context
from swaplab.fleet.placement import claims, estimate_detail


def backend_entries(
    config: Config,
    backends: Mapping[str, Backend],
    *,
    in_flight: Mapping[str, int],
    queued: Mapping[str, int],
    waiting: Mapping[str, str],
    host_gib: Callable[[Backend], float],
    store: KvStore,
) -> list[dict[str, Any]]:
    """One entry per model that is not stopped, is waiting to start, or has a failure to report
    (`backend_entry`), in llama-swap's order. `queued` and `in_flight` count requests by model,
    `waiting` says why a model's queued requests wait, `host_gib` what a sleeper holds in RAM."""
    entries = []
    secrets = config_secrets(config)
    now = time.monotonic()
    for backend in sorted(backends.values(), key=lambda b: b.id):  # llama-swap's order
        count = queued.get(backend.id, 0)
        if backend.state is State.STOPPED and not backend.consecutive_failures and not count \
                and not backend.last_fallback:
            continue
        entries.append(backend_entry(
            backend,
            in_flight=in_flight.get(backend.id, 0),
            queued=count,
            waiting=waiting.get(backend.id),
            claim=claims(config, backend.id),
            now=now,
            host_gib=host_gib(backend) if backend.model.sleep is not None else None,
            secrets=secrets,
            context=context_status(config, store, backend.id, backend),
            estimate=estimate_detail(config, backend.id),
        ))
    return entries


def context_status(config: Config, store: KvStore, model_id: str, backend: Backend | None) -> dict[str, Any] | None:
    """The model's `kv_cache` object (`context_entry`); None without `kvCache`."""
    model = config.models.get(model_id)
    if backend is not None and backend.state is not State.STOPPED:
        model = backend.model  # the entry it runs (a reload may have changed the config's)
    if model is None or not saves_context(model):
        return None
    return context_entry(model, backend, store.saved(model_id), store.identity(model), time.time())


def contexts_status(config: Config, store: KvStore, backends: Mapping[str, Backend]) -> dict[str, Any]:
    """`/running`'s `kv_cache`: the store's folder, budget and use, and each model's saved context."""
    models = {
        m: entry for m in sorted(config.models)
        if (entry := context_status(config, store, m, backends.get(m))) is not None
    }
    return {
        "path": store.settings.path,
        "budget_gib": store.settings.budget_gib,
        "used_bytes": store.used_bytes(),
        "models": models,
    }


def devices_status(
    config: Config, backends: Iterable[Backend], readings: Mapping[int, DeviceReading]
) -> list[dict[str, Any]]:
    """`device_entries` with each device's claims by the models not stopped: a sleeper's apart (it holds no GPU)."""
    held: dict[int, dict[str, float | None]] = {}
    asleep: dict[int, dict[str, float | None]] = {}
    for backend in backends:
        if backend.state is not State.STOPPED:
            holders = asleep if backend.state is State.SLEEPING else held  # a sleeper holds no GPU
            for device, amount in claims(config, backend.id).items():
                holders.setdefault(device, {})[backend.id] = amount
    return device_entries(config, readings, held, asleep)


def backend_entry(
    backend: Backend,
    *,
    in_flight: int,
    queued: int,
    waiting: str | None,
    claim: dict[int, float | None],
    now: float,
    host_gib: float | None = None,
    secrets: Iterable[str] = (),
    context: dict[str, Any] | None = None,
    estimate: str | None = None,
) -> dict[str, Any]:
    """A backend's state, load and last failure; `waiting` is why its queued requests wait, if known.

    `estimate` is the arithmetic of its device claim where that claim is estimated from the
    model file (no `vramGiB` declared).

    `context` is its `kv_cache` object (`context_entry`), for a model with `kvCache`.
    Its `cmd` is shown with its secrets masked (`config.redact.command_text`): secret flags' and
    assignments' values, and `secrets` (the config's keys) wherever they appear.
    """
    model = backend.model
    entry: dict[str, Any] = {  # llama-swap's fields first, then swaplab's
        "model": backend.id,
        "state": str(backend.state),
        "cmd": command_text(model.cmd, secrets),
        "proxy": model.proxy,
        "ttl": model.ttl,
        "name": model.name,
        "description": model.description,
        "pid": backend.pid,
        "in_flight": in_flight,
        "queued": queued,
        "devices": _claim_json(claim),
    }
    if estimate is not None:
        entry["claim_estimate"] = estimate
    if not backend.state.holds_gpu and queued and waiting is not None:
        entry["waiting"] = waiting
    if backend.phase:
        entry["phase"] = backend.phase
    if backend.watch is not None:
        entry["progress"] = backend.watch.view(time.monotonic())
    if backend.start_seconds is not None:
        entry["start_seconds"] = round(backend.start_seconds, 3)
    if backend.model.sleep is not None:
        entry["sleep"] = _sleep_json(backend, host_gib)
    if context is not None:
        entry["kv_cache"] = context
    if backend.consecutive_failures:
        entry["consecutive_failures"] = backend.consecutive_failures
        entry["last_error"] = backend.last_error
        backoff = backend.backoff_until - now
        if backoff > 0:
            entry["backoff_seconds"] = round(backoff, 1)
    return entry


def _sleep_json(backend: Backend, host_gib: float | None) -> dict[str, Any]:
    """How the model sleeps and how its sleeps went: `/running`'s `sleep` object."""
    sleep = backend.model.sleep
    assert sleep is not None
    entry: dict[str, Any] = {
        "engine": sleep.engine,
        "level": sleep.level,
        "enabled": backend.sleep_faults < SLEEP_FAULT_LIMIT,
        "sleeps": backend.sleeps,
        "wakes": backend.wakes,
        "ready_by": backend.ready_by,
        "host_gib": None if host_gib is None else round(host_gib, 3),
    }
    if backend.host_gib is not None:
        entry["measured_host_gib"] = round(backend.host_gib, 3)
    if backend.state is State.SLEEPING and backend.asleep_since is not None:
        entry["asleep_since"] = backend.asleep_since
    if backend.last_sleep_seconds is not None:
        entry["last_sleep_seconds"] = round(backend.last_sleep_seconds, 3)
    if backend.last_wake_seconds is not None:
        entry["last_wake_seconds"] = round(backend.last_wake_seconds, 3)
    if backend.sleep_faults:
        entry["consecutive_faults"] = backend.sleep_faults
    if backend.last_fallback:
        entry["last_fallback"] = backend.last_fallback
    if backend.last_freed is not None:
        entry["last_freed_gib"] = round(backend.last_freed.gib, 3)
        entry["last_freed_by"] = backend.last_freed.source
    return entry


def context_entry(
    model: ModelConfig, backend: Backend | None, saved: Sequence[SavedCache], identity: str | None, now: float
) -> dict[str, Any]:
    """What is saved of a model's context (`kvCache`) and how its saves and restores went: the
    `kv_cache` object of `/running` and the live feed. `identity` is the model's cache identity now:
    a saved cache of another one (its entry or model file changed since) is `stale` and never restored."""
    settings = model.kv_cache
    assert settings is not None
    slots = []
    for cache in saved:
        slot: dict[str, Any] = {
            "slot": cache.slot_id, "tokens": cache.tokens, "bytes": cache.bytes, "saved_at": cache.saved_at,
            "age_seconds": round(max(0.0, now - cache.saved_at), 1),
        }
        if cache.identity != identity:
            slot["stale"] = True
        slots.append(slot)
    current = [s for s in slots if not s.get("stale")]
    entry: dict[str, Any] = {
        "min_tokens": settings.min_tokens,
        "save_timeout": settings.save_timeout,
        "saved_tokens": sum(s["tokens"] for s in current),
        "saved_bytes": sum(s["bytes"] for s in current),
        "saved": slots,
    }
    stats = backend.context if backend is not None else None
    if backend is None or stats is None:
        return entry
    entry.update(saves=stats.saves, restores=stats.restores, save_failures=stats.save_failures,
                 restore_failures=stats.restore_failures)
    if backend.state is not State.STOPPED and stats.restored_tokens:
        entry["restored_tokens"] = stats.restored_tokens
    if stats.last_save_seconds is not None:
        entry["last_save_seconds"] = round(stats.last_save_seconds, 3)
    if stats.last_restore_seconds is not None:
        entry["last_restore_seconds"] = round(stats.last_restore_seconds, 3)
    if stats.last_failure:
        entry["last_failure"] = stats.last_failure
        entry["failed_at"] = stats.failed_at
    return entry


def device_entries(
    config: Config,
    readings: Mapping[int, DeviceReading],
    held: Mapping[int, Mapping[str, float | None]],
    asleep: Mapping[int, Mapping[str, float | None]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per declared device (and per device NVML sees): size, claims, real memory.

    `held` is each device's claims by the models holding the GPU, `asleep` the sleeping models'. `vram_gib` is the declared
    size (None when not declared), `claimed_gib` the sum of the claims, `models` each
    one's claim (None = the whole of a device of undeclared size); `total_gib`,
    `used_gib`, `free_gib` and `nvml_name` are NVML's reading, present only when NVML
    answers.
    """
    entries = []
    for device in sorted(set(config.devices) | set(readings)):
        declared = config.devices.get(device)
        reading = readings.get(device)
        models = held.get(device, {})
        entry: dict[str, Any] = {
            "id": device,
            "name": (declared.name if declared else "") or (reading.name if reading else ""),
            "vram_gib": declared.vram_gib if declared and declared.vram_gib else None,
            "claimed_gib": round(sum(a for a in models.values() if a is not None), 3),
            "models": {m: (None if a is None else round(a, 3)) for m, a in models.items()},
            # Sleeping models' claims: theirs again when they wake, not held now (not in claimed_gib).
            "asleep": {m: (None if a is None else round(a, 3)) for m, a in (asleep or {}).get(device, {}).items()},
        }
        if reading is not None:
            entry.update(
                nvml_name=reading.name,
                total_gib=round(reading.total_gib, 3),
                used_gib=round(reading.used_gib, 3),
                free_gib=round(reading.free_gib, 3),
            )
        entries.append(entry)
    return entries


def _claim_json(claim: dict[int, float | None]) -> dict[str, float | None]:
    """JSON object keys are strings: `{"0": 8.5, "1": 8.5}`; None = the whole device."""
    return {str(device): amount for device, amount in claim.items()}
