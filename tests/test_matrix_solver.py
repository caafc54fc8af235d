"""The matrix solver and the placement built on it, as tables: no processes, no sleeps.

Every expectation llama-swap's own tests hold its solver to (internal/config/matrix_test.go,
internal/matrix/dsl_test.go, internal/router/matrix_test.go at 0bdb3720), then how the
placement decision applies it: busy models waited for, stopping ones free, devices refining.
"""

from __future__ import annotations

import pytest

from swaplab.config.matrix import matrix_from_data
from swaplab.config.model import Config, DeviceConfig, GroupConfig, ModelConfig
from swaplab.fleet.matrix import MatrixDecision, solve
from swaplab.fleet.placement import Placement, Resident, place


def matrix(sets: dict[str, str], models: str, vars: dict[str, str] | None = None, costs: dict[str, int] | None = None):
    return matrix_from_data({"vars": vars or {}, "evict_costs": costs or {}, "sets": sets}, models.split())


BASIC = matrix(
    {"standard": "(g | q | m) & v", "full": "L"}, "gemma qwen mistral voxtral llama70B",
    vars={"g": "gemma", "q": "qwen", "m": "mistral", "v": "voxtral", "L": "llama70B"}, costs={"L": 30, "v": 50},
)
WITH_REF = matrix(
    {"llms": "g | q | m", "with_tts": "+llms & v", "mega": "+with_tts & e"}, "gemma qwen mistral voxtral reranker",
    vars={"g": "gemma", "q": "qwen", "m": "mistral", "v": "voxtral", "e": "reranker"},
)
MODELS3 = "gemma qwen voxtral"


def product(dimensions: int, choices: int):
    groups = " & ".join("(" + " | ".join(f"model-{d}-{c}" for c in range(choices)) + ")" for d in range(dimensions))
    models = "target " + " ".join(f"model-{d}-{c}" for d in range(dimensions) for c in range(choices))
    return matrix({"large": f"target & {groups}"}, models)


WIDE = [f"model-{i}" for i in range(70)]

# (matrix, target, running, evict, set name, target set)
CASES = [
    # config/matrix_test.go
    (BASIC, "gemma", ["voxtral"], [], "standard", ["gemma", "voxtral"]),
    (BASIC, "llama70B", ["voxtral"], ["voxtral"], "full", ["llama70B"]),
    (WITH_REF, "reranker", ["gemma", "voxtral"], [], "mega", ["gemma", "reranker", "voxtral"]),
    (matrix({"combo": "gemma & voxtral"}, MODELS3), "gemma", ["voxtral"], [], "combo", ["gemma", "voxtral"]),
    (matrix({"base": "g | qwen", "combo": "+base & voxtral"}, MODELS3, vars={"g": "gemma"}),
     "qwen", ["voxtral"], [], "combo", ["qwen", "voxtral"]),
    (matrix({"combo": "g & gemma"}, MODELS3, vars={"g": "gemma"}), "gemma", [], [], "combo", ["gemma"]),
    (matrix({"combo": "qwen"}, MODELS3, vars={"qwen": "gemma"}), "gemma", [], [], "combo", ["gemma"]),
    # matrix/dsl_test.go
    (matrix({"base": "a & b", "extended": "target & +base & b"}, "target a b"),
     "target", ["a", "b"], [], "extended", ["a", "b", "target"]),
    (matrix({"preferred": "target & (a | (a & b))"}, "target a b"),
     "target", ["a", "b"], [], "preferred", ["a", "b", "target"]),
    (matrix({"known": "a & b"}, "a b"), "missing", ["a", "b"], ["a", "b"], "", ["missing"]),
    # router/matrix_test.go
    (matrix({"s_a": "a", "s_b": "b"}, "a b"), "b", ["a"], ["a"], "s_b", ["b"]),
    (matrix({"s_ab": "a & b"}, "a b"), "b", ["a"], [], "s_ab", ["a", "b"]),
    (matrix({"first": "a & b", "second": "a & c"}, "a b c"), "a", [], [], "first", ["a", "b"]),
    (matrix({"a_with_c": "a & c", "a_with_b": "a & b"}, "a b c", costs={"b": 10, "c": 1}),
     "a", ["b", "c"], ["c"], "a_with_b", ["a", "b"]),
    # and further
    (matrix({"a_with_c": "a & c", "a_with_b": "a & b"}, "a b c"), "a", ["b", "c"], ["b"], "a_with_c", ["a", "c"]),
    (matrix({"pairs": "(a | b) & (c | d)"}, "a b c d"), "a", ["b", "d"], ["b"], "pairs", ["a", "d"]),
    (matrix({"pairs": "(a | b) & (c | d)"}, "a b c d"), "a", ["c", "d"], ["d"], "pairs", ["a", "c"]),  # earlier projection
    (matrix({"pairs": "(a | b) & (c | d)"}, "a b c d", costs={"c": 2}), "a", ["c", "d"], ["d"], "pairs", ["a", "c"]),
    (matrix({"pairs": "(a | b) & (c | d)"}, "a b c d", costs={"d": 2}), "a", ["c", "d"], ["c"], "pairs", ["a", "d"]),
    (matrix({"solo": "a", "any": "b | c"}, "a b c"), "a", ["b"], ["b"], "solo", ["a"]),
    (matrix({"costly": "a & b", "cheap": "a & c"}, "a b c", costs={"b": 3, "c": 2}),  # 2 < 3: strictly lowest
     "a", ["b", "c"], ["c"], "costly", ["a", "b"]),
]


