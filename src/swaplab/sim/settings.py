"""What `swaplab sim` can be told: `SimSettings`, checked as it is made.

Each part is checked where it is served: the engine's flags against its contract
(swaplab.sim.personality), the sleep options (swaplab.sim.sleep), the slots (swaplab.sim.slots).
"""

from __future__ import annotations

from dataclasses import dataclass

from swaplab.errors import SwaplabError
from swaplab.sim.personality import check_settings as check_engine_settings
from swaplab.sim.script import Script
from swaplab.sim.sleep import Engine, Fault, check_settings
from swaplab.sim.slots import SlotFault
from swaplab.sim.slots import check_settings as check_slot_settings


@dataclass(frozen=True)
class SimSettings:
    """Everything `swaplab sim` can be told; port 0 picks a free port."""

    host: str = "127.0.0.1"
    port: int = 0
    model: str = "sim"
    ttft_ms: float = 0.0
    tokens_per_second: float = 0.0  # 0: as fast as possible
    load_seconds: float = 0.0
    startup_lines: tuple[str, ...] = ()
    """An engine's startup output, printed before the port is bound (`--startup-log`)."""
    startup_seconds: float = 1.0
    health_before_ready: bool = False
    crash_after_tokens: int = 0  # 0: never
    default_max_tokens: int = 16
    script: Script | None = None  # scripted chat answers (`--script FILE`, loaded by swaplab.sim.script)
    engine: Engine = "generic"  # which engine it is (swaplab.sim.personality, swaplab.sim.sleep); generic: none
    served_model_names: tuple[str, ...] = ()  # the engine's --served-model-name; none: `model`
    api_key: str | None = None  # the engine's --api-key
    admin_api_key: str | None = None  # SGLang's --admin-api-key
    switches: frozenset[str] = frozenset()  # the engine's on/off flags given (--enable-sleep-mode, ...)
    memory_gib: float = 1.0  # GPU memory the model holds: what a sleep reports it freed
    sleep_seconds: float = 0.0
    wake_seconds: float = 0.0
    sleep_fault: Fault = "none"
    wake_fault: Fault = "none"
    parallel: int = 1  # llama.cpp's slots (`--parallel`), each with its own prompt cache
    prefill_tokens_per_second: float = 0.0  # pace of the prompt tokens a slot did not hold; 0: instant
    slot_save_path: str | None = None  # where /slots/{id}?action=save writes; None: save and restore refused
    slot_fault: SlotFault = "none"
    timings: bool = False  # llama.cpp's `timings` (prompt_n, cache_n) in answers; implied by the slot flags
    sse_ping_interval: float | None = None  # llama.cpp's --sse-ping-interval; None: its environment, else default

    def __post_init__(self) -> None:
        for name in (
            "ttft_ms", "tokens_per_second", "load_seconds", "crash_after_tokens", "default_max_tokens",
            "sleep_seconds", "wake_seconds", "prefill_tokens_per_second", "startup_seconds",
        ):
            if getattr(self, name) < 0:
                raise SwaplabError(f"sim: --{name.replace('_', '-')} must not be negative")
        check_settings(self)
        check_engine_settings(self)
        check_slot_settings(self.parallel, self.slot_save_path, self.slot_fault)
