"""Hostile, truncated and merely odd GGUF files (issue 38): each is a `ModelFactsError` naming the
file, read within the memory its own bytes pay for; absent keys take llama.cpp's defaults; and a
router whose models point at such files answers its listings (Ollama's and its own) with 200.

The files are raw bytes where the point is a header no writer would produce (2^40 tensors, a
string longer than the file, arrays 2,000 deep), and `gguf.GGUFWriter`'s own output otherwise.
"""

from __future__ import annotations

import random
import struct
import sys
import tracemalloc
from pathlib import Path

import aiohttp
import gguf
import pytest
from gguf.constants import MODEL_ARCH

from ggufs import N_VOCAB, K, _attention, _base_hparams, _embeddings, _ffn, build_llama, write_gguf
from swaplab.memory.estimate import LoadSettings, estimate
from swaplab.memory.facts import ModelFactsError, read_gguf

T = gguf.GGUFValueType
MAX_PEAK = 1 << 20
"""What reading a header of a few hundred bytes may allocate (before the fix: 67 MB for a 64 MiB key,
8 MB for a million layers, 1.6 GB for 200 million)."""


def text(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def key(name: str, kind: int, payload: bytes) -> bytes:
    return text(name.encode()) + struct.pack("<I", kind) + payload


def header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


ARCH = key("general.architecture", T.STRING, text(b"llama"))
# Enough for facts: without it a reader could refuse a bad tensor table for the wrong reason.
LLAMA = (ARCH + key("llama.block_count", T.UINT32, u32(1)) + key("llama.embedding_length", T.UINT32, u32(64))
         + key("llama.vocab_size", T.UINT32, u32(64)) + key("llama.attention.head_count", T.UINT32, u32(4))
         + key("llama.attention.head_count_kv", T.UINT32, u32(4)))
ONE_TENSOR = text(b"t") + u32(1) + struct.pack("<q", 32) + u32(0) + struct.pack("<Q", 0)  # F32 [32] at 0

HOSTILE = {
    "2^40 tensors": (header(1 << 40, 0) + bytes(176), "1099511627776 tensors declared"),
    "2^24 tensors in 200 bytes": (header(1 << 24, 0) + bytes(176), "16777216 tensors at byte 24 need"),
    "a 64 MiB key in a 132-byte file": (header(0, 1) + struct.pack("<Q", 1 << 26) + b"x" * 100,
                                        "a key at byte 32 needs 67108864 bytes"),
    "a 2^40-byte string value": (header(0, 1) + text(b"k") + u32(T.STRING) + struct.pack("<Q", 1 << 40) + bytes(150),
                                 "k at byte 45 needs 1099511627776 bytes"),
    "an array of 2^24 strings in 100 bytes": (
        header(0, 1) + key("tokenizer.ggml.tokens", T.ARRAY, u32(T.STRING) + struct.pack("<Q", 1 << 24)) + bytes(100),
        "16777216 strings in tokenizer.ggml.tokens"),
    "arrays 2,000 deep": (header(0, 1) + text(b"k") + u32(T.ARRAY) + (u32(T.ARRAY) + struct.pack("<Q", 1)) * 2000,
                          "k is an array of arrays"),
    "a value type GGUF does not have": (header(0, 1) + key("k", 99, bytes(8)), "k has value type 99"),
    "a tensor of 5 dimensions": (header(1, 6) + LLAMA + text(b"t") + u32(5) + struct.pack("<5q", 1, 1, 1, 1, 1)
                                 + u32(0) + bytes(8), "tensor t has 5 dimensions"),
    "a negative dimension": (header(1, 6) + LLAMA + text(b"t") + u32(1) + struct.pack("<q", -1) + u32(0) + bytes(8),
                             "tensor t has a negative dimension"),
    "a ggml type ggml does not have": (header(1, 6) + LLAMA + text(b"t") + u32(1) + struct.pack("<q", 32) + u32(999)
                                       + bytes(8), "tensor t has ggml type 999"),
    "a tensor name of 64 bytes": (header(1, 6) + LLAMA + text(b"n" * 64) + u32(1) + struct.pack("<q", 32) + u32(0)
                                  + bytes(8), "a tensor name of 64 bytes"),
    "alignment 0": (header(1, 7) + LLAMA + key("general.alignment", T.UINT32, u32(0)) + ONE_TENSOR,
                    "general.alignment is 0, not a power of two"),
    "alignment as a string": (header(1, 7) + LLAMA + key("general.alignment", T.STRING, text(b"x")) + ONE_TENSOR,
                              "general.alignment is 'x', not a power of two"),
    "a million layers": (header(0, 4) + ARCH + key("llama.block_count", T.UINT32, u32(1_000_000))
                         + key("llama.embedding_length", T.UINT32, u32(64)) + key("llama.vocab_size", T.UINT32, u32(64)),
                         "llama.block_count is 1000000; llama.cpp loads 1 to 512 layers"),
    "block_count as a string": (header(0, 2) + ARCH + key("llama.block_count", T.STRING, text(b"lots")),
                                "llama.block_count is 'lots', not a whole number"),
    "a truncated header": (header(0, 2) + ARCH + text(b"llama.block_count")[:10], "the header ends early"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_hostile_header_is_refused_naming_the_file_within_its_own_bytes(tmp_path, case):
    data, expected = HOSTILE[case]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(ModelFactsError) as refused:
            read_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value).startswith(f"{path}: ") and expected in str(refused.value)
    assert peak < MAX_PEAK, f"{peak} bytes allocated reading {len(data)}"


def header_of(path: Path) -> bytes:
    """A GGUF file up to its tensor data (what `read_gguf` reads)."""
    facts = read_gguf(path)
    return path.read_bytes()[: min(tensor.offset for tensor in facts.tensors)]


def test_every_cut_and_thousands_of_corruptions_of_a_real_header_are_facts_or_a_model_facts_error(tmp_path):
    real = header_of(build_llama(tmp_path / "llama.gguf"))
    path = tmp_path / "mutated.gguf"
    variants = [real[:cut] for cut in range(0, len(real), max(1, len(real) // 400))]
    chance = random.Random(38)
    for _ in range(2000):  # a byte, a count or a length somewhere set to anything
        at = chance.randrange(len(real))
        width = chance.choice((1, 4, 8))
        variants.append(real[:at] + chance.randbytes(width) + real[at + width:])
    outcomes: dict[str, int] = {}
    for variant in variants:
        path.write_bytes(variant)
        try:
            read_gguf(path)
            outcome = "read"
        except ModelFactsError as error:
            assert str(error).startswith(f"{path}: ")
            outcome = "refused"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes["refused"] > 400 and outcomes.get("read", 0) > 0, outcomes


def odd_llama(path: Path, changes: dict[str, int | None]) -> Path:
    """build_llama's model (4 layers, n_embd 256, 8 heads of 32) with some metadata changed (None: left out)."""
    hparams = {**_base_hparams(4, 256, 256, 8, 2), K.Rope.DIMENSION_COUNT: 32, **changes}
    tensors = _embeddings(256, N_VOCAB, tied=True)
    for layer in range(4):
        tensors += _attention(layer, 256, 8, 2, 32, 32) + _ffn(layer, 256, 256)
    return write_gguf(path, MODEL_ARCH.LLAMA, {name: value for name, value in hparams.items() if value is not None}, tensors)


def test_a_real_file_without_head_count_kv_has_as_many_kv_heads_as_heads_as_in_llama_cpp(tmp_path):
    # llama-model.cpp load_hparams: "n_head_kv is optional, default to n_head".
    path = odd_llama(tmp_path / "no-kv.gguf", {K.Attention.HEAD_COUNT_KV: None})
    facts = read_gguf(path)
    assert facts.n_head == facts.n_head_kv == (8,) * 4
    assert facts.head_dim_k == facts.head_dim_v == 256 // 8  # n_embd / the first layer's head count
    with_kv = read_gguf(odd_llama(tmp_path / "kv-8.gguf", {K.Attention.HEAD_COUNT_KV: 8}))
    settings = LoadSettings(ctx=4096)
    assert estimate(facts, settings).kv_bytes_per_token == estimate(with_kv, settings).kv_bytes_per_token


def gguf_with(path: Path, add) -> Path:
    """A llama GGUF from gguf's own writer, `add(writer)` adding the odd keys after the usual ones."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_vocab_size(100)
    add(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


WRONG = {
    "block_count a string": (lambda w: w.add_string("llama.block_count", "4"), "llama.block_count is '4', not a whole number"),
    "head_count_kv a float": (lambda w: (w.add_block_count(4), w.add_float32("llama.attention.head_count_kv", 2.0)),
                              "llama.attention.head_count_kv is 2.0, not a whole number"),
    "a negative width": (lambda w: (w.add_block_count(4), w.add_int32("llama.feed_forward_length", -1)),
                         "llama.feed_forward_length is -1, not a whole number"),
    "a per-layer array too short": (lambda w: (w.add_block_count(4), w.add_array("llama.attention.head_count", [4, 4])),
                                    "llama.attention.head_count has 2 entries for 4 layers"),
    "per-layer strings": (lambda w: (w.add_block_count(4), w.add_array("llama.expert_used_count", ["two"] * 4)),
                          "llama.expert_used_count is 'two', not a whole number"),
    "more experts than llama.cpp loads": (lambda w: (w.add_block_count(4), w.add_uint32("llama.expert_count", 5000)),
                                          "llama.expert_count is 5000; llama.cpp loads at most 1024"),
    "an array of arrays": (lambda w: (w.add_block_count(4), w.add_array("general.nested", [[1, 2], [3]])),
                           "general.nested is an array of arrays"),
    "alignment a string": (lambda w: (w.add_block_count(4), w.add_string("general.alignment", "32")),
                           "general.alignment is '32', not a power of two"),
}


@pytest.mark.parametrize("case", WRONG, ids=list(WRONG))
def test_a_key_of_the_wrong_type_is_refused_naming_the_file_and_the_key(tmp_path, case):
    add, expected = WRONG[case]
    path = gguf_with(tmp_path / "typed.gguf", add)
    with pytest.raises(ModelFactsError, match=f"^{path}: .*") as refused:
        read_gguf(path)
    assert expected in str(refused.value)


# -- The router ---------------------------------------------------------------------------

async def test_a_router_whose_models_point_at_hostile_and_odd_files_answers_every_listing(router_factory, tmp_path):
    hostile = tmp_path / "hostile.gguf"
    hostile.write_bytes(HOSTILE["arrays 2,000 deep"][0])
    odd = odd_llama(tmp_path / "no-kv.gguf", {K.Attention.HEAD_COUNT_KV: None})
    wrapper = f"{sys.executable} -m swaplab.builtin.llamacpp"
    router = router_factory(f"""
devices:
  0: {{name: test GPU, vramGiB: 16}}
models:
  hostile:
    cmd: {wrapper} -m {hostile} --port ${{PORT}}
  odd:
    cmd: {wrapper} -m {odd} --port ${{PORT}}
""")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{router.url}/api/tags") as answer:
            assert answer.status == 200, await answer.text()
            tags = {model["name"]: model for model in (await answer.json())["models"]}
        assert tags["hostile:latest"]["details"]["format"] == "" and tags["hostile:latest"]["size"] == hostile.stat().st_size
        assert tags["odd:latest"]["details"]["family"] == "llama"
        shown = {}
        for name in ("hostile", "odd"):
            async with session.post(f"{router.url}/api/show", json={"model": name}) as answer:
                assert answer.status == 200, await answer.text()
                shown[name] = await answer.json()
        assert shown["hostile"]["model_info"] == {}
        assert "llama.attention.head_count_kv" not in shown["odd"]["model_info"]
        assert shown["odd"]["model_info"]["llama.attention.head_count"] == 8
        for path in ("/running", "/api/models", "/v1/models", "/api/ps"):
            async with session.get(f"{router.url}{path}") as answer:
                assert answer.status == 200, (path, await answer.text())
                assert "hostile" in await answer.text() or path in ("/running", "/api/ps")
    log = router.output()
    assert "models.odd: no memory estimate" not in log  # head_count_kv defaults to the head count: an estimate
    assert f"no GGUF details for {hostile}: {hostile}: k is an array of arrays" in log  # why /api/show has none
    assert f"models.hostile: no memory estimate, its devices are claimed whole: {hostile}: k is an array" in log
