"""What a model with an estimated claim really took once ready: its claim from then on.

A model that declares no `vramGiB` is placed by an estimate (`config.estimates`, worked out
from its model file by `swaplab.memory` before it ever ran). Once it is ready, NVML says
what its process tree holds on each device: that figure replaces the estimate, logged beside
it, until the model's entry changes (another `cmd` is another model, estimated anew). What a
vLLM or SGLang start said it allocated (its own log, `memory.reported`) is recorded beside
the estimate either way. The fleet hands each ready backend here and puts the config this
returns in force; placement then reads the measured claims as it read the estimates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from swaplab.config.model import ClaimEstimate, Config
from swaplab.fleet.backend import Backend, Run
from swaplab.fleet.devices import DeviceProbe
from swaplab.fleet.logs import LogHub
from swaplab.fleet.reaper import descendants
from swaplab.memory.reported import engine_said

log = logging.getLogger("swaplab.fleet")

_SAID = "; at its start "
"""Where an estimate's detail goes on with what the engine said it allocated."""


class MeasuredClaims:
    """The measured claims of one fleet, each with the cmd it was measured for.

    `device_probe` is asked for the fleet's probe at each reading: whoever holds the fleet may
    replace its probe after the start (the browser tests give it fixed readings)."""

    def __init__(self, logs: LogHub, device_probe: Callable[[], DeviceProbe]):
        self._logs = logs
        self._device_probe = device_probe
        self._measured: dict[str, tuple[tuple[str, ...], ClaimEstimate]] = {}
        """NVML's reading of what a model with an estimated claim took (or what its engine said it
        allocated, beside the estimate), with the cmd it was for."""

    def gpu_held(self, pid: int) -> dict[int, float] | None:
        """GiB a server's process tree holds on each GPU (NVML), or None where it cannot say."""
        return self._device_probe().process_memory({pid, *(child.pid for child in descendants(pid))})

    def measure(self, config: Config, backend: Backend, run: Run) -> Config:
        """With NVML, what a model with an estimated claim really took once ready: logged beside
        the estimate, and its claim from now on (until its entry changes). What a vLLM or SGLang
        start said it allocated (its own log) is recorded beside the estimate either way.
        Returns `config` with what was measured in place."""
        estimate = config.estimates.get(backend.id)
        if estimate is None or estimate.claim is None or backend.model.vram_gib or run.pid is None:
            return config
        said = engine_said(backend.model.cmd, (line.text for line in self._logs.recent(backend.id)
                                               if line.time >= (backend.started_at or 0)))
        if said is not None:
            log.info("%s: %s (estimated: %s)", backend.id, said, estimate.detail)
            before = estimate.detail.split(_SAID, 1)[0]  # an earlier start's figures give way
            estimate = ClaimEstimate(estimate.claim, f"{before}{_SAID}{said}")
            self._measured[backend.id] = (backend.model.cmd, estimate)
            config = self.applied(config)
        taken = self.gpu_held(run.pid)
        if not taken:
            return config
        measured = {device: round(taken.get(device, 0.0), 3) for device in estimate.claim}
        parts = []
        for device, gib in measured.items():
            guess = estimate.claim[device]
            parts.append(f"{gib:.2f} GiB on device {device} (estimated {guess:.2f}, {(guess - gib) / gib:+.1%})"
                         if gib else f"nothing on device {device} (estimated {guess:.2f})")
        log.info("%s took %s", backend.id, "; ".join(parts))
        self._measured[backend.id] = (backend.model.cmd, ClaimEstimate(
            measured, f"measured after its start: {'; '.join(parts)}; {estimate.detail}"))
        return self.applied(config)

    def applied(self, config: Config) -> Config:
        """`config` with each measured claim in place of its estimate, where the entry is unchanged."""
        kept = {
            model_id: measured for model_id, (cmd, measured) in self._measured.items()
            if model_id in config.estimates and config.models[model_id].cmd == cmd and not config.models[model_id].vram_gib
        }
        return replace(config, estimates={**config.estimates, **kept}) if kept else config
