// What the models list and a model's own page share: one model's facts joined from the
// feed and the router's two lists, its state badge, its chips and its action buttons.

import { modelPath, postJson } from "./api.js";
import { chip, h, setText } from "./dom.js";
import { ago, bytes, count, duration, gib, stateLabel } from "./format.js";
import { inflightByModel, refreshDetails, state } from "./live.js";
import { toast } from "./toast.js";

const CAPABILITY_LABELS = {
  vision: "vision",
  function_calling: "tools",
  audio_transcriptions: "transcription",
  audio_speech: "speech",
  image_generation: "image generation",
  image_to_image: "image editing",
  reranker: "reranker",
};

/** One model's facts: modelStatus (live), its /running entry and its /api/models entry. Pure. */
export function describeModel(status, running, catalog, requests) {
  const capabilities = { ...(status.capabilities || {}), ...((catalog && catalog.capabilities && catalog.capabilities.capabilities) || {}) };
  const contextLength = status.context_length ?? (catalog && catalog.capabilities && catalog.capabilities.context_length) ?? null;
  const claims = running && running.devices ? Object.entries(running.devices).map(([device, amount]) => ({ device, amount })) : (status.devices || []).map((device) => ({ device: String(device), amount: undefined }));
  return {
    id: status.id,
    name: status.name && status.name !== status.id ? status.name : "",
    description: status.description || (catalog && catalog.description) || "",
    state: status.state || "stopped",
    unlisted: Boolean(status.unlisted),
    aliases: status.aliases || (catalog && catalog.aliases) || [],
    capabilities: Object.keys(capabilities).filter((key) => capabilities[key]).map((key) => CAPABILITY_LABELS[key] || key),
    contextLength,
    claims,
    claimEstimate: status.claim_estimate || (running && running.claim_estimate) || null,
    pid: (running && running.pid) ?? status.pid ?? null,
    proxy: running ? running.proxy : null,
    cmd: running ? running.cmd : null,
    ttl: running ? running.ttl : null,
    startSeconds: running ? running.start_seconds : null,
    sleepable: Boolean(catalog && catalog.sleep),
    sleep: (running && running.sleep) || status.sleep || null,
    kvCache: (running && running.kv_cache) || status.kv_cache || null,
    progress: (running && running.progress) || status.progress || null,
    phase: (running && running.phase) || status.phase || "",
    failures: (running && running.consecutive_failures) || 0,
    lastError: (running && running.last_error) || "",
    backoffSeconds: running ? running.backoff_seconds : null,
    waiting: (running && running.waiting) || "",
    requests: requests || 0,
    queued: (running && running.queued) ?? status.queued ?? 0,
    entry: catalog ? catalog.entry : "",
    configHash: catalog ? catalog.config_hash : "",
  };
}

/** Every local model, described from the live state. */
export function localModels() {
  const running = new Map(state.running.running.map((entry) => [entry.model, entry]));
  const requests = inflightByModel();
  return state.models.map((status) => describeModel(status, running.get(status.id), state.catalog.get(status.id), requests.get(status.id)));
}

export function findModel(id) {
  return localModels().find((model) => model.id === id) || null;
}

export function deviceName(device) {
  const entry = state.running.devices.find((candidate) => String(candidate.id) === String(device));
  return entry ? entry.name || entry.nvml_name || "" : "";
}

// -- pieces -------------------------------------------------------------------------

export function stateBadge(initial) {
  const badge = h("span", { class: "state" }, h("span", { class: "dot", "aria-hidden": "true" }), h("span", { class: "state-label" }));
  setState(badge, initial);
  return badge;
}

export function setState(badge, value) {
  badge.dataset.state = value || "stopped";
  setText(badge.lastElementChild, stateLabel(value));
}

