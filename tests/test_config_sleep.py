"""A model's `sleep:` and the top-level `hostMemory:`: the engines' presets, what is refused and where."""

from __future__ import annotations

from configtext import faults_of, load

from swaplab.config.model import HostMemory, SleepCall


def test_vllm_level_1_is_the_default_and_sleeps_and_wakes_in_one_call_each():
    config = load("""
        models:
          a:
            cmd: vllm serve x --port ${PORT} --enable-sleep-mode --served-model-name a
            env: [VLLM_SERVER_DEV_MODE=1]
            sleep:
              engine: vllm
    """)
    sleep = config.models["a"].sleep
    assert sleep is not None and sleep.level == 1 and sleep.timeout == 120
    # mode=wait: vLLM's default mode would abort what is running (vllm/v1/engine/core.py:2439-2443).
    assert sleep.sleep_calls == (SleepCall("POST", "/sleep?level=1&mode=wait"),)
    assert sleep.wake_calls == (SleepCall("POST", "/wake_up"),)
    assert sleep.host_memory_gib is None
    assert config.host_memory == HostMemory(budget_gib=None, headroom_gib=8.0)


def test_vllm_level_2_reloads_the_weights_and_resets_the_prefix_cache_on_wake():
    sleep = load("""
        models:
          a:
            cmd: vllm serve x --port ${PORT} --enable-sleep-mode
            useModelName: x
            env: [VLLM_SERVER_DEV_MODE=1]
            sleep: {engine: vllm, level: 2, hostMemoryGiB: 2.5, timeout: 300}
    """).models["a"].sleep
    assert sleep is not None
    assert [str(call) for call in sleep.wake_calls] == [
        "POST /wake_up?tags=weights", "POST /collective_rpc", "POST /wake_up?tags=kv_cache", "POST /reset_prefix_cache",
    ]
    assert sleep.wake_calls[1].body == {"method": "reload_weights"}
    assert (sleep.host_memory_gib, sleep.timeout) == (2.5, 300)


def test_sglang_releases_and_resumes_memory_occupation():
    sleep = load("""
        hostMemory:
          budgetGiB: 96
          headroomGiB: 4
        models:
          a:
            cmd: python -m sglang.launch_server --port ${PORT} --enable-memory-saver --enable-weights-cpu-backup
            sleep:
              engine: sglang
    """)
    model = sleep.models["a"].sleep
    assert model is not None and model.level is None
    # Paused with its requests retracted first: a release with a busy scheduler kills SGLang
    # (sglang/srt/managers/scheduler_components/weight_updater.py:339-341).
    assert model.sleep_calls == (
        SleepCall("POST", "/pause_generation", {"mode": "retract"}), SleepCall("POST", "/release_memory_occupation", {}),
    )
    assert model.wake_calls == (
        SleepCall("POST", "/resume_memory_occupation", {}), SleepCall("POST", "/continue_generation", {}),
    )
    assert sleep.host_memory == HostMemory(budget_gib=96, headroom_gib=4)


def test_http_calls_as_written_and_a_preset_replaced():
    config = load("""
        macros:
          level: 2
        models:
          a:
            cmd: server --port ${PORT}
            sleep:
              engine: http
              sleepRequests: [PUT /pause]
              wakeRequests:
                - post /resume
                - {method: POST, path: /warm, body: {prompt: hi, n: 1}}
          b:
            cmd: vllm serve --port ${PORT} --enable-sleep-mode
            env: [VLLM_SERVER_DEV_MODE=1]
            sleep:
              engine: vllm
              wakeRequests: ["POST /wake_up", "POST /reset_prefix_cache"]
    """)
    a = config.models["a"].sleep
    assert a is not None and a.sleep_calls == (SleepCall("PUT", "/pause"),)
    assert a.wake_calls == (SleepCall("POST", "/resume"), SleepCall("POST", "/warm", {"prompt": "hi", "n": 1}))
    b = config.models["b"].sleep
    assert b is not None and b.sleep_calls == (SleepCall("POST", "/sleep?level=1&mode=wait"),)
    assert [str(call) for call in b.wake_calls] == ["POST /wake_up", "POST /reset_prefix_cache"]


def test_every_mistake_is_a_fault_at_its_line():
    faults = faults_of("""
        hostMemory:
          budgetGiB: lots
        models:
          a:
            cmd: x --port ${PORT}
            sleep: {level: 1}
          b:
            cmd: x --port ${PORT}
            sleep:
              engine: sglang
              level: 2
          c:
            cmd: x --port ${PORT}
            sleep:
              engine: vllm
              level: 3
              timeout: 0
          d:
            cmd: x --port ${PORT}
            sleep:
              engine: http
              sleepRequests: [FETCH /x, POST nowhere]
          e:
            cmd: x --port ${PORT}
            sleep:
              engine: tgi
    """)
    assert faults == [
        (3, "hostMemory.budgetGiB: expected a number of GiB, got 'lots'"),
        (7, "models.a.sleep: needs engine: one of vllm, sglang, http"),
        (12, "models.b.sleep.level: a sleep level is vLLM's (engine: vllm)"),
        (17, "models.c.sleep.level: vLLM's sleep levels are 1 and 2, got 3"),
        (18, "models.c.sleep.timeout: must be more than 0 seconds"),
        (21, "models.d.sleep: engine http needs wakeRequests: the calls to make, in order"),
        (23, "models.d.sleep.sleepRequests: unknown HTTP method 'FETCH' (valid: GET, POST, PUT, PATCH, DELETE)"),
        (23, "models.d.sleep.sleepRequests: a path on the model's server starts with '/', got 'nowhere'"),
        (27, "models.e.sleep.engine: unknown engine 'tgi' (valid: vllm, sglang, http)"),
    ]


def test_an_unknown_key_in_sleep_is_a_warning_with_its_line():
    config = load("""
        models:
          a:
            cmd: x --port ${PORT}
            sleep:
              engine: vllm
              wakeSeconds: 3
    """)
    assert config.warnings[-1] == "test.yaml:7: unknown key 'wakeSeconds' ignored"
    # `x` is no vLLM it can see: its sleep flags cannot be checked before it runs.
    assert config.warnings[0].startswith("test.yaml:5: models.a.sleep: its cmd does not show vLLM")
    assert len(config.warnings) == 2
