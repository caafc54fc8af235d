"""llama-swap's server tests that the corpus checks only at config level, run over real HTTP (issue 13).

Each case of tests/fixtures/llama-swap/cases.json with a `runtime` key is one test here,
under its corpus id: a real `swaplab serve` on the case's config, the case's requests sent
with aiohttp, and what llama-swap's Go test asserts about the answers. llama-swap's tests
call a stub router in process; here every model is a `swaplab sim` process and the peer
is one too. `served_config` makes the one substitution that needs, and nothing else
(`test_the_substitution_keeps_every_name` proves it keeps every name, alias, filter,
profile and selector as written):

- a model's `cmd: echo ...` becomes `swaplab sim --port P --model ID`, P being `${PORT}`
  when the cmd has it; a model with a fixed `proxy` (`hidden`: `http://localhost:1234`)
  gets a sim on a free port instead, and that port as its proxy;
- the peer's `proxy: http://example.com` becomes the URL of a sim serving its models;
- the case's `mutation` (what the Go test changes on the loaded config) is written into
  the YAML.

The Go tests' hooks become swaplab's own endpoints: the request context a stub router
reads (`Model`, `ModelID`) is what a sim received (`/sim/last-request`) and which sim
received it; `metricsEntries` is `GET /api/activity`; `modelStatus` (the model list
of llama-swap's `/api/events`) is `GET /api/models`; `POST /api/models/unload/<id>` is
`POST /unload?model=<id>`; `getLogger(id)` is `GET /logs?source=<id>`. The states a stub
router is told (`running: {"a": "starting"}`) are reached for real, with the sim's knobs;
each case says how. A body the Go test sends without `messages` gets one, since a sim
answers a chat only with one.

Where swaplab deliberately answers otherwise (`RUNTIME_DIFFERENCES`, listed in
docs/config.md's "Differences from llama-swap"), the test asserts swaplab's answer and
that it is not llama-swap's, so a case that comes to agree must leave the list.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from procs import SIM, Router, Sim, eventually, free_port
from routerclient import running, wait_for_state
from swaplab.config import load_config_text
from test_llama_swap_corpus import CASE_IDS, CASES, CORPUS, RUNTIME_DIFFERENCES, llama_swap_view

MESSAGES = [{"role": "user", "content": "hi"}]
RUNTIME_CASES = [(case_id, case) for case_id, case in zip(CASE_IDS, CASES) if "runtime" in case]


# --- the case's config, served by sims ------------------------------------------------------


@dataclass
class Mutation:
    """A Go test's change to the loaded config, as the same change to the YAML text."""

    old: str
    new: str


MUTATIONS: dict[str, Mutation] = {
    "the test sets models.a.compat.ignoreWebsockets=true on the loaded config": Mutation(
        "  a:\n    cmd: echo ${PORT}\n", "  a:\n    cmd: echo ${PORT}\n    compat:\n      ignoreWebsockets: true\n"
    ),
    "the test replaces selectors.public.targets with [a, b] on the loaded config": Mutation(
        "    targets: [variant, remote/remote-model]\n", "    targets: [a, b]\n"
    ),
}


def case_text(case: dict[str, Any]) -> str:
    """The case's YAML with its mutation applied."""
    text = (CORPUS / case["file"]).read_text()
    if "mutation" in case:
        mutation = MUTATIONS[case["mutation"]]
        assert text.count(mutation.old) == 1, case["mutation"]
        text = text.replace(mutation.old, mutation.new)
    return text


def served_config(text: str, peer_url: str, sim_options: dict[str, str], cmd_stop: str | None) -> str:
    """`text` with every model's cmd a sim (its `sim_options`, and `cmd_stop` as its cmdStop) and the peer a sim."""
    lines = text.splitlines()
    section, entry = None, None
    fixed_ports: dict[str, int] = {}
    for line in lines:  # first: which models have a proxy of their own (a fixed port)
        section, entry = _place(line, section, entry)
        if section == "models" and re.fullmatch(r"    proxy: .*", line):
            fixed_ports[entry] = free_port()
    served = []
    section, entry = None, None
    for line in lines:
        section, entry = _place(line, section, entry)
        if section == "models" and re.fullmatch(r"    cmd: echo .*", line):
            port = "${PORT}" if "${PORT}" in line else str(fixed_ports[entry])
            served.append(f"    cmd: {SIM} --port {port} --model {entry} {sim_options.get(entry, '')}".rstrip())
            if cmd_stop is not None:
                served.append(f"    cmdStop: {cmd_stop}")
        elif section == "models" and re.fullmatch(r"    proxy: .*", line):
            served.append(f"    proxy: http://127.0.0.1:{fixed_ports[entry]}")
        elif section == "peers" and re.fullmatch(r"    proxy: .*", line):
            served.append(f"    proxy: {peer_url}")
        else:
            served.append(line)
    return "\n".join(served) + "\n"


