// #/models: every model with its live state, the devices' memory, the peers, the profile.

import { getJson, postJson } from "./api.js";
import { empty, h, reconcile, setText } from "./dom.js";
import { ago, gib } from "./format.js";
import { on, state } from "./live.js";
import { loadProgress, localModels, modelActions, modelChips, modelFacts, modelProblem, progressBar, setState, stateBadge } from "./modelparts.js";
import { toast } from "./toast.js";

function modelRow(model) {
  const actions = modelActions(model.id);
  const badge = stateBadge(model.state);
  const link = h("a", { class: "model-id", href: `#/models/${encodeURIComponent(model.id)}` });
  const name = h("span", { class: "model-name" });
  const unlisted = h("span", { class: "tag", title: "not in /v1/models" }, "unlisted");
  const description = h("p", { class: "model-description" });
  const chips = h("div", { class: "chips" });
  const problem = h("p", { class: "model-problem" });
  const progress = h("div", { class: "model-progress" });
  const facts = h("div", { class: "model-facts" });
  const row = h(
    "article",
    { class: "model-row" },
    h("div", { class: "model-state" }, badge),
    h("div", { class: "model-main" }, h("div", { class: "model-title" }, link, name, unlisted), description, chips, problem, progress),
    facts,
    actions.root,
  );
  row.parts = { actions, badge, link, name, unlisted, description, chips, problem, progress, facts };
  return row;
}

function updateModelRow(row, model) {
  const parts = row.parts;
  row.dataset.model = model.id;
  row.dataset.state = model.state;
  setState(parts.badge, model.state);
  setText(parts.link, model.id);
  setText(parts.name, model.name);
  parts.unlisted.hidden = !model.unlisted;
  setText(parts.description, model.description);
  parts.description.hidden = !model.description;
  const chipText = modelChips(model).map((node) => node.textContent).join("\u0000");
  if (parts.chips.dataset.text !== chipText) {
    parts.chips.dataset.text = chipText;
    parts.chips.replaceChildren(...modelChips(model));
  }
  const problem = modelProblem(model);
  parts.problem.hidden = !problem;
  parts.problem.dataset.kind = problem ? problem.kind : "";
  setText(parts.problem, problem ? problem.text : "");
  const progressText = JSON.stringify(loadProgress(model));
  if (parts.progress.dataset.text !== progressText) {
    parts.progress.dataset.text = progressText;
    parts.progress.replaceChildren(progressBar(model));
  }
  const factText = JSON.stringify(modelFacts(model));
  if (parts.facts.dataset.text !== factText) {
    parts.facts.dataset.text = factText;
    parts.facts.replaceChildren(...modelFacts(model).map((fact) => h("span", { class: `fact ${fact.kind ? `fact-${fact.kind}` : ""}` }, fact.text)));
  }
  parts.actions.update(model);
}

// -- devices ------------------------------------------------------------------------

function deviceCard(device) {
  const capacity = device.vram_gib ?? device.total_gib ?? null;
  // Sleepers hold no GPU: the router lists their claims apart (`asleep`), shown hatched after the rest.
  const holders = [...Object.entries(device.models || {}), ...Object.entries(device.asleep || {})];
  const asleep = new Set(Object.keys(device.asleep || {}));
  const claimText = (model, amount) => `${model} · ${amount === null ? "whole device" : gib(amount)}${asleep.has(model) ? " · asleep" : ""}`;
  const meter = h("div", { class: "meter", role: "img" });
  const claimed = Number(device.claimed_gib) || 0;
  holders.forEach(([model, amount], index) => {
    const share = amount === null ? 1 : capacity ? Math.min(1, amount / capacity) : 0;
    const kind = asleep.has(model) ? "meter-part-asleep" : `meter-part-${index % 4}`;
    meter.append(h("span", { class: `meter-part ${kind}`, style: `width: ${(share * 100).toFixed(1)}%`, title: claimText(model, amount) }));
  });
  meter.setAttribute("aria-label", capacity ? `${gib(claimed)} of ${gib(capacity)} claimed` : `${gib(claimed)} claimed`);
  const realUse = device.used_gib != null ? h("p", { class: "device-nvml" }, `in use ${gib(device.used_gib)} · free ${gib(device.free_gib)} (NVML)`) : null;
  return h(
    "article",
    { class: "device", dataset: { device: device.id } },
    h("header", { class: "device-head" }, h("span", { class: "device-id" }, `GPU ${device.id}`), h("span", { class: "device-name" }, device.name || device.nvml_name || "")),
    h("div", { class: "device-usage" }, h("strong", {}, gib(claimed)), h("span", { class: "muted" }, capacity ? ` of ${gib(capacity)} claimed` : " claimed")),
    meter,
    realUse,
    h(
      "div",
      { class: "chips" },
      holders.length ? holders.map(([model, amount]) => h("span", { class: `chip chip-device${asleep.has(model) ? " chip-sleep" : ""}` }, claimText(model, amount))) : h("span", { class: "muted small" }, "free"),
    ),
  );
}

