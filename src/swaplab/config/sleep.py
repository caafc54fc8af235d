"""A model's `sleep:` and the top-level `hostMemory:`: swaps that keep the engine's process.

```yaml
hostMemory:
  budgetGiB: 96        # RAM sleeping models may hold together (default: what the system has free)
  headroomGiB: 8       # without budgetGiB: never let available RAM fall below this
models:
  qwen:
    cmd: vllm serve ... --enable-sleep-mode      # with env VLLM_SERVER_DEV_MODE=1
    sleep:
      engine: vllm     # vllm | sglang | http
      level: 1         # vllm: 1 keeps the weights in RAM, 2 drops them
      hostMemoryGiB: 18
      timeout: 120
      sleepRequests: [POST /sleep?level=1]          # replace the preset's calls (http: required)
      wakeRequests:
        - POST /wake_up
        - {method: POST, path: /collective_rpc, body: {method: reload_weights}}
```

Each engine's preset is the sequence its documentation gives; `docs/sleep.md` shows them.
"""

from __future__ import annotations

from swaplab.config.model import HostMemory, SleepCall, SleepConfig
from swaplab.config.tree import Item, to_plain
from swaplab.config.yamlreader import YamlSection, shown

ENGINES = ("vllm", "sglang", "http")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
DEFAULT_TIMEOUT = 120.0
DEFAULT_HEADROOM_GIB = 8.0

VLLM_WAKE_LEVEL_2 = (
    # vLLM's documented order after a level-2 sleep: memory for the weights, the weights
    # from disk, then the KV cache; the prefix cache indexes blocks that no longer hold anything.
    SleepCall("POST", "/wake_up?tags=weights"),
    SleepCall("POST", "/collective_rpc", {"method": "reload_weights"}),
    SleepCall("POST", "/wake_up?tags=kv_cache"),
    SleepCall("POST", "/reset_prefix_cache"),
)
# vLLM's default mode aborts what is running (vllm/v1/engine/core.py:2439-2443); `wait` lets it
# finish first (core.py:1139). The router drains a model before it sleeps, but a request it did
# not send (a client of the port itself) is not cut.
VLLM_MODE = "wait"
# SGLang asserts an idle scheduler on release and dies otherwise (weight_updater.py:339-341),
# unless generation was paused with its requests aborted or retracted: pausing with `retract`
# first makes a release it always survives; `continue_generation` after the resume.
SGLANG_SLEEP = (
    SleepCall("POST", "/pause_generation", {"mode": "retract"}),
    SleepCall("POST", "/release_memory_occupation", {}),
)
SGLANG_WAKE = (
    SleepCall("POST", "/resume_memory_occupation", {}),
    SleepCall("POST", "/continue_generation", {}),
)


def preset(engine: str, level: int | None) -> tuple[tuple[SleepCall, ...], tuple[SleepCall, ...]]:
    """The (sleep, wake) calls for an engine, as its release serves them; `http` has none."""
    if engine == "vllm":
        if level == 2:
            return (SleepCall("POST", f"/sleep?level=2&mode={VLLM_MODE}"),), VLLM_WAKE_LEVEL_2
        return (SleepCall("POST", f"/sleep?level=1&mode={VLLM_MODE}"),), (SleepCall("POST", "/wake_up"),)
    if engine == "sglang":
        # With --enable-memory-saver (and --enable-weights-cpu-backup, so the weights come back).
        return SGLANG_SLEEP, SGLANG_WAKE
    return (), ()


def read_sleep(model: YamlSection) -> SleepConfig | None:
    """The model's `sleep:`; None when it has none (a swap stops it, as always)."""
    section = model.section("sleep")
    if section is None:
        return None
    engine_entry = section.entry("engine")
    engine = section.string("engine", "")
    if engine_entry is None:
        model.fault(model.entries["sleep"], f"needs engine: one of {', '.join(ENGINES)}")
    elif engine not in ENGINES:
        section.fault(engine_entry, f"unknown engine '{engine}' (valid: {', '.join(ENGINES)})")
    if engine not in ENGINES:  # the one fault says it all: the rest is read for unknown keys only
        section.read_keys.update(section.entries)
        return None
    level_entry = section.entry("level")
    level = section.integer("level", 1) if engine == "vllm" else None
    if level_entry is not None and engine != "vllm":
        section.fault(level_entry, "a sleep level is vLLM's (engine: vllm)")
    elif level is not None and level not in (1, 2):
        section.fault(level_entry, f"vLLM's sleep levels are 1 and 2, got {level}")  # type: ignore[arg-type]
        level = 1
    sleep_calls, wake_calls = preset(engine, level)
    for key in ("sleepRequests", "wakeRequests"):
        written = _calls(section, key)
        if written is not None:
            if key == "sleepRequests":
                sleep_calls = written
            else:
                wake_calls = written
        elif engine == "http":
            model.fault(model.entries["sleep"], f"engine http needs {key}: the calls to make, in order")
    host = section.number("hostMemoryGiB", None, unit="GiB")
    timeout = section.number("timeout", DEFAULT_TIMEOUT)
    if timeout == 0:
        section.fault(section.entries["timeout"], "must be more than 0 seconds")
        timeout = DEFAULT_TIMEOUT
    section.finish()
    return SleepConfig(
        engine=engine, level=level, sleep_calls=sleep_calls, wake_calls=wake_calls,
        host_memory_gib=host, timeout=timeout or DEFAULT_TIMEOUT,
    )


def _calls(section: YamlSection, key: str) -> tuple[SleepCall, ...] | None:
    entry = section.entry(key)
    if entry is None:
        return None
    if not entry.item.is_sequence or not entry.item.value:
        section.fault(entry, f"expected a list of calls such as 'POST /wake_up', got {shown(entry.item)}")
        return None
    calls = []
    for item in entry.item.value:
        call = _call(section, key, item)
        if call is not None:
            calls.append(call)
    return tuple(calls)


def _call(section: YamlSection, key: str, item: Item) -> SleepCall | None:
    """`METHOD /path`, or `{method, path, body}`."""
    where = section.where(key)
    if item.is_scalar and isinstance(item.value, str):
        method, _, path = item.value.strip().partition(" ")
        body = None
    elif item.is_mapping:
        call = YamlSection(section.findings, item, section.path + (key,))
        method = call.string("method", "POST")
        path = call.string("path", "")
        body_entry = call.entry("body")
        body = to_plain(body_entry.item) if body_entry is not None else None
        call.finish()
    else:
        section.findings.fault(item.line, f"{where}: expected 'METHOD /path' or a mapping, got {shown(item)}")
        return None
    method = method.strip().upper()
    path = path.strip()
    if method not in METHODS:
        section.findings.fault(item.line, f"{where}: unknown HTTP method '{method}' (valid: {', '.join(METHODS)})")
        return None
    if not path.startswith("/"):
        section.findings.fault(item.line, f"{where}: a path on the model's server starts with '/', got '{path}'")
        return None
    return SleepCall(method, path, body)


def read_host_memory(section: YamlSection | None) -> HostMemory:
    """The top-level `hostMemory:`; absent: the system's available RAM less the default headroom."""
    if section is None:
        return HostMemory()
    budget = section.number("budgetGiB", None, unit="GiB")
    headroom = section.number("headroomGiB", DEFAULT_HEADROOM_GIB, unit="GiB")
    section.finish()
    return HostMemory(budget_gib=budget, headroom_gib=DEFAULT_HEADROOM_GIB if headroom is None else headroom)