def _place(line: str, section: str | None, entry: str | None) -> tuple[str | None, str | None]:
    """Where a line of a block-style YAML config is: its top-level section and the entry (`  name:`) in it."""
    if re.fullmatch(r"[A-Za-z]\S*:.*", line):
        return line.split(":")[0], None
    if match := re.fullmatch(r"  ([^ #][^:]*):\s*", line):
        return section, match.group(1)
    return section, entry


@dataclass
class Served:
    """A router on a case's config, and where its sims listen."""

    router: Router
    peer: Sim
    session: aiohttp.ClientSession
    url: str = field(init=False)

    def __post_init__(self) -> None:
        self.url = self.router.url

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.json(content_type=None)

    async def send(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        async with self.session.request(
            method, self.url + path, data=data, headers={"Content-Type": "application/json"}
        ) as response:
            return response.status, await response.text()

    async def activate(self, profile: str) -> None:
        status, text = await self.send("PUT", "/api/profiles/active", {"name": profile})
        assert status == 200, text

    async def last_request(self, model: str) -> dict[str, Any]:
        """What the router last sent model `model`'s sim, asked of the sim itself (`/upstream/` follows pins)."""
        proxy = (await running(self.session, self.url))[model]["proxy"]
        async with self.session.get(f"{proxy}/sim/last-request") as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def load(self, *models: str) -> None:
        for model in models:
            async with self.session.post(f"{self.url}/load", params={"model": model}) as response:
                assert response.status == 200, await response.text()

    async def activity(self, count: int) -> list[dict[str, Any]]:
        """The activity rows once there are `count`, oldest first (they are written a moment after a request ends)."""
        rows: list[dict[str, Any]] = []

        async def recorded() -> bool:
            nonlocal rows
            rows = (await self.get("/api/activity"))[1]["activity"]
            return len(rows) >= count

        await eventually(recorded, 10, lambda: f"{count} activity rows, have {rows}")
        return sorted(rows, key=lambda row: (row["time"], row["id"]))


@pytest.fixture
async def serve(router_factory, tmp_path):
    """`await serve(case, sim_options={model: "--ttft-ms ..."}, cmd_stop=...)`: the case's router, started."""
    peers: list[Sim] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(case: dict[str, Any], sim_options: dict[str, str] | None = None, cmd_stop: str | None = None) -> Served:
        peer = Sim(tmp_path, model="remote-model")
        peers.append(peer)
        text = served_config(case_text(case), peer.url, sim_options or {}, cmd_stop)
        router = router_factory(text)
        session = aiohttp.ClientSession()
        sessions.append(session)
        served = Served(router, peer, session)
        if "active_profile" in case:
            await served.activate(case["active_profile"])
        return served

    yield start
    for session in sessions:
        await session.close()
    for peer in peers:
        peer.close()


# --- llama-swap's expectations, and swaplab's deliberate differences ------------------------


@dataclass
class Findings:
    """The expectations of one case where swaplab answers otherwise, deliberately."""

    differences: list[str] = field(default_factory=list)

    def agree(self, what: str, actual: Any, llama_swap: Any, swaplab: Any = None) -> None:
        """`actual` is llama-swap's value; or, when `swaplab` is given, swaplab's own (and not llama-swap's)."""
        if swaplab is None:
            assert actual == llama_swap, f"{what}: {actual!r}, llama-swap's {llama_swap!r}"
            return
        assert actual == swaplab != llama_swap, f"{what}: {actual!r}, swaplab's own {swaplab!r} (llama-swap's {llama_swap!r})"
        self.differences.append(what)


def metadata(row: dict[str, Any]) -> dict[str, Any]:
    """An activity row's `metadata` (llama-swap's per-request annotations), none as {}."""
    return row.get("metadata") or {}


def records(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {record["id"]: record for record in listing["data"]}


Run = Callable[[dict[str, Any], Any, Findings], Awaitable[None]]
RUNS: dict[str, Run] = {}


def runs(test: str) -> Callable[[Run], Run]:
    """Register the runner of llama-swap's Go test `test`."""

    def register(run: Run) -> Run:
        RUNS[test] = run
        return run

    return register


@pytest.mark.parametrize(("case_id", "case"), RUNTIME_CASES, ids=[case_id for case_id, _ in RUNTIME_CASES])
async def test_runtime_case(case_id: str, case: dict[str, Any], serve):
    findings = Findings()
    await RUNS[case["test"]](case, serve, findings)
    if case_id in RUNTIME_DIFFERENCES:
        assert findings.differences, f"{case_id} now agrees with llama-swap: take it out of RUNTIME_DIFFERENCES and docs"
    else:
        assert not findings.differences, f"{case_id} differs ({findings.differences}): say so in RUNTIME_DIFFERENCES"


def test_every_runtime_case_has_a_runner():
    assert {case["test"] for _, case in RUNTIME_CASES} == set(RUNS)
    assert len(RUNTIME_CASES) == 14


@pytest.mark.parametrize("file", sorted({case["file"] for _, case in RUNTIME_CASES}))
def test_the_substitution_keeps_every_name(file):
    """What `served_config` changes is only how a model runs: commands and proxies."""
    for _, case in RUNTIME_CASES:
        if case["file"] != file:
            continue
        text = case_text(case)
        served = served_config(text, "http://127.0.0.1:9", {"a": "--ttft-ms 1"}, "kill ${PID}")
        assert "echo" not in served and "example.com" not in served and "1234" not in served
        written, substituted = (llama_swap_view(load_config_text(t, "case.yaml")) for t in (text, served))
        for view in (written, substituted):
            for model in view["models"].values():
                for key in ("cmd", "cmdStop", "proxy"):
                    model.pop(key)
            for peer in view["peers"].values():
                peer.pop("proxy")
        assert substituted == written


# --- profiles (internal/server/profiles_test.go) --------------------------------------------


@runs("TestServer_ProfileAPI")
async def profile_api(case, serve, findings):
    served = await serve(case)
    listing, *switches = case["runtime"]
    status, body = await served.get("/api/profiles")
    assert status == listing["status"]
    assert body["active"] is listing["body"]["active"]
    assert len(body["profiles"]) == listing["body"]["profiles@len"]
    assert body["profiles"][0]["pins"]["disabled"] == listing["body"]["profiles[0].pins.disabled"]
    for switch in switches:
        status, text = await served.send("PUT", "/api/profiles/active", switch["body_sent"])
        assert status == switch["status"], text
        active = (await served.get("/api/profiles"))[1]["active"]
        assert (active or "") == switch["active_after"]


@runs("TestServer_ProfileMiddleware_JSONAndFilters")
async def profile_json_and_filters(case, serve, findings):
    served = await serve(case)
    pinned, disabled = case["runtime"]
    status, text = await served.send("POST", "/v1/chat/completions", {**pinned["json"], "messages": MESSAGES})
    assert status == pinned["status"], text
    # Context.ModelID: the sim of `real` got it; Context.Model and the body: the pin's target, its setParamsByID applied.
    sent = (await served.last_request(pinned["context"]["ModelID"]))["body"]
    assert sent["model"] == pinned["context"]["Model"] == pinned["upstream_body"]["model"]
    assert sent["thinking"] is pinned["upstream_body"]["thinking"]
    (row,) = await served.activity(1)
    assert row["model"] == pinned["context"]["ModelID"]
    assert (metadata(row) == {}) is pinned["context"]["Metadata@empty"]

    status, text = await served.send("POST", "/v1/chat/completions", {**disabled["json"], "messages": MESSAGES})
    assert status == disabled["status"], text


@runs("TestServer_Profile_UpstreamPreservesBody")
async def profile_upstream_preserves_body(case, serve, findings):
    (step,) = case["runtime"]
    served = await serve(case)
    # The sim has no /custom: the same /upstream/<pin>/ request on a path it answers.
    method, path = step["request"].split()
    path = path.removesuffix("/custom") + "/v1/chat/completions"
    sent = {**json.loads(step["upstream_body_exact"]), "messages": MESSAGES}
    status, text = await served.send(method, path, sent)
    assert status == step["status"], text
    received = await served.last_request(step["context"]["ModelID"])
    assert (received["path"], received["body"]) == ("/v1/chat/completions", sent)  # the pin rewrote the path, not the body


@runs("TestServer_Profile_ModelListings")
async def profile_model_listings(case, serve, findings):
    served = await serve(case)
    listing, status_list = case["runtime"]
    status, body = await served.get("/v1/models")
    assert status == 200
    listed = records(body)
    expected = listing["listing"]
    assert set(expected["has_ids"]) <= set(listed)
    assert not set(expected["lacks_ids"]) & set(listed)
    for name in ("public", "real", "remote/remote-model", "expose"):
        wanted = expected[f"{name}.name"]
        # llama-swap omits an empty name; swaplab's `name` falls back to the id.
        findings.agree(f"{name}.name", listed[name]["name"], wanted, None if wanted else name)
    assert listed["public"]["meta"]["llamaswap"]["type"] == expected["public.meta.llamaswap.type"]

    # modelStatus: every local model (unlisted ones too) and peer model, no pin.
    status, body = await served.get("/api/models")
    models = {model["id"]: model for model in body["models"]}
    assert set(status_list["has_ids"]) <= set(models)
    assert not set(status_list["lacks_ids"]) & set(models)
    assert models["remote/remote-model"]["peer"] == status_list["remote/remote-model.peerID"]


@runs("TestServer_Profile_ManagementUsesConcreteModel")
async def profile_management_uses_concrete_model(case, serve, findings):
    served = await serve(case)
    unload, _logger = case["runtime"]
    # `real` is pinned to `hidden`; with `real` running and `hidden` not, an unload that
    # followed the pin would stop nothing (and a load that followed it would start hidden).
    await served.load("real")
    status, text = await served.send("POST", "/unload?model=real")
    assert status == unload["status"], text
    assert json.loads(text) == {"unloaded": unload["unloaded"]}
    assert "real" not in await running(served.session, served.url)
    # getLogger("real"): the lines of real's own server, not the pin's target's.
    async with served.session.get(f"{served.url}/logs", params={"source": "real"}) as response:
        lines = (await response.text()).splitlines()
    assert lines and all(line.startswith("[real] ") for line in lines)


@runs("TestServer_Profile_UpstreamMetricsUseResolvedModel")
async def profile_upstream_metrics_use_resolved_model(case, serve, findings):
    (step,) = case["runtime"]
    served = await serve(case)
    method, path = step["request"].split()
    status, text = await served.send(method, path, {**step["json"], "messages": MESSAGES})
    assert status == step["status"], text
    rows = await served.activity(step["activity"]["len"])
    assert len(rows) == step["activity"]["len"]
    assert rows[0]["model"] == step["activity"]["model"]
    assert (metadata(rows[0]) == {}) is step["activity"]["metadata@empty"]


# --- selectors (internal/server/selector_test.go) -------------------------------------------


@runs("TestServer_SelectorMiddleware_RewritesBeforeFiltersAndRecordsActivity")
async def selector_rewrites_before_filters(case, serve, findings):
    (step,) = case["runtime"]
    served = await serve(case)
    status, text = await served.send("POST", "/v1/chat/completions", {**step["json"], "messages": MESSAGES})
    assert status == step["status"], text
    sent = (await served.last_request(step["context"]["ModelID"]))["body"]
    assert sent["model"] == step["context"]["Model"] == step["upstream_body"]["model"]
    assert sent["thinking"] is step["upstream_body"]["thinking"]
    rows = await served.activity(step["activity"]["len"])
    assert len(rows) == step["activity"]["len"]
    assert rows[0]["model"] == step["activity"]["model"]
    assert metadata(rows[0]).get("selector") == step["activity"]["metadata.selector"]


@runs("TestServer_SelectorMiddleware_ProfileRunsFirst")
async def selector_profile_runs_first(case, serve, findings):
    (step,) = case["runtime"]
    served = await serve(case)
    status, text = await served.send("POST", "/v1/chat/completions", {**step["json"], "messages": MESSAGES})
    assert status == step["status"], text
    # llm-code -> (profile) public -> (selector) variant, an alias of a.
    assert (await served.last_request(step["context"]["ModelID"]))["body"]["model"] == "variant"
    rows = await served.activity(step["activity"]["len"])
    assert len(rows) == step["activity"]["len"]
    assert rows[0]["model"] == step["context"]["ModelID"]
    assert metadata(rows[0]).get("selector") == step["activity"]["metadata.selector"]


async def in_flight(served: Served) -> dict[str, int]:
    return {model: entry["in_flight"] for model, entry in (await running(served.session, served.url)).items()
            if entry["in_flight"]}


@runs("TestServer_SelectorMiddleware_SpilloverReservations")
async def selector_spillover_reservations(case, serve, findings):
    (step,) = case["runtime"]
    # Held open: each sim waits a minute before its first token; the test leaves before.
    served = await serve(case, sim_options={model: "--ttft-ms 60000" for model in step["running"]})
    await served.load(*step["running"])
    requests: list[asyncio.Task] = []
    try:
        chosen: list[str] = []
        for _ in range(2):
            body = {"model": "balanced", "messages": MESSAGES, "stream": True}
            requests.append(asyncio.ensure_future(served.send("POST", "/v1/chat/completions", body)))

            async def routed() -> list[str]:
                busy = await in_flight(served)
                return [model for model in busy if model not in chosen] if len(busy) > len(chosen) else []

            (model,) = await eventually(routed, 30, "the request to reach a model")
            chosen.append(model)
        assert chosen[0] != chosen[1]
    finally:
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)


@runs("TestServer_SelectorMiddleware_IgnoredWebsocketDoesNotReserveSpillover")
async def selector_ignored_websocket(case, serve, findings):
    (step,) = case["runtime"]
    served = await serve(case)
    await served.load(*step["running"])
    # Both sockets stay open until both are up: the first, on `a` (ignoreWebsockets),
    # must have given its reservation back at once, or the second would go to c.
    async with served.session.ws_connect(f"{served.url}/props?model=balanced") as first:
        async with served.session.ws_connect(f"{served.url}/props?model=balanced") as second:
            for socket in (first, second):
                await socket.send_str("ping")
                assert (await socket.receive()).data == "ping"
    rows = await served.activity(2)
    assert [row["model"] for row in rows] == step["selected_in_order"]


@runs("TestServer_SelectorMiddleware_AllSpilloverTargetsStopping")
async def selector_all_spillover_targets_stopping(case, serve, findings):
    (step,) = case["runtime"]
    # swaplab has no `shutdown` state (llama-swap's for a process that will not start
    # again); a model that is stopping is the one no request may go to, so all three stop
    # at once, each taking 5 s (a slow cmdStop, as tests/test_fairness.py's side2).
    served = await serve(case, cmd_stop='sh -c "sleep 5; kill ${PID}"')
    await served.load(*step["running"])
    unload = asyncio.ensure_future(served.send("POST", "/unload"))
    try:
        for model in step["running"]:
            await wait_for_state(served.session, served.url, model, "stopping")
        status, text = await served.send("POST", "/v1/chat/completions", {**step["json"], "messages": MESSAGES})
        assert status == step["status"], text
        assert step["body_contains"] in text
    finally:
        await unload


@runs("TestServer_SelectorMiddleware_UpstreamUnsupported")
async def selector_upstream_unsupported(case, serve, findings):
    (step,) = case["runtime"]
    served = await serve(case)
    method, path = step["request"].split()
    status, text = await served.send(method, path, {**step["json"], "messages": MESSAGES})
    assert status == step["status"], text
    # The router was not called: the selector's targets were neither started nor asked.
    assert await running(served.session, served.url) == {}


@runs("TestServer_Selector_ModelListings")
async def selector_model_listings(case, serve, findings):
    (step,) = case["runtime"]
    # a (variant's model) starting: its sim takes a minute to load.
    served = await serve(case, sim_options={"a": "--load-seconds 60"})
    loading = asyncio.ensure_future(served.load("a"))
    try:
        await wait_for_state(served.session, served.url, "a", "starting")
        status, body = await served.get("/v1/models")
    finally:
        loading.cancel()
        await asyncio.gather(loading, return_exceptions=True)
    assert status == step["status"]
    listed = records(body)
    expected = step["listing"]
    public, balanced = listed["public"], listed["balanced"]
    assert public["name"] == expected["public.name"]
    assert public["description"] == expected["public.description"]
    # llama-swap's {"value": "loaded"}; swaplab adds the state of the target it stands for.
    assert public["status"] == {"value": expected["public.status.value"], "state": "starting"}
    meta = public["meta"]["llamaswap"]
    assert meta["purpose"] == expected["public.meta.llamaswap.purpose"]
    assert meta["type"] == expected["public.meta.llamaswap.type"]
    assert meta["strategy"] == expected["public.meta.llamaswap.strategy"]
    assert meta["targets"] == expected["public.meta.llamaswap.targets"]
    assert not set(expected["public.meta.llamaswap@lacks_keys"]) & set(meta)
    meta = balanced["meta"]["llamaswap"]
    assert meta["strategy"] == expected["balanced.meta.llamaswap.strategy"]
    assert meta["targets"] == expected["balanced.meta.llamaswap.targets"]
    assert meta["spillover"] == expected["balanced.meta.llamaswap.spillover"]
    assert not set(expected["lacks_ids"]) & set(listed)


@runs("TestServer_Selector_ModelListingPinUsesFirstTarget")
async def selector_model_listing_pin_uses_first_target(case, serve, findings):
    (step,) = case["runtime"]
    served = await serve(case)
    await served.load(*step["running"])  # b, the pin's second target: ready
    status, body = await served.get("/v1/models")
    assert status == 200
    assert records(body)["public"]["status"] == {"value": step["listing"]["public.status.value"], "state": "stopped"}
