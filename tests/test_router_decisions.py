"""The router's llama-swap features as pure functions, table-tested: capabilities, selectors, sjson paths,
filters, profile requests, multipart rewriting, llama-swap's error bodies, log times."""

from __future__ import annotations

import datetime
import json
import logging
import re

import pytest

from swaplab.config.model import Capabilities, Config, Filters, ModelConfig, PeerConfig, ProfileConfig, SelectorConfig
from swaplab.fleet import State
from swaplab.router.path.filters import rewrite
from swaplab.router.path.jsonpath import delete_path, set_path
from swaplab.router.api.listing import model_records, render_capabilities
from swaplab.router.watch.logformat import console_formatter, console_time, format_go_time, go_duration, layout_of
from swaplab.router.path.profiles import ActivationError, ProfileSwitch, listing, parse_activation, upstream_pin
from swaplab.router.door.responses import llama_swap_error
from swaplab.router.path.selectors import Candidate, NoTarget, Selectors, choose_spillover, choose_warm
from swaplab.router.path.targets import UnreadableBody, model_from_body, replace_form_field, replace_multipart_field


def model(model_id: str, **fields) -> ModelConfig:
    return ModelConfig(id=model_id, cmd=("x",), cmd_stop=None, proxy="http://127.0.0.1:1", check_endpoint="none", **fields)


# -- capabilities ------------------------------------------------------------------


@pytest.mark.parametrize("capabilities, expected", [
    (Capabilities(), {}),
    # llama-swap's own example (api.go): tools, text+image in, text out, 32000 context.
    (Capabilities(input=("text", "image"), output=("text",), tools=True, context=32000), {
        "architecture": {"input_modalities": ["text", "image"], "output_modalities": ["text"],
                         "modality": "text+image->text"},
        "capabilities": {"vision": True, "function_calling": True},
        "supported_parameters": ["tools", "tool_choice"],
        "context_length": 32000,
    }),
    (Capabilities(input=("audio",), output=("text",)), {
        "architecture": {"input_modalities": ["audio"], "output_modalities": ["text"], "modality": "audio->text"},
        "capabilities": {"audio_transcriptions": True},
    }),
    (Capabilities(input=("text",), output=("audio", "image")), {
        "architecture": {"input_modalities": ["text"], "output_modalities": ["audio", "image"],
                         "modality": "text->audio+image"},
        "capabilities": {"audio_speech": True, "image_generation": True},
    }),
    (Capabilities(input=("image",)), {"architecture": {"input_modalities": ["image"]}, "capabilities": {"vision": True}}),
    (Capabilities(output=("text",)), {"architecture": {"output_modalities": ["text"]}}),  # no true flag: no map
    (Capabilities(input=("image",), output=("image",)), {
        "architecture": {"input_modalities": ["image"], "output_modalities": ["image"], "modality": "image->image"},
        "capabilities": {"vision": True, "image_to_image": True},
    }),
    (Capabilities(reranker=True), {"capabilities": {"reranker": True}}),
    (Capabilities(context=4096), {"context_length": 4096}),
])
def test_capabilities_render_as_llama_swap_renders_them(capabilities, expected):
    assert render_capabilities(capabilities) == expected


def test_model_records_carry_meta_llamaswap_and_drop_capped_metadata():
    config = Config(path="x", include_aliases_in_list=True, models={
        "m": model("m", aliases=("m-alias",), metadata={"temperature": 0.7, "context_length": 1, "type": "mine"},
                   capabilities=Capabilities(tools=True, context=8192)),
        "plain": model("plain", metadata={"context_length": 5}),
    })
    records = {r["id"]: r for r in model_records(config, lambda _: State.STOPPED, 100, None)}
    assert records["m"]["meta"] == {
        "llamaswap": {"temperature": 0.7, "type": "model", "aliases": ["m-alias"]}, "n_ctx": 8192,
    }
    assert records["m"]["context_length"] == 8192 and records["m"]["capabilities"] == {"function_calling": True}
    assert records["m-alias"]["meta"]["llamaswap"] == {"temperature": 0.7, "type": "alias", "modelID": "m"}
    assert records["m-alias"]["alias_of"] == "m" and records["m-alias"]["context_length"] == 8192
    # Without capabilities the metadata is kept whole.
    assert records["plain"]["meta"] == {"llamaswap": {"context_length": 5, "type": "model"}}