@pytest.mark.parametrize("m, target, running, evict, set_name, target_set", CASES)
def test_solve(m, target, running, evict, set_name, target_set):
    assert solve(m, target, running, m.evict_costs) == MatrixDecision(tuple(evict), set_name, tuple(target_set))


def test_a_running_target_evicts_nothing_whatever_else_runs():
    m = matrix({"s_a": "a", "s_b": "b", "s_ab": "a & b"}, "a b c")
    assert solve(m, "a", ["a", "b"], {}) == MatrixDecision((), "s_ab", ("a", "b"))
    assert solve(m, "a", ["a", "c"], {}) == MatrixDecision((), "", ("a", "c"))  # c is in no set: still nothing


def test_no_expansion_limit():
    running = [f"model-{d}-9" for d in range(6)] + ["outside"]
    decision = solve(product(6, 10), "target", running, {})
    assert decision.evict == ("outside",) and decision.set_name == "large"
    assert len(decision.target_set) == 7


def test_more_than_64_relevant_models():
    m = matrix({"wide": " & ".join(["target", *WIDE])}, " ".join(["target", *WIDE, "outside"]))
    decision = solve(m, "target", [*WIDE, "outside"], {})
    assert decision.evict == ("outside",)
    assert len(decision.target_set) == 71


# -- placement under the matrix ----------------------------------------------------------------


def model(model_id: str, devices: tuple[int, ...] = (), vram: dict[int, float] | None = None) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("x",), cmd_stop=None, proxy="http://x", check_endpoint="none",
                       devices=devices, vram_gib=vram or {})


def config(m, models: str, devices: dict[int, float] | None = None, claims: dict[str, tuple] | None = None,
           groups: tuple[GroupConfig, ...] = ()) -> Config:
    claims = claims or {}
    return Config(
        path="<table>",
        models={name: model(name, *claims.get(name, ())) for name in models.split()},
        groups={g.id: g for g in groups},
        devices={d: DeviceConfig(id=d, vram_gib=gib) for d, gib in (devices or {}).items()},
        router="matrix",
        matrix=m,
    )


def idle(*models: str) -> list[Resident]:
    return [Resident(m, "ready", last_used=float(i)) for i, m in enumerate(models)]


RAG = matrix({"llms": "a & b", "rag": "(a | b) & e"}, "a b e", costs={"e": 10})


def test_the_matrix_keeps_the_costly_embedder_and_swaps_the_llms():
    cfg = config(RAG, "a b e")
    assert place(cfg, "b", idle("a", "e")) == Placement(
        "evict", evict=("a",), reason="matrix set 'rag' runs 'b' without 'a'")
    assert place(cfg, "e", idle("a")) == Placement("start")
    cheap = config(matrix({"llms": "a & b", "rag": "(a | b) & e"}, "a b e"), "a b e")
    assert place(cheap, "b", idle("a", "e")).evict == ("e",)  # the tie goes to the earlier set


