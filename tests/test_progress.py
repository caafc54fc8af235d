"""Reading a starting server's stage from its output: each engine's rules against real startup
logs (tests/fixtures/startup/, their origins in each file), against every startup line of each
engine's contract (read from its release), and single real lines, prefixed, coloured and redrawn
as they come through a pipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from swaplab.engines import ENGINES, contract
from swaplab.fleet.progress import READY, StartupReader, clean, match

FIXTURES = Path(__file__).parent / "fixtures" / "startup"


def replay(name: str) -> list[tuple[str, float | None, str]]:
    """Every move the reader makes over a fixture's lines (comments skipped, as the sim does)."""
    reader = StartupReader()
    moves = []
    for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        stage = reader.feed(line)
        if stage is not None:
            moves.append((stage.name, stage.fraction, stage.engine))
    assert reader.stage is not None and moves[-1][0] == reader.stage.name
    return moves


def order(moves) -> list[str]:
    names = [name for name, _, _ in moves]
    return [name for i, name in enumerate(names) if i == 0 or names[i - 1] != name]


def fractions(moves, stage: str) -> list[float]:
    return [f for name, f, _ in moves if name == stage and f is not None]


LOGS = {
    # "Available KV cache memory" is the memory profile's result, not an allocation (vllm.yaml):
    # this excerpt has no line of the allocation itself.
    "vllm.log": ("vLLM", ["loading weights", "compiling", "profiling memory", "capturing CUDA graphs",
                          "starting server", READY]),
    "vllm-old.log": ("vLLM", ["loading weights", "profiling memory", "allocating KV cache",
                              "capturing CUDA graphs", "starting server", READY]),
    "sglang.log": ("SGLang", ["loading weights", "allocating KV cache", "capturing CUDA graphs",
                              "starting server", "warming up", READY]),
    # The server says "loading model" before libllama reads the metadata: that is within the load.
    "llamacpp.log": ("llama.cpp", ["loading weights", "creating context", "allocating KV cache",
                                   "reserving compute buffers", "warming up", "starting server", READY]),
    "llamacpp-2024.log": ("llama.cpp", ["starting server", "reading metadata", "loading weights", "creating context",
                                        "allocating KV cache", READY]),
    # The same start at the default verbosity: libllama's lines are not printed, the server's are.
    "llamacpp-default.log": ("llama.cpp", ["loading weights", "warming up", "starting server", READY]),
    # The current releases' lines, one each, as their contracts have them.
    "vllm-0.34.log": ("vLLM", ["reading metadata", "loading weights", "compiling", "profiling memory", "warming up",
                               "capturing CUDA graphs", "allocating KV cache", "starting server", READY]),
    "sglang-0.5.23.log": ("SGLang", ["profiling memory", "loading weights", "allocating KV cache",
                                     "capturing CUDA graphs", "starting server", "warming up", READY]),
}


def test_every_fixture_is_tested():
    assert sorted(LOGS) == sorted(path.name for path in FIXTURES.glob("*.log"))


@pytest.mark.parametrize(("log", "engine", "stages"), [(log, *rest) for log, rest in LOGS.items()])
def test_each_engines_startup_log_moves_through_its_stages_in_order_to_ready(log, engine, stages):
    moves = replay(log)
    assert order(moves) == stages
    assert {e for _, _, e in moves} == {engine}
    for stage in stages:
        seen = fractions(moves, stage)
        # Each move within a stage is forward: strictly rising, never past 1.
        assert seen == sorted(set(seen)) and all(0 <= f <= 1 for f in seen), (stage, seen)