def test_selectors_and_active_pins_are_listed_as_llama_swap_lists_them():
    config = Config(
        path="x",
        models={"a": model("a", aliases=("a2",)), "b": model("b")},
        peers={"p": PeerConfig(id="p", proxy="http://127.0.0.1:2", models=("remote",))},
        selectors={
            "fast": SelectorConfig(id="fast", strategy="warm", targets=("a", "b"), name="Fast"),
            "spill": SelectorConfig(id="spill", strategy="spillover", targets=("b", "a"), spillover=2),
            "pinned": SelectorConfig(id="pinned", strategy="pin", targets=("a", "b")),
            "hidden": SelectorConfig(id="hidden", strategy="pin", targets=("a",), unlisted=True),
        },
    )
    states = {"b": State.READY}
    pins = {"gpt": "a", "a2": "b", "remote": "a", "off": "", "hidden": "a", "new": "fast"}
    records = {r["id"]: r for r in model_records(config, lambda m: states.get(m, State.STOPPED), 1, pins)}
    assert records["fast"]["status"] == {"value": "loaded", "state": "ready"} and records["fast"]["name"] == "Fast"
    assert records["fast"]["meta"]["llamaswap"] == {"type": "selector", "strategy": "warm", "targets": ["a", "b"]}
    assert records["spill"]["meta"]["llamaswap"]["spillover"] == 2
    assert records["pinned"]["status"] == {"value": "unloaded", "state": "stopped"}  # pin: its first target only
    # Pins whose name routes already (an alias, a peer's bare name, a selector), disabled pins: not listed.
    assert {r for r in records if records[r].get("meta", {}).get("llamaswap", {}).get("type") == "profile"} == {
        "gpt", "new",
    }
    assert "hidden" not in records


# -- selectors -----------------------------------------------------------------------


def candidates(*specs: tuple[str, State | None]) -> list[Candidate]:
    return [Candidate(target, target, state) for target, state in specs]


def test_warm_prefers_ready_then_starting_then_the_first():
    assert choose_warm(candidates(("a", State.STOPPED), ("b", State.STARTING), ("c", State.READY))) == "c"
    assert choose_warm(candidates(("a", State.STOPPED), ("b", State.STARTING), ("c", State.STARTING))) == "b"
    assert choose_warm(candidates(("a", State.STOPPING), ("b", State.STOPPED), ("c", None))) == "a"


def test_warm_prefers_a_waking_then_a_sleeping_target_to_a_cold_start():
    assert choose_warm(candidates(("a", State.STOPPED), ("b", State.SLEEPING), ("c", State.WAKING))) == "c"
    assert choose_warm(candidates(("a", State.STOPPED), ("b", State.SLEEPING))) == "b"
    assert choose_warm(candidates(("a", State.FALLING_ASLEEP), ("b", State.SLEEPING), ("c", State.READY))) == "c"


def test_spillover_wakes_a_sleeper_before_starting_a_stopped_target():
    assert run_spillover([("a", State.READY), ("b", State.STOPPED), ("c", State.SLEEPING)], 1, 2) == ["a", "c"]
    assert run_spillover([("a", State.FALLING_ASLEEP), ("b", State.STOPPED)], 1, 1) == ["b"]
    assert run_spillover([("a", State.WAKING), ("b", State.STOPPED)], 2, 2) == ["a", "a"]


def run_spillover(specs, spillover: int, requests: int, reserved: dict[str, int] | None = None) -> list[str]:
    """Requests in a row, none released: the targets chosen (llama-swap's selector_test.go sequences)."""
    reserved = dict(reserved or {})
    chosen, turn = [], 0
    for _ in range(requests):
        decision = choose_spillover(candidates(*specs), reserved, spillover, turn)
        assert decision is not None
        target, took_turn = decision
        turn += took_turn
        reserved[target.key] = reserved.get(target.key, 0) + 1
        chosen.append(target.target)
    return chosen


def test_spillover_fills_a_running_target_before_waking_the_next():
    stopped = [("a", State.STOPPED), ("b", State.STOPPED), ("c", State.STOPPED)]
    assert run_spillover(stopped, 2, 3) == ["a", "a", "b"]
    # One a released, all three ready: the least reserved (c, none) takes it.
    ready = [("a", State.READY), ("b", State.READY), ("c", State.READY)]
    assert run_spillover(ready, 2, 1, {"a": 1, "b": 1}) == ["c"]
    # Peers' models: active only while they hold reservations.
    assert run_spillover([("remote/a", None), ("remote/b", None)], 1, 2) == ["remote/a", "remote/b"]
    assert run_spillover([("remote/a", None), ("remote/b", None)], 1, 1) == ["remote/a"]