/** The model's chips: aliases, capabilities, context, devices with their claims. */
export function modelChips(model) {
  const chips = [];
  for (const alias of model.aliases) chips.push(chip(alias, "alias"));
  for (const capability of model.capabilities) chips.push(chip(capability));
  if (model.contextLength) chips.push(chip(`${Math.round(model.contextLength / 1024)}k context`));
  for (const claim of model.claims) {
    const amount = claim.amount === undefined ? "" : claim.amount === null ? " · whole" : ` · ${gib(claim.amount)}`;
    const estimated = model.claimEstimate && claim.amount != null ? " est." : "";
    const node = chip(`GPU ${claim.device}${amount}${estimated}`, "device");
    const name = deviceName(claim.device);
    if (name || estimated) node.title = [name, estimated ? model.claimEstimate : ""].filter(Boolean).join(" · ");
    chips.push(node);
  }
  if (model.sleepable) chips.push(chip(model.sleep ? `sleeps: ${model.sleep.engine}${model.sleep.engine === "vllm" ? ` L${model.sleep.level}` : ""}` : "sleeps", "sleep"));
  return chips;
}

/** A load under way as a bar: its share done (null: not known yet), and what it is doing. Pure. */
export function loadProgress(model) {
  const progress = model.progress;
  if (!progress || !["starting", "waking"].includes(model.state)) return null;
  const share = progress.percent != null ? progress.percent / 100 : progress.fraction;
  const parts = [progress.stage + (progress.fraction != null ? ` ${Math.round(progress.fraction * 100)}%` : "")];
  parts.push(duration(progress.elapsed_seconds));
  if (progress.stuck) parts.push(`probably stuck: no output for ${duration(progress.silent_seconds)}`);
  else if (progress.eta_seconds != null) parts.push(`about ${duration(progress.eta_seconds)} left (usually ${duration(progress.usual_seconds)})`);
  else parts.push("first load here: no ETA yet");
  return { share: share == null ? null : Math.max(0, Math.min(1, share)), text: parts.join(" · "), stuck: Boolean(progress.stuck) };
}

/** The load's bar, or an empty placeholder that hides itself. */
export function progressBar(model) {
  const progress = loadProgress(model);
  const bar = h("div", { class: "load-progress", role: "progressbar", hidden: !progress });
  if (!progress) return bar;
  bar.dataset.stuck = String(progress.stuck);
  if (progress.share == null) bar.dataset.indeterminate = "true";
  else bar.setAttribute("aria-valuenow", String(Math.round(progress.share * 100)));
  bar.setAttribute("aria-valuemin", "0");
  bar.setAttribute("aria-valuemax", "100");
  bar.append(
    h("span", { class: "load-track" }, h("span", { class: "load-fill", style: `width: ${((progress.share ?? 0.3) * 100).toFixed(1)}%` })),
    h("span", { class: "load-text" }, progress.text),
  );
  return bar;
}

/** Why the model is not serving, if something says so: a crash loop, a failed wake, a wait. */
export function modelProblem(model) {
  if (model.failures) {
    const backoff = model.backoffSeconds ? ` · next start in ${model.backoffSeconds} s` : "";
    return { kind: "error", text: `failed ${model.failures}× · ${model.lastError}${backoff}` };
  }
  if (model.sleep && model.sleep.last_fallback) return { kind: "warning", text: `stopped instead of sleeping or waking: ${model.sleep.last_fallback}` };
  if (model.sleep && model.sleep.enabled === false) return { kind: "warning", text: "sleep disabled after two failed sleeps or wakes in a row" };
  if (model.waiting) return { kind: "info", text: model.waiting };
  if (model.phase) return { kind: "info", text: `${model.phase}…` };
  if (model.kvCache && model.kvCache.last_failure) return { kind: "warning", text: `context: ${model.kvCache.last_failure}` };
  return null;
}