def test_a_busy_or_starting_model_the_matrix_evicts_is_waited_for():
    cfg = config(RAG, "a b e")
    residents = [Resident("a", "ready", busy=True), Resident("e", "ready")]
    assert place(cfg, "b", residents) == Placement(
        "wait", blocking=("a",), reason="model 'b' waits for 'a' (busy) before it can start")
    assert place(cfg, "b", [Resident("a", "starting"), Resident("e", "ready")]).action == "wait"


def test_models_a_set_allows_start_beside_a_starting_one():
    cfg = config(matrix({"s_ab": "a & b"}, "a b"), "a b")
    assert place(cfg, "b", [Resident("a", "starting")]) == Placement("start")


def test_a_model_already_stopping_costs_nothing():
    # Keeping the stopping a would cost b (an idle, ready model): it goes anyway, so wait for it.
    cfg = config(matrix({"with_a": "t & a", "with_b": "t & b"}, "t a b"), "t a b")
    assert place(cfg, "t", [Resident("a", "stopping"), Resident("b", "ready")]).blocking == ("a",)
    assert place(cfg, "t", idle("a", "b")).evict == ("b",)  # not stopping: the earlier set wins


def test_a_target_in_no_set_runs_alone():
    cfg = config(matrix({"pair": "a & b"}, "a b c"), "a b c")
    assert place(cfg, "c", idle("a", "b")) == Placement(
        "evict", evict=("a", "b"), reason="'c' is in no matrix set, so it runs alone")


def test_groups_mean_nothing_under_the_matrix():
    persistent = GroupConfig("keep", swap=False, exclusive=True, persistent=True, members=("a",))
    cfg = config(matrix({"s_a": "a", "s_b": "b"}, "a b"), "a b", groups=(persistent,))
    assert place(cfg, "b", idle("a")).evict == ("a",)


# With devices the matrix decides first; the claims may stop more, cheapest first, or refuse.
TWO_GPUS = {0: 16.0, 1: 16.0}


def test_devices_stop_more_than_the_matrix_cheapest_first():
    m = matrix({"all": "t & x & y & z"}, "t x y z", costs={"x": 5, "y": 2})
    claims = {"t": ((0,), {0: 8}), "x": ((0,), {0: 8}), "y": ((0,), {0: 8}), "z": ((1,), {1: 8})}
    cfg = config(m, "t x y z", TWO_GPUS, claims)
    # The matrix lets all four run; device 0 has room for one of x and y beside t: y is cheaper.
    assert place(cfg, "t", idle("x", "y", "z")) == Placement(
        "evict", evict=("y",),
        reason="matrix set 'all' lets 't' run beside every model running; its device claims also need 'y' stopped")


def test_devices_never_keep_what_the_matrix_evicts():
    m = matrix({"s_t": "t", "s_x": "x"}, "t x")
    cfg = config(m, "t x", TWO_GPUS, {"t": ((0,), {0: 4}), "x": ((1,), {1: 4})})
    assert place(cfg, "t", idle("x")) == Placement("evict", evict=("x",), reason="matrix set 's_t' runs 't' without 'x'")


def test_devices_refuse_a_claim_that_can_never_be_met():
    cfg = config(matrix({"s": "t"}, "t"), "t", TWO_GPUS, {"t": ((0,), {0: 20})})
    assert place(cfg, "t", []) == Placement("refuse", reason="model 't' needs 20 GiB on device 0, which has 16 GiB")


def test_devices_refuse_what_nvml_says_does_not_fit():
    cfg = config(matrix({"s": "t & x"}, "t x"), "t x", TWO_GPUS, {"t": ((0,), {0: 8}), "x": ((1,), {1: 8})})
    refused = place(cfg, "t", idle("x"), free_gib={0: 3.0, 1: 8.0})
    assert refused.action == "refuse" and refused.short_devices == (0,)