def test_spillover_round_robins_ties_and_overflows_when_all_are_full():
    ready = [("a", State.READY), ("b", State.READY)]
    assert run_spillover(ready, 1, 4) == ["a", "b", "a", "b"]
    # A stopping model is neither active nor cold.
    assert choose_spillover(candidates(("a", State.STOPPING)), {}, 1, 0) is None
    assert run_spillover([("a", State.STOPPING), ("b", State.STOPPED)], 1, 2) == ["b", "b"]


def test_selectors_reserve_and_release():
    config = Config(path="x", models={"a": model("a"), "b": model("b", aliases=("b-alias",))}, selectors={
        "s": SelectorConfig(id="s", strategy="spillover", targets=("a", "b-alias")),
        "gone": SelectorConfig(id="gone", strategy="spillover", targets=("a",)),
        "p": SelectorConfig(id="p", strategy="pin", targets=("b", "a")),
    })
    selectors = Selectors(config)
    states = {"a": State.STOPPED, "b": State.STOPPED}
    first = selectors.choose(config.selectors["s"], states.__getitem__)
    second = selectors.choose(config.selectors["s"], states.__getitem__)
    assert (first.target, second.target) == ("a", "b-alias")
    first.release()
    first.release()  # once only
    assert selectors.choose(config.selectors["s"], states.__getitem__).target == "a"
    assert selectors.choose(config.selectors["p"], states.__getitem__).target == "b"
    states["a"] = State.STOPPING
    with pytest.raises(NoTarget, match='selector "gone" has no available spillover targets'):
        selectors.choose(config.selectors["gone"], states.__getitem__)


def test_an_ignored_websocket_holds_no_spillover_reservation():
    """llama-swap's IgnoredWebsocketDoesNotReserveSpillover, as the decision: a, b, c ready, the first socket open."""
    models = {"a": model("a", ignore_websockets=True), "b": model("b"), "c": model("c")}
    config = Config(path="x", models=models, selectors={
        "s": SelectorConfig(id="s", strategy="spillover", targets=("a", "b", "c")),
    })
    ready = {"a": State.READY, "b": State.READY, "c": State.READY}.__getitem__
    for websocket, second in ((True, "b"), (False, "c")):  # a websocket to b or c would hold its reservation
        selectors = Selectors(config)
        first = selectors.choose(config.selectors["s"], ready, websocket=websocket)
        assert (first.target, selectors.choose(config.selectors["s"], ready, websocket=websocket).target) == ("a", second)
    assert first.release is not None  # an ordinary request to a holds one


# -- sjson paths and filters ----------------------------------------------------------


@pytest.mark.parametrize("document, path, value, expected", [
    ({"a": 1}, "b", 2, {"a": 1, "b": 2}),
    ({}, "chat_template_kwargs.enable_thinking", False, {"chat_template_kwargs": {"enable_thinking": False}}),
    ({"c": {"x": 1}}, "c.y", 2, {"c": {"x": 1, "y": 2}}),
    ({"c": "text"}, "c.y", 2, {"c": {"y": 2}}),
    ({"l": [1, 2]}, "l.1", 9, {"l": [1, 9]}),
    ({"l": [1, 2]}, "l.-1", 3, {"l": [1, 2, 3]}),
    ({"l": [1]}, "l.3", 4, {"l": [1, None, None, 4]}),
    ({}, "n.0", "x", {"n": ["x"]}),
    ({}, "users.:2313.name", "Sara", {"users": {"2313": {"name": "Sara"}}}),
    ({}, r"fav\.movie", "Deer Hunter", {"fav.movie": "Deer Hunter"}),
])
def test_set_path_follows_sjson(document, path, value, expected):
    before = json.dumps(document)
    assert set_path(document, path, value) == expected
    assert json.dumps(document) == before  # the argument is never changed


@pytest.mark.parametrize("document, path, expected", [
    ({"a": {"b": 1, "c": 2}}, "a.b", {"a": {"c": 2}}),
    ({"l": [1, 2, 3]}, "l.1", {"l": [1, 3]}),
    ({"l": [1, 2, 3]}, "l.-1", {"l": [1, 2]}),
    ({"a": 1}, "x.y", {"a": 1}),
])
def test_delete_path_follows_sjson(document, path, expected):
    assert delete_path(document, path) == expected