def contract_lines() -> list:
    """(engine, stage, line) for every startup line of every engine's contract, named by its origin, with
    the lines derived for another build (llama-server's `example_llama_server`, its note cut off)."""
    rows = []
    for engine in ENGINES:
        for line in contract(engine).startup.lines:
            rows.append(pytest.param(engine, line.stage, line.example, id=f"{engine}:{line.origin}"))
            derived = (line.model_extra or {}).get("example_llama_server")
            if derived:
                rows.append(pytest.param(engine, line.stage, derived.split(" (derived")[0],
                                         id=f"{engine}:{line.origin} (llama-server)"))
    return rows


@pytest.mark.parametrize(("engine", "stage", "line"), contract_lines())
def test_every_startup_line_of_every_contract_reads_as_its_stage_and_engine(engine, stage, line):
    # Alone, with no engine recognised before it: the line's own words (and prefix) say both.
    found = match(line)
    assert found is not None, line
    assert (found.name, found.engine) == (stage, contract(engine).name), line


@pytest.mark.parametrize(("log", "engine"), [("vllm-0.34.log", "vllm"), ("sglang-0.5.23.log", "sglang")])
def test_the_release_logs_are_their_contracts_examples_in_order(log, engine):
    lines = [line for line in (FIXTURES / log).read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    assert lines == [line.example for line in contract(engine).startup.lines]


def test_a_tabbyapi_start_is_ready_only_once_uvicorn_runs():
    # TabbyAPI's uvicorn says its app is up before it binds the port (tabby.yaml, the ready line's note):
    # those lines, in TabbyAPI's prefix, are its server starting, not vLLM's ready.
    lines = [line.example for line in contract("tabby").startup.lines]
    prefix = lines[-1][: lines[-1].index("Uvicorn")]
    uvicorn = [f"{prefix}Started server process [4242]", f"{prefix}Waiting for application startup.",
               f"{prefix}Application startup complete."]
    reader = StartupReader()
    moves = [stage for line in [*lines[:-1], *uvicorn, lines[-1]] if (stage := reader.feed(line)) is not None]
    assert order([(s.name, s.fraction, s.engine) for s in moves]) == [
        "reading metadata", "loading weights", "starting server", READY]
    assert {s.engine for s in moves} == {"TabbyAPI"}
    assert [s.fraction for s in moves if s.name == "loading weights"] == [None, 1.0]  # the modules' bar: 66/66
    assert (match(uvicorn[-1]).name, match(uvicorn[-1]).engine) == ("starting server", "TabbyAPI")


def test_the_fractions_are_the_engines_own_counts():
    vllm = replay("vllm.log")
    assert fractions(vllm, "loading weights") == [0.0, 1 / 3, 2 / 3, 1.0]
    assert fractions(vllm, "capturing CUDA graphs")[:2] == [23 / 67, 25 / 67]
    # The FULL bar (16/35) after the PIECEWISE one reached 67/67 does not pull the stage back.
    assert fractions(vllm, "capturing CUDA graphs")[-1] == 1.0
    old = replay("vllm-old.log")
    assert fractions(old, "capturing CUDA graphs") == [47 / 53, 52 / 53, 1.0]
    sglang = replay("sglang.log")
    assert fractions(sglang, "loading weights") == [i / 13 for i in range(11)] + [1.0]
    assert fractions(sglang, "capturing CUDA graphs") == [i / 6 for i in range(7)]
    assert fractions(replay("llamacpp-2024.log"), "loading weights") == [1.0]  # the dots end the load


@pytest.mark.parametrize(("line", "expected"), [
    # vLLM
    ("Loading safetensors checkpoint shards:  72% Completed | 78/109 [00:19<00:07,  4.18it/s]",
     ("loading weights", 78 / 109, "vLLM")),
    ("(Worker_TP0 pid=34322) INFO 05-06 20:59:57 [default_loader.py:384] Loading weights took 24.84 seconds",
     ("loading weights", 1.0, "vLLM")),
    ("(VllmWorkerProcess pid=3311317) INFO 07-18 12:26:26 model_runner.py:1071] Loading model weights took 1.9028 GB",
     ("loading weights", 1.0, "vLLM")),
    ("\x1b[1;36m(EngineCore pid=1265223)\x1b[0;0m INFO 06-02 00:51:49 [backends.py:1148] Dynamo bytecode transform time: 8.52 s",
     ("compiling", None, "vLLM")),
    ("(EngineCore_DP0 pid=441) INFO 11-24 11:44:16 [monitor.py:34] torch.compile takes 19.69 s in total",
     ("compiling", 1.0, "vLLM")),
    ("(EngineCore pid=1623438) INFO 04-13 22:09:34 [monitor.py:48] torch.compile took 1.61 s in total",
     ("compiling", 1.0, "vLLM")),
    ("INFO 07-18 12:26:29 distributed_gpu_executor.py:57] # GPU blocks: 464716, # CPU blocks: 16384",
     ("allocating KV cache", None, "vLLM")),
    ("(EngineCore_DP0 pid=387) INFO 03-08 16:44:29 [kv_cache_utils.py:1314] GPU KV cache size: 188,640 tokens",
     ("allocating KV cache", None, "vLLM")),
    (("INFO 07-17 23:41:30 model_runner.py:847] Capturing the model for CUDA graphs. This may lead to unexpected "
     "consequences if the model is not static. To run the model in eager mode, set 'enforce_eager=True' or use "
     "'--enforce-eager' in the CLI."), ("capturing CUDA graphs", None, "vLLM")),
    # tqdm's redraws arrive as one piece between newlines: the last is the one that counts.
    (("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  34%|███▍      | 23/67 [00:02<00:04,  8.92it/s]\r"
     "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  36%|███▌      | 24/67 [00:02<00:04,  9.08it/s]\r"),
     ("capturing CUDA graphs", 24 / 67, "vLLM")),
    # ...and where a paste lost the \r, the last redraw on the line (here with only its percentage).
    (("Capturing CUDA graphs:   0%|                                                                                                           "
     "| 0/67 [00:00<?, ?it/s]Capturing CUDA graphs: 100%|██████████████████████████████████████████████████████████"
     "████████████████████████████████████████| 67/67 [00:17<00:00,  3.94it/s]"),
     ("capturing CUDA graphs", 1.0, "vLLM")),
    (("█████████████████████████████Capturing CUDA graph shapes:  69%|███████████████████████████████Capturing CUDA "
     "graph shapes:  71%|█████████████████████████████████"), ("capturing CUDA graphs", 0.71, "vLLM")),
    ("Capturing prefill CUDA graphs (PIECEWISE): 100%|████████████████████████████████████████| 3/3 [00:00<00:00, 106.98it/s]",
     ("capturing CUDA graphs", 1.0, "vLLM")),
    ("(Worker_TP3_EP3 pid=2709393) INFO 09-29 09:52:22 [gpu_model_runner.py:3468] Graph capturing finished in 38 secs, took 1.64 GiB",
     ("capturing CUDA graphs", 1.0, "vLLM")),
    ("(APIServer pid=1951) INFO:     Application startup complete.", (READY, None, "vLLM")),
    # SGLang
    ("[2025-10-16 09:06:10 TP5] Load weight begin. avail mem=137.29 GB", ("loading weights", None, "SGLang")),
    (("[2026-01-30 20:54:56 PP1 TP1] Load weight end. elapsed=6.21 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
     "avail mem=76.05 GB, mem usage=2.33 GB."), ("loading weights", 1.0, "SGLang")),
    ("[2025-10-16 09:06:22 TP5] KV Cache is allocated. #tokens: 2795207, K size: 53.31 GB, V size: 53.31 GB",
     ("allocating KV cache", None, "SGLang")),
    ("[2026-06-08 07:20:54 TP1] Capture cuda graph begin. This can take up to several minutes. avail mem=12.07 GB",
     ("capturing CUDA graphs", None, "SGLang")),
    ("Capturing batches (bs=216 avail_mem=10.30 GB):  40%|████      | 21/52 [00:03<00:04,  7.40it/s]",
     ("capturing CUDA graphs", 21 / 52, "SGLang")),
    ("Capturing batches (avail_mem=9.72 GB): 100%|█████████████| 23/23 [00:08<00:00,  2.59it/s]",
     ("capturing CUDA graphs", 1.0, "SGLang")),
    ("[2025-11-10 19:59:09 TP1] Capture cuda graph end. Time elapsed: 11.35 s. mem usage=1.04 GB. avail mem=11.22 GB.",
     ("capturing CUDA graphs", 1.0, "SGLang")),
    ("[2025-06-19 15:12:27] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=21.96 GB, mem usage=8.81 GB.",
     ("loading weights", 1.0, "SGLang")),
    ("[2026-05-28 05:58:29] The server is fired up and ready to roll!", (READY, None, "SGLang")),
    # llama.cpp
    ("0.00.277.129 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
     ("loading weights", None, "llama.cpp")),
    # "offloaded 49/49 layers" is a count of layers placed, not progress.
    ("load_tensors: offloaded 49/49 layers to GPU", ("loading weights", None, "llama.cpp")),
    ("....................................................................................................",
     ("loading weights", 1.0, "llama.cpp")),
    ("llama_init_from_model: n_ctx         = 16384", ("creating context", None, "llama.cpp")),
    ("llama_kv_cache_init: kv_size = 16384, offload = 1, type_k = 'q4_0', type_v = 'f16', n_layer = 61, can_shift = 0",
     ("allocating KV cache", None, "llama.cpp")),
    (("llama-server    | [41123] 0.09.427.007 W common_init_from_params: warming up the model with an empty run - please "
     "wait ... (--no-warmup to disable)"), ("warming up", None, "llama.cpp")),
    # Newer llama-server binds its port first too ("HTTP server is listening" and then "loading model").
    ("main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 11",
     ("starting server", None, "llama.cpp")),
    ("INFO [              slots_idle] all slots are idle | tid=\"123553311559680\" timestamp=1786632156",
     (READY, None, "llama.cpp")),
])
def test_single_real_lines(line, expected):
    stage = match(line)
    assert stage is not None and (stage.name, stage.fraction, stage.engine) == expected


@pytest.mark.parametrize("line", [
    "", "\r", "(EngineCore pid=1992345) ", "INFO:     127.0.0.1:5000 - \"GET /health HTTP/1.1\" 200 OK",
    "WARNING 05-06 21:00:09 [op.py:241] Priority not set for op rms_norm, using native implementation.",
    "[2025-03-08 12:29:13 TP2] Init torch distributed ends. mem usage=0.13 GB",
    "print_info: n_ctx_train           = 131072",
    # A bare tqdm bar means nothing outside a stage that counts with one.
    "100%|██████████| 13/13 [00:07<00:00,  1.80it/s]",
])
def test_lines_that_say_no_stage(line):
    assert match(line) is None
    assert StartupReader().feed(line) is None


def test_a_fraction_never_goes_back_and_a_repeat_is_no_move():
    reader = StartupReader()
    assert reader.feed("Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:49<00:24, 24.59s/it]")
    assert reader.feed("Loading safetensors checkpoint shards:  33% Completed | 1/3 [00:24<00:49, 24.61s/it]") is None
    assert reader.feed("Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:49<00:24, 24.59s/it]") is None
    assert reader.stage is not None and reader.stage.fraction == 2 / 3
    # A line without a count keeps the count the stage had.
    assert reader.feed("(EngineCore pid=1) INFO 08-26 22:26:02 [default_loader.py:384] Loading weights took 51.88 seconds")
    assert reader.feed("(EngineCore pid=1) INFO 08-26 22:25:09 Starting to load model Qwen/Qwen3-8B...") is None
    assert reader.stage.fraction == 1.0


def test_an_earlier_stage_comes_back_only_when_it_counts_anew():
    reader = StartupReader()
    reader.feed("[2025-03-08 12:29:13 TP0] Load weight begin. avail mem=21.63 GB")
    reader.feed("[2025-03-27 21:33:31 TP0] KV Cache is allocated. #tokens: 834615, K size: 54.12 GB, V size: 54.12 GB")
    # Another rank's late "Load weight end" is no move back to loading weights...
    assert reader.feed("[2025-03-08 12:29:21 TP3] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
                       "avail mem=6.09 GB, mem usage=15.54 GB.") is None
    assert reader.stage is not None and reader.stage.name == "allocating KV cache"
    # ...but a shard bar counting from 0 again is (a second worker loads its weights).
    again = reader.feed("Loading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]")
    assert again is not None and (again.name, again.fraction, again.engine) == ("loading weights", 0.0, "SGLang")
    assert reader.stages_seen == ("loading weights", "allocating KV cache")


def test_a_bare_bar_continues_sglangs_capture():
    # SGLang early 2025 drew its capture bar with no label: it only means something inside the capture.
    reader = StartupReader()
    reader.feed("[2025-03-08 12:29:21 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=1.45 GB")
    moved = reader.feed("100%|████████████████████████████████████████| 13/13 [00:07<00:00,  1.80it/s]")
    assert moved is not None and (moved.name, moved.fraction, moved.engine) == ("capturing CUDA graphs", 1.0, "SGLang")


def test_the_engine_already_seen_claims_the_words_engines_share():
    # Shard bars and uvicorn's lines are the same in vLLM and SGLang: the engine seen so far wins.
    sglang = StartupReader()
    sglang.feed("[2025-03-08 12:29:13 TP0] Load weight begin. avail mem=21.63 GB")
    shard = sglang.feed("Loading safetensors checkpoint shards:   7% Completed | 1/14 [00:00<00:04,  2.93it/s]")
    assert shard is not None and shard.engine == "SGLang"
    sglang.feed("[2025-03-08 12:29:28 TP0] Capture cuda graph end. Time elapsed: 7.23 s. avail mem=0.53 GB. mem usage=0.93 GB.")
    up = sglang.feed("[2025-03-08 12:29:29] INFO:     Application startup complete.")
    assert up is not None and (up.name, up.engine) == ("warming up", "SGLang")  # SGLang then warms itself up
    vllm = StartupReader()
    vllm.feed("Loading safetensors checkpoint shards:   7% Completed | 1/14 [00:00<00:04,  2.93it/s]")
    up = vllm.feed("INFO:     Application startup complete.")
    assert up is not None and (up.name, up.engine) == (READY, "vLLM")
    # SGLang's default shard bar is vLLM's too (with its multi-thread loader): vLLM's once vLLM spoke.
    threaded = "Multi-thread loading shards:  50% Completed | 2/4 [00:02<00:02,  1.30s/it]"
    assert match(threaded).engine == "SGLang"
    vllm = StartupReader()
    vllm.feed("(EngineCore pid=1100) INFO 12-07 10:00:10 [model_runner.py:412] Loading model from scratch...")
    shard = vllm.feed(threaded)
    assert shard is not None and (shard.name, shard.fraction, shard.engine) == ("loading weights", 0.5, "vLLM")


def test_ready_is_the_end():
    reader = StartupReader()
    assert reader.feed("[2025-03-08 12:29:33] The server is fired up and ready to roll!")
    # Requests the server serves afterwards do not start it again.
    assert reader.feed("Loading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]") is None
    assert reader.stage is not None and reader.stage.name == READY and reader.stages_seen == (READY,)


def test_clean_takes_the_last_redraw_without_colours():
    assert clean("a\rb\r") == "b" and clean("a\r\x1b[K\r") == "a"
    assert clean("\x1b[32mgreen\x1b[0m\n") == "green"
