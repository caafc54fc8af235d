"""Reading a starting server's stage from its output: each engine's rules against real startup
logs (tests/fixtures/startup/, their origins in each file) and single real lines, prefixed,
coloured and redrawn as they come through a pipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from swaplab.fleet.progress import StartupReader, clean, match

FIXTURES = Path(__file__).parent / "fixtures" / "startup"


def replay(name: str) -> list[tuple[str, float | None, str]]:
    reader = StartupReader()
    moves = []
    for line in (FIXTURES / name).read_text().splitlines():
        if line.startswith("#"):
            continue
        stage = reader.feed(line)
        if stage is not None:
            moves.append((stage.name, stage.fraction, stage.engine))
    return moves


def order(moves) -> list[str]:
    names = [name for name, _, _ in moves]
    return [name for i, name in enumerate(names) if i == 0 or names[i - 1] != name]


@pytest.mark.parametrize(("log", "stages"), [
    ("vllm.log", ["loading weights", "compiling", "profiling memory", "allocating KV cache", "capturing CUDA graphs"]),
    ("sglang.log", ["loading weights", "allocating KV cache", "capturing CUDA graphs", "ready"]),
    ("llamacpp.log", ["reading metadata", "loading weights", "creating context", "allocating KV cache",
                      "reserving compute buffers", "warming up", "starting server", "ready"]),
])
def test_each_engines_startup_log_moves_through_its_stages_in_order(log, stages):
    moves = replay(log)
    assert order(moves) == stages
    for stage in set(stages):
        fractions = [f for name, f, _ in moves if name == stage and f is not None]
        assert fractions == sorted(fractions) and all(0 <= f <= 1 for f in fractions), stage


def test_the_fractions_are_the_engines_own_counts():
    vllm = replay("vllm.log")
    assert [f for name, f, _ in vllm if name == "loading weights"] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert [round(f, 3) for name, f, _ in vllm if name == "capturing CUDA graphs"][:2] == [round(23 / 67, 3), round(25 / 67, 3)]
    sglang = replay("sglang.log")
    assert [f for name, f, _ in sglang if name == "capturing CUDA graphs" and f is not None] == [0, 1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0]
    assert {engine for name, _, engine in vllm} == {"vLLM"} and "SGLang" in {engine for _, _, engine in sglang}


@pytest.mark.parametrize(("line", "expected"), [
    ("Loading safetensors checkpoint shards:  72% Completed | 78/109 [00:19<00:07,  4.18it/s]",
     ("loading weights", 78 / 109, "vLLM")),
    ("(Worker_TP0 pid=34322) INFO 05-06 20:59:57 [default_loader.py:384] Loading weights took 24.84 seconds",
     ("loading weights", 1.0, "vLLM")),
    ("\x1b[1;36m(EngineCore pid=1265223)\x1b[0;0m INFO 06-02 00:51:49 [backends.py:1148] Dynamo bytecode transform time: 8.52 s",
     ("compiling", None, "vLLM")),
    # tqdm's redraws arrive as one piece between newlines: the last is the one that counts.
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  34%|███▍      | 23/67 [00:02<00:04,  8.92it/s]\r"
     "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  36%|███▌      | 24/67 [00:02<00:04,  9.08it/s]",
     ("capturing CUDA graphs", 24 / 67, "vLLM")),
    ("[2025-10-16 09:06:22 TP5] KV Cache is allocated. #tokens: 2795207, K size: 53.31 GB, V size: 53.31 GB",
     ("allocating KV cache", None, "SGLang")),
    ("Capturing batches (bs=216 avail_mem=10.30 GB):  40%|████      | 21/52 [00:03<00:04,  7.40it/s]",
     ("capturing CUDA graphs", 21 / 52, "SGLang")),
    ("Capturing batches (avail_mem=9.72 GB): 100%|█████████████| 23/23 [00:08<00:00,  2.59it/s]",
     ("capturing CUDA graphs", 1.0, "SGLang")),
    ("[2025-11-10 19:59:09 TP1] Capture cuda graph end. Time elapsed: 11.35 s. mem usage=1.04 GB. avail mem=11.22 GB.",
     ("capturing CUDA graphs", 1.0, "SGLang")),
    ("0.00.277.129 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
     ("loading weights", None, "llama.cpp")),
    ("0.00.329.051 I cmn  common_init_: warming up the model with an empty run - please wait ... (--no-warmup to disable)",
     ("warming up", None, "llama.cpp")),
])
def test_single_real_lines(line, expected):
    stage = match(line)
    assert stage is not None and (stage.name, stage.fraction, stage.engine) == expected


@pytest.mark.parametrize("line", [
    "", "(EngineCore pid=1992345) ", "INFO:     127.0.0.1:5000 - \"GET /health HTTP/1.1\" 200 OK",
    "WARNING 05-06 21:00:09 [op.py:241] Priority not set for op rms_norm, using native implementation.",
])
def test_lines_that_say_no_stage(line):
    assert match(line) is None


def test_a_fraction_never_goes_back_and_a_repeat_is_no_move():
    reader = StartupReader()
    assert reader.feed("Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:49<00:24, 24.59s/it]")
    assert reader.feed("Loading safetensors checkpoint shards:  33% Completed | 1/3 [00:24<00:49, 24.61s/it]") is None
    assert reader.feed("Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:49<00:24, 24.59s/it]") is None
    assert reader.stage is not None and reader.stage.fraction == 2 / 3
    # A later stage, then an earlier one anew (a second worker loads its weights): both count.
    assert reader.feed("Capturing batches (bs=16 avail_mem=13.56 GB):  17%|█▋        | 1/6 [00:16<01:22, 16.57s/it]")
    assert reader.feed("Loading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]")
    assert reader.stages_seen == ("loading weights", "capturing CUDA graphs")
    assert clean("a\rb\r") == "b" and clean("\x1b[32mgreen\x1b[0m") == "green"