/** The model's load and process, one short line each. */
export function modelFacts(model) {
  const facts = [];
  const load = [];
  if (model.requests) load.push(`${model.requests} ${model.requests === 1 ? "request" : "requests"}`);
  if (model.queued) load.push(`${model.queued} queued`);
  if (load.length) facts.push({ kind: "load", text: load.join(" · ") });
  const process = [];
  if (model.pid) process.push(`pid ${model.pid}`);
  if (model.startSeconds != null && !["stopped", "starting", "waking"].includes(model.state)) process.push(`started in ${duration(model.startSeconds)}`);
  if (process.length) facts.push({ text: process.join(" · ") });
  const sleep = model.sleep;
  if (sleep) {
    const parts = [];
    if (model.state === "sleeping") {
      if (sleep.asleep_since) parts.push(`asleep since ${ago(new Date(sleep.asleep_since * 1000))}`);
      if (sleep.host_gib != null) parts.push(`holds ${gib(sleep.host_gib)} RAM`);
    }
    if (sleep.last_wake_seconds != null) parts.push(`last wake ${duration(sleep.last_wake_seconds)}`);
    if (sleep.wakes) parts.push(`${sleep.wakes} ${sleep.wakes === 1 ? "wake" : "wakes"}`);
    if (parts.length) facts.push({ kind: "sleep", text: parts.join(" · ") });
  }
  const context = model.kvCache;
  if (context) facts.push({ kind: "context", text: contextText(context, model.state) });
  if (model.claimEstimate) facts.push({ kind: "memory", text: `memory ${model.claimEstimate}` });
  return facts;
}

/** What is kept of the model's context across swaps (kvCache): saved tokens, size, age; restored ones. */
export function contextText(context, modelState) {
  const parts = [];
  if (modelState !== "stopped" && context.restored_tokens) {
    const took = context.last_restore_seconds != null ? ` in ${duration(context.last_restore_seconds)}` : "";
    parts.push(`restored ${count(context.restored_tokens)} tokens${took}`);
  }
  const saved = (context.saved || []).filter((slot) => !slot.stale);
  if (saved.length) {
    const newest = Math.max(...saved.map((slot) => slot.saved_at));
    parts.push(`context saved: ${count(context.saved_tokens)} tokens in ${saved.length} ${saved.length === 1 ? "slot" : "slots"} · ${bytes(context.saved_bytes)} · ${ago(new Date(newest * 1000))}`);
  } else if (!parts.length) {
    parts.push(`keeps its context across swaps (slots of ${count(context.min_tokens)}+ tokens)`);
  }
  return parts.join(" · ");
}

// -- actions ------------------------------------------------------------------------

const pending = new Map(); // model id -> "load" | "unload" | "sleep" while its request runs
const actionSets = new Set();

const VERBS = {
  load: { busy: "Loading…", path: (id) => `/load?model=${encodeURIComponent(id)}` },
  unload: { busy: "Unloading…", path: (id) => `/api/models/unload/${modelPath(id)}` },
  sleep: { busy: "Sleeping…", path: (id) => `/api/models/sleep/${modelPath(id)}` },
};

async function act(id, verb) {
  pending.set(id, verb);
  actionSets.forEach((set) => set.refresh());
  try {
    await postJson(VERBS[verb].path(id));
  } catch (error) {
    toast(`${verb} ${id}: ${error.message}`, "error");
  } finally {
    pending.delete(id);
    actionSets.forEach((set) => set.refresh());
    refreshDetails();
  }
}

/** Load (Wake when asleep), Sleep (models with `sleep:`) and Unload, enabled by the model's state. */
export function modelActions(id) {
  const button = (verb, label) => h("button", { type: "button", class: `button button-small action-${verb}`, onclick: () => act(id, verb) }, label);
  const load = button("load", "Load");
  const sleep = button("sleep", "Sleep");
  const unload = button("unload", "Unload");
  const root = h("div", { class: "actions" }, load, sleep, unload);
  let model = null;

  const refresh = () => {
    if (!model) return;
    const busy = pending.get(id);
    const current = model.state;
    load.disabled = Boolean(busy) || !["stopped", "sleeping"].includes(current);
    setText(load, busy === "load" ? VERBS.load.busy : current === "sleeping" ? "Wake" : "Load");
    sleep.hidden = !model.sleepable;
    sleep.disabled = Boolean(busy) || current !== "ready";
    setText(sleep, busy === "sleep" ? VERBS.sleep.busy : "Sleep");
    unload.disabled = Boolean(busy) || ["stopped", "stopping"].includes(current);
    setText(unload, busy === "unload" ? VERBS.unload.busy : "Unload");
  };
  const set = { refresh };
  actionSets.add(set);
  return {
    root,
    update(next) {
      model = next;
      refresh();
    },
    dispose() {
      actionSets.delete(set);
    },
  };
}