// -- peers --------------------------------------------------------------------------

function peerRows() {
  const probes = new Map(state.running.peers.map((entry) => [`${entry.peer}/${entry.model}`, entry]));
  return state.peers.map((peer) => {
    const probe = probes.get(peer.id) || {};
    const catalog = state.catalog.get(peer.id) || {};
    return {
      id: peer.id,
      peer: peer.peerID,
      available: peer.available !== false,
      reason: probe.reason || catalog.reason || "",
      checkedAt: probe.checked_at || null,
    };
  });
}

function peerRow(peer) {
  const badge = stateBadge("available");
  const row = h("div", { class: "peer-row" }, badge, h("span", { class: "model-id" }), h("span", { class: "muted peer-via" }), h("span", { class: "peer-reason" }));
  row.parts = { badge };
  return row;
}

function updatePeerRow(row, peer) {
  row.dataset.model = peer.id;
  setState(row.parts.badge, peer.available ? "available" : "unavailable");
  setText(row.children[1], peer.id);
  setText(row.children[2], `via ${peer.peer}${peer.checkedAt ? ` · checked ${ago(new Date(peer.checkedAt * 1000))}` : ""}`);
  setText(row.children[3], peer.available ? "" : peer.reason);
}

// -- the view -----------------------------------------------------------------------

export function createModelsView() {
  const summary = h("p", { class: "view-subtitle" });
  const profileSelect = h("select", { class: "select", "aria-label": "Profile" });
  const profileField = h("label", { class: "field-inline", hidden: true }, h("span", { class: "muted" }, "Profile"), profileSelect);
  const unloadAll = h("button", { type: "button", class: "button button-danger" }, "Unload all");
  const devices = h("div", { class: "devices" });
  const devicesSection = h("section", { class: "section", hidden: true }, h("h2", { class: "section-title" }, "Devices"), devices);
  const list = h("div", { class: "model-list", id: "models" });
  const emptyModels = empty("No local models are configured.");
  const peers = h("div", { class: "peer-list", id: "peers" });
  const peersSection = h("section", { class: "section", hidden: true }, h("h2", { class: "section-title" }, "Peers"), peers);
  const root = h(
    "section",
    { class: "view view-models" },
    h("header", { class: "view-head" }, h("div", {}, h("h1", { class: "view-title" }, "Models"), summary), h("div", { class: "view-tools" }, profileField, unloadAll)),
    devicesSection,
    h("section", { class: "section" }, h("div", { class: "panel" }, list, emptyModels)),
    peersSection,
  );

  unloadAll.addEventListener("click", async () => {
    unloadAll.disabled = true;
    try {
      await postJson("/api/models/unload");
      toast("Every model is stopped");
    } catch (error) {
      toast(`Unload all: ${error.message}`, "error");
    } finally {
      unloadAll.disabled = false;
    }
  });

  profileSelect.addEventListener("change", async () => {
    try {
      await postJson("/api/profiles/active", { name: profileSelect.value || null }, { method: "PUT" });
    } catch (error) {
      toast(`Profile: ${error.message}`, "error");
      profileSelect.value = state.profile || "";
    }
  });

  async function loadProfiles() {
    try {
      const listing = await getJson("/api/profiles");
      const profiles = listing.profiles || [];
      profileField.hidden = profiles.length === 0;
      profileSelect.replaceChildren(
        h("option", { value: "" }, "None"),
        ...profiles.map((profile) => h("option", { value: profile.id, title: profile.description || "" }, profile.id)),
      );
      state.profile = listing.active ?? state.profile;
      profileSelect.value = state.profile || "";
    } catch {
      profileField.hidden = true;
    }
  }

  function render() {
    const models = localModels();
    reconcile(list, models, (model) => model.id, modelRow, updateModelRow);
    emptyModels.hidden = models.length > 0 || state.connection === "connecting";
    const ready = models.filter((model) => model.state === "ready").length;
    const asleep = models.filter((model) => model.state === "sleeping").length;
    const bits = [`${models.length} ${models.length === 1 ? "model" : "models"}`, `${ready} ready`];
    if (asleep) bits.push(`${asleep} asleep`);
    setText(summary, models.length ? bits.join(" · ") : "");

    const deviceList = state.running.devices;
    devicesSection.hidden = deviceList.length === 0;
    const deviceJson = JSON.stringify([deviceList, models.map((model) => model.state)]);
    if (devices.dataset.json !== deviceJson) {
      devices.dataset.json = deviceJson;
      devices.replaceChildren(...deviceList.map(deviceCard));
    }

    const peerList = peerRows();
    peersSection.hidden = peerList.length === 0;
    reconcile(peers, peerList, (peer) => peer.id, peerRow, updatePeerRow);
  }

  on("models", render);
  on("inflight", render);
  on("connection", render);
  on("profile", () => (profileSelect.value = state.profile || ""));
  loadProfiles();
  render();

  return { root, title: "Models", show: render, hide() {} };
}