def test_filters_apply_in_llama_swap_order_with_set_params_by_id_last():
    filters = Filters(
        strip_params=("top_k", "a.drop"),
        set_params={"temperature": 0.5, "chat_template_kwargs.enable_thinking": True},
        set_params_by_id={
            "m:no_think": {"chat_template_kwargs.enable_thinking": False, "temperature": 0.1, "model": "never"},
            "m:hot": {"temperature": 1.2},
        },
    )
    document = {"model": "m:no_think", "top_k": 3, "a": {"drop": 1, "keep": 2}, "temperature": 0.9}
    assert rewrite(document, "served", filters, "m:no_think") == {
        "model": "served", "a": {"keep": 2}, "temperature": 0.1,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert rewrite({"model": "m:hot"}, None, filters, "m:hot")["temperature"] == 1.2
    # The model's own name has no entry: setParams alone.
    assert rewrite({"model": "m"}, None, filters, "m") == {
        "model": "m", "temperature": 0.5, "chat_template_kwargs": {"enable_thinking": True},
    }
    # Nothing to change: None (the original bytes go).
    assert rewrite({"model": "m", "x": 1}, None, Filters(set_params_by_id={"other": {"x": 2}}), "m") is None


# -- profiles ---------------------------------------------------------------------------


@pytest.mark.parametrize("body, expected", [
    (b'{"name": "coding"}', "coding"),
    (b'{"name": null}', None),
    (b'{"name": ""}', None),
    (b'{"name": "coding"} trailing', "coding"),  # Go's decoder reads the first value
    (b'', ActivationError(400, "invalid profile request")),
    (b'[1]', ActivationError(400, "invalid profile request")),
    (b'null', ActivationError(400, "profile name is required")),
    (b'{}', ActivationError(400, "profile name is required")),
    (b'{"name": 5}', ActivationError(400, "profile name must be a string or null")),
])
def test_profile_activation_requests(body, expected):
    assert parse_activation(body) == expected


def test_profile_switch_and_listing():
    config = Config(path="x", models={"a": model("a")}, profiles={
        "work": ProfileConfig(id="work", description="day", pins={"gpt": "a", "off": ""}),
        "home": ProfileConfig(id="home", pins={"gpt": "a"}),
    })
    switch = ProfileSwitch()
    assert switch.activate(config, b'{"name": "nope"}') == (404, 'profile "nope" not found')
    assert switch.activate(config, b'{"name": "work"}') == (200, {"active": "work"})
    assert switch.pins(config) == {"gpt": "a", "off": ""}
    assert listing(config, switch.active) == {"active": "work", "profiles": [
        {"id": "home", "description": "", "pins": {"gpt": "a"}},
        {"id": "work", "description": "day", "pins": {"gpt": "a", "off": ""}},
    ]}
    switch.reset()
    assert switch.pins(config) is None


def test_upstream_pin_takes_the_longest_prefix_up_to_a_slash():
    pins = {"org": "a", "org/model": "b", "x": ""}
    assert upstream_pin(pins, "org/model/v1/models") == ("org/model", "b")
    assert upstream_pin(pins, "org/other") == ("org", "a")
    assert upstream_pin(pins, "organ/x") is None
    assert upstream_pin(pins, "x") == ("x", "")


# -- multipart and error bodies ---------------------------------------------------------


def test_multipart_model_field_is_replaced_and_nothing_else():
    boundary = "XyZ"
    body = (
        b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
        b"Content-Type: audio/wav\r\n\r\n\x00\x01--binary\r\n--XyZ\r\n"
        b"Content-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-pin\r\n--XyZ--\r\n"
    )
    content_type = f"multipart/form-data; boundary={boundary}"
    rewritten = replace_multipart_field(content_type, body, "model", "whisper-large")
    assert rewritten == body.replace(b"whisper-pin", b"whisper-large")
    assert model_from_body(content_type, rewritten)[0] == "whisper-large"


def test_urlencoded_form_names_its_model_and_is_rewritten():
    form = "application/x-www-form-urlencoded"
    body = b"prompt=a+b%26c&model=pin&model=second&empty="
    assert model_from_body(form, body) == ("pin", None)  # the first value, as Go's FormValue
    rewritten = replace_form_field(form, body, "model", "qwen/coder 7b")
    assert model_from_body(form, rewritten)[0] == "qwen/coder 7b"
    assert b"prompt=a+b%26c" in rewritten and b"empty=" in rewritten
    assert replace_form_field(form, b"prompt=x", "model", "y") == b"prompt=x"  # no field: untouched
    # curl -d sends JSON labelled as a form: it is told to say application/json, as text/plain is
    with pytest.raises(UnreadableBody, match="curl -H 'Content-Type: application/json'") as refused:
        model_from_body(form, b'{"model": "a"}')
    assert refused.value.status == 415
    with pytest.raises(UnreadableBody, match="Content-Type is text/plain, which this route does not read"):
        model_from_body("text/plain", b"model=a")


def test_llama_swap_error_bodies():
    response = llama_swap_error("", 409, "model m is not loaded; path matches upstream.ignorePaths")
    assert response.status == 409 and json.loads(response.text) == {"src": "llama-swap", "error": {
        "message": "model m is not loaded; path matches upstream.ignorePaths", "type": "invalid_request_error",
        "param": None, "code": "conflict",
    }}
    assert json.loads(llama_swap_error("*/*", 503, "x").text)["error"]["code"] == "service_unavailable"
    assert llama_swap_error("text/plain", 404, "model not found").text == "llama-swap: model not found"
    page = llama_swap_error("text/html", 404, "<b>'x'</b>").text
    assert page == "<html><body><h1>llama-swap</h1><p>&lt;b&gt;&#39;x&#39;&lt;/b&gt;</p></body></html>"


# -- logTimeFormat and the request log ----------------------------------------------------

# Monday 2026-03-02 15:04:05.120034500 at +01:00, and the same instant in UTC.
CET = datetime.timezone(datetime.timedelta(hours=1), "CET")
WHEN = datetime.datetime(2026, 3, 2, 15, 4, 5, 120034, tzinfo=CET)


@pytest.mark.parametrize("name, expected", [
    ("ansic", "Mon Mar  2 15:04:05 2026"),
    ("UnixDate", "Mon Mar  2 15:04:05 CET 2026"),
    ("rubydate", "Mon Mar 02 15:04:05 +0100 2026"),
    ("rfc822", "02 Mar 26 15:04 CET"),
    ("rfc822z", "02 Mar 26 15:04 +0100"),
    ("rfc850", "Monday, 02-Mar-26 15:04:05 CET"),
    ("rfc1123", "Mon, 02 Mar 2026 15:04:05 CET"),
    ("rfc1123z", "Mon, 02 Mar 2026 15:04:05 +0100"),
    ("rfc3339", "2026-03-02T15:04:05+01:00"),
    ("rfc3339nano", "2026-03-02T15:04:05.1200345+01:00"),
    ("kitchen", "3:04PM"),
    ("stamp", "Mar  2 15:04:05"),
    ("stampmilli", "Mar  2 15:04:05.120"),
    ("stampmicro", "Mar  2 15:04:05.120034"),
    (" StampNano ", "Mar  2 15:04:05.120034500"),
])
def test_log_time_formats_write_go_layouts(name, expected):
    assert format_go_time(layout_of(name), WHEN, nanosecond=120034500) == expected


def test_log_time_format_edges():
    utc = WHEN.astimezone(datetime.timezone.utc)
    assert format_go_time(layout_of("rfc3339"), utc) == "2026-03-02T14:04:05Z"
    assert format_go_time(layout_of("rfc3339nano"), utc.replace(microsecond=0)) == "2026-03-02T14:04:05Z"
    assert format_go_time(layout_of("kitchen"), WHEN.replace(hour=0)) == "12:04AM"
    assert layout_of("none") is None and layout_of("iso8601") is None  # no timestamp, as llama-swap for the latter
    # unset or "": swaplab's own (llama-swap prints none)
    assert layout_of("") == layout_of("  ") == "2006-01-02 15:04:05"
    assert format_go_time(layout_of(""), WHEN) == "2026-03-02 15:04:05"


@pytest.mark.parametrize("seconds, expected", [
    (0, "0s"), (0.000000850, "850ns"), (0.000850, "850µs"), (0.0123456, "12.3456ms"), (1.5, "1.5s"),
    (65, "1m5s"), (3605.25, "1h0m5.25s"),
])
def test_durations_read_as_go_writes_them(seconds, expected):
    assert go_duration(seconds) == expected


def test_console_lines_carry_the_local_time_the_named_layout_or_none():
    record = logging.LogRecord("swaplab.router", logging.INFO, __file__, 1, "ready", None, None)
    record.created = WHEN.timestamp()
    local = datetime.datetime.fromtimestamp(record.created).strftime("%Y-%m-%d %H:%M:%S")
    assert console_formatter("").format(record) == f"{local} INFO swaplab.router: ready"
    assert console_formatter("none").format(record) == "INFO swaplab.router: ready"
    assert console_formatter("iso8601").format(record) == "INFO swaplab.router: ready"
    assert re.fullmatch(r"\d{1,2}:\d\d[AP]M INFO swaplab\.router: ready", console_formatter("Kitchen").format(record))
    assert console_time("", record.created) == f"{local} " and console_time("none", record.created) == ""
