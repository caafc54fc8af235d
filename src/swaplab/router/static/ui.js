// The router's web page: polls /api/models, /running and /api/activity, streams /logs/stream.
"use strict";

const POLL_MS = 1000;
const LOG_RETRY_MS = 2000;
const LOG_LINES_KEPT = 2000;
const ACTIVITY_ROWS = 50;

// `?key=` lets the page talk to a router that has `apiKeys`: sent as a Bearer token.
const API_KEY = new URLSearchParams(location.search).get("key");
const AUTH_HEADERS = API_KEY ? { Authorization: `Bearer ${API_KEY}` } : {};

const pending = new Map(); // model id -> "load" | "unload" while its button's request runs
let lastModels = [];
let lastRunning = [];
let lastActivityJson = "";
let lastDevicesJson = "";
let wakePoll = null;

const $ = (selector) => document.querySelector(selector);

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function setText(node, text) {
  const value = text === undefined || text === null ? "" : String(text);
  if (node.textContent !== value) node.textContent = value;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** fetch + JSON, with the API key; a non-2xx answer throws with the router's own message. */
async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...AUTH_HEADERS, ...(options.headers || {}) } });
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const message = (body && body.error && (body.error.message || body.error)) || text || response.statusText;
    // aiohttp's plain error pages already start with the status ("404: Not Found").
    throw new Error(message.startsWith(String(response.status)) ? message : `${response.status}: ${message}`);
  }
  return body;
}

function formatTime(seconds) {
  if (typeof seconds !== "number") return "";
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

function formatNumber(value, digits = 0) {
  if (value === null || value === undefined || value === "") return "–";
  const number = Number(value);
  return Number.isFinite(number) ? number.toFixed(digits) : String(value);
}

function formatGiB(value) {
  return value === null || value === undefined ? "–" : `${formatNumber(value, 1)} GiB`;
}

// -- notices -----------------------------------------------------------------

let noticeTimer = null;

function showNotice(message, kind = "info") {
  const notice = $("#notice");
  notice.textContent = message;
  notice.dataset.kind = kind;
  notice.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => (notice.hidden = true), kind === "error" ? 15000 : 5000);
}

// -- polling -----------------------------------------------------------------

function refreshSoon() {
  if (wakePoll) wakePoll();
}

async function pollForever() {
  for (;;) {
    await refresh();
    await new Promise((resolve) => {
      wakePoll = resolve;
      setTimeout(resolve, POLL_MS);
    });
    wakePoll = null;
  }
}

async function refresh() {
  try {
    const [models, running] = await Promise.all([api("/api/models"), api("/running")]);
    lastModels = models.models || [];
    lastRunning = running.running || [];
    renderModels();
    renderDevices(running.devices || []);
    setConnection(true);
  } catch (error) {
    setConnection(false, error.message);
  }
  try {
    const activity = await api(`/api/activity?limit=${ACTIVITY_ROWS}`);
    renderActivity(activity.activity || []);
  } catch (error) {
    setText($("#activity-empty"), `Activity is unavailable: ${error.message}`);
    $("#activity-empty").hidden = false;
  }
}

function setConnection(ok, message) {
  const badge = $("#connection");
  badge.dataset.state = ok ? "connected" : "unreachable";
  setText(badge, ok ? "connected" : "unreachable");
  badge.title = ok ? "" : message || "";
}

// -- models ------------------------------------------------------------------

/** The row for `key` in `tbody`, built once by `build` and kept, so buttons survive refreshes. */
function keyedRow(tbody, key, build) {
  for (const row of tbody.rows) if (row.dataset.key === key) return row;
  const row = build();
  row.dataset.key = key;
  return row;
}

/** Keep exactly `rows`, in that order, in `tbody`, moving a node only when it is out of place. */
function placeRows(tbody, rows) {
  rows.forEach((row, index) => {
    if (tbody.children[index] !== row) tbody.insertBefore(row, tbody.children[index] || null);
  });
  while (tbody.children.length > rows.length) tbody.lastElementChild.remove();
}

function buildModelRow(model) {
  const row = element("tr");
  row.dataset.model = model.id;
  const stateCell = element("td");
  const badge = element("span", "badge state");
  const failures = element("span", "badge failures");
  stateCell.append(badge, failures);

  const modelCell = element("td", "model");
  const id = element("span", "model-id");
  const name = element("span", "muted model-name");
  const unlisted = element("span", "tag", "unlisted");
  modelCell.append(id, name, unlisted);

  const aliases = element("td", "chips");
  const devices = element("td", "chips");
  const requests = element("td", "requests");
  const description = element("td", "description");
  const descriptionText = element("div");
  const lastError = element("div", "error-text");
  description.append(descriptionText, lastError);

  const actions = element("td", "actions");
  const load = element("button", "load", "Load");
  load.type = "button";
  load.addEventListener("click", () => act(model.id, "load"));
  const unload = element("button", "unload", "Unload");
  unload.type = "button";
  unload.addEventListener("click", () => act(model.id, "unload"));
  actions.append(load, unload);

  row.append(stateCell, modelCell, aliases, devices, requests, description, actions);
  row.parts = { badge, failures, id, name, unlisted, aliases, devices, requests, descriptionText, lastError, load, unload };
  return row;
}

function setChips(cell, values) {
  const wanted = (values || []).map(String);
  const current = [...cell.children].map((chip) => chip.textContent);
  if (wanted.join("\u0000") === current.join("\u0000")) return;
  cell.replaceChildren(...wanted.map((value) => element("code", "chip", value)));
}

function renderModels() {
  const running = new Map(lastRunning.map((entry) => [entry.model, entry]));
  const local = lastModels.filter((model) => !model.peer);
  const tbody = $("#models tbody");
  const rows = local.map((model) => {
    const row = keyedRow(tbody, model.id, () => buildModelRow(model));
    const parts = row.parts;
    const live = running.get(model.id) || {};
    const state = live.state || model.state || "stopped";
    parts.badge.dataset.state = state;
    setText(parts.badge, state);
    row.dataset.state = state;

    parts.failures.hidden = !live.consecutive_failures;
    setText(parts.failures, live.consecutive_failures ? `failed ×${live.consecutive_failures}` : "");
    parts.failures.title = live.backoff_seconds ? `next start in ${live.backoff_seconds} s` : "";

    setText(parts.id, model.id);
    setText(parts.name, model.name && model.name !== model.id ? model.name : "");
    parts.unlisted.hidden = !model.unlisted;
    setChips(parts.aliases, model.aliases);
    setChips(parts.devices, model.devices);
    const busy = [];
    if (live.in_flight) busy.push(`${live.in_flight} in flight`);
    if (live.queued) busy.push(`${live.queued} queued`);
    if (live.pid) busy.push(`pid ${live.pid}`);
    if (live.sleep && state === "sleeping" && live.sleep.host_gib != null) busy.push(`asleep, ${live.sleep.host_gib.toFixed(1)} GiB RAM`);
    if (live.sleep && live.sleep.last_wake_seconds != null) busy.push(`last wake ${live.sleep.last_wake_seconds.toFixed(1)} s`);
    setText(parts.requests, busy.join(" · "));
    setText(parts.descriptionText, model.description || "");
    setText(parts.lastError, live.last_error || (live.sleep && live.sleep.last_fallback) || "");

    const action = pending.get(model.id);
    parts.load.disabled = Boolean(action) || (state !== "stopped" && state !== "sleeping");
    parts.unload.disabled = Boolean(action) || state === "stopped" || state === "stopping";
    setText(parts.load, action === "load" ? "Loading…" : "Load");
    setText(parts.unload, action === "unload" ? "Unloading…" : "Unload");
    return row;
  });
  placeRows(tbody, rows);
  $("#models-empty").hidden = local.length > 0;
  renderPeers(lastModels.filter((model) => model.peer));
}

async function act(modelId, verb) {
  pending.set(modelId, verb);
  renderModels();
  refreshSoon();
  try {
    await api(`/${verb}?model=${encodeURIComponent(modelId)}`, { method: "POST" });
  } catch (error) {
    showNotice(`${verb} ${modelId} failed: ${error.message}`, "error");
  } finally {
    pending.delete(modelId);
    renderModels();
    refreshSoon();
  }
}

async function unloadAll() {
  const button = $("#unload-all");
  button.disabled = true;
  try {
    const body = await api("/unload", { method: "POST" });
    const stopped = (body && body.unloaded) || [];
    showNotice(stopped.length ? `Unloaded ${stopped.join(", ")}` : "Nothing was running");
  } catch (error) {
    showNotice(`unload all failed: ${error.message}`, "error");
  } finally {
    button.disabled = false;
    refreshSoon();
  }
}

function renderPeers(peers) {
  $("#peers-section").hidden = peers.length === 0;
  const tbody = $("#peers tbody");
  const rows = peers.map((model) => {
    const row = keyedRow(tbody, model.id, () => {
      const built = element("tr");
      built.dataset.model = model.id;
      const badge = element("span", "badge availability");
      const cell = element("td");
      cell.append(badge);
      const description = element("td", "description");
      const descriptionText = element("div");
      const reason = element("div", "error-text");
      description.append(descriptionText, reason);
      built.append(cell, element("td", "model-id"), element("td"), description);
      built.parts = { badge, descriptionText, reason };
      return built;
    });
    const available = model.available !== false;
    row.parts.badge.dataset.state = available ? "available" : "unavailable";
    setText(row.parts.badge, available ? "available" : "unavailable");
    setText(row.cells[1], model.id);
    setText(row.cells[2], model.peer);
    setText(row.parts.descriptionText, model.description || "");
    setText(row.parts.reason, available ? "" : model.reason || "");
    return row;
  });
  placeRows(tbody, rows);
}

// -- devices and activity (small tables: rebuilt only when their data changes) ---

function renderDevices(devices) {
  const json = JSON.stringify(devices);
  if (json === lastDevicesJson) return;
  lastDevicesJson = json;
  $("#devices-section").hidden = devices.length === 0;
  $("#devices tbody").replaceChildren(
    ...devices.map((device) => {
      const row = element("tr");
      row.dataset.device = device.id;
      // The declared size, else what NVML reads (older routers name it capacity_gib).
      const capacityGiB = device.capacity_gib ?? device.vram_gib ?? device.total_gib;
      const claimed = element("td");
      const capacity = Number(capacityGiB) || 0;
      const share = capacity ? Math.min(1, (Number(device.claimed_gib) || 0) / capacity) : 0;
      const meter = element("span", "meter");
      const fill = element("span", "meter-fill");
      fill.style.width = `${Math.round(share * 100)}%`;
      meter.append(fill);
      claimed.append(meter, element("span", null, formatGiB(device.claimed_gib)));
      const holders = element("td", "chips");
      for (const [model, amount] of Object.entries(device.models || {})) {
        holders.append(element("code", "chip", amount === null ? `${model} · whole device` : `${model} · ${formatGiB(amount)}`));
      }
      row.append(
        element("td", "model-id", device.id),
        element("td", null, device.name || device.nvml_name || ""),
        holders,
        claimed,
        element("td", null, formatGiB(device.used_gib)),
        element("td", null, formatGiB(device.free_gib)),
        element("td", null, formatGiB(capacityGiB)),
      );
      return row;
    }),
  );
}

function ttftCell(entry) {
  // A request that waited for its model says whether a wake (seconds) or a cold start (minutes) it was.
  const cell = element("td", "num", formatNumber(entry.ttft_ms));
  if (entry.waited_for) {
    const badge = element("span", "badge waited", entry.waited_for);
    badge.dataset.state = entry.waited_for === "wake" ? "sleeping" : "starting";
    badge.title = entry.waited_for === "wake" ? "waited for its model to wake" : "waited for its model to start";
    cell.append(" ", badge);
  }
  return cell;
}

function renderActivity(entries) {
  const json = JSON.stringify(entries);
  if (json === lastActivityJson) return;
  lastActivityJson = json;
  setText($("#activity-empty"), "No requests yet.");
  $("#activity-empty").hidden = entries.length > 0;
  $("#activity tbody").replaceChildren(
    ...entries.map((entry) => {
      const row = element("tr");
      row.dataset.model = entry.model || "";
      const status = element("td");
      const statusBadge = element("span", "badge http", entry.status ?? "–");
      statusBadge.dataset.ok = String(Number(entry.status) > 0 && Number(entry.status) < 400);
      status.append(statusBadge);
      row.append(
        element("td", "time", formatTime(entry.time)),
        element("td", "model-id", entry.model),
        element("td", "path", entry.path),
        status,
        element("td", "num", formatNumber(entry.prompt_tokens)),
        element("td", "num", formatNumber(entry.completion_tokens)),
        ttftCell(entry),
        element("td", "num", formatNumber(entry.tokens_per_second, 1)),
        element("td", "num", formatNumber(entry.duration_ms)),
        element("td", "error-text", entry.error || ""),
      );
      return row;
    }),
  );
}

// -- logs (SSE read with fetch, so the API key can travel as a header) ----------

const logSources = new Set();
let scrollQueued = false;

function sourceHue(source) {
  if (source === "router") return 210;
  let hash = 0;
  for (const char of source) hash = (hash * 31 + char.codePointAt(0)) >>> 0;
  return hash % 360;
}

function appendLogLine(line) {
  const pane = $("#log");
  const source = String(line.source ?? "");
  if (!logSources.has(source)) {
    logSources.add(source);
    $("#log-source").append(element("option", null, source));
  }
  const row = element("div", "log-line");
  row.dataset.source = source;
  const tag = element("span", "log-source", source);
  tag.style.setProperty("--hue", sourceHue(source));
  row.append(element("span", "log-time", formatTime(line.time)), tag, element("span", "log-text", line.text));
  const filter = $("#log-source").value;
  row.hidden = Boolean(filter) && filter !== source;
  pane.append(row);
  while (pane.childElementCount > LOG_LINES_KEPT) pane.firstElementChild.remove();
  if ($("#log-follow").checked && !scrollQueued) {
    scrollQueued = true;
    requestAnimationFrame(() => {
      scrollQueued = false;
      pane.scrollTop = pane.scrollHeight;
    });
  }
}

function handleSseEvent(block) {
  const data = block
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5))
    .join("\n");
  if (!data) return;
  try {
    appendLogLine(JSON.parse(data));
  } catch {
    appendLogLine({ time: Date.now() / 1000, source: "?", text: data });
  }
}

async function streamLogs() {
  for (;;) {
    try {
      const response = await fetch("/logs/stream", { headers: AUTH_HEADERS });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      // The stream replays recent lines first: start from an empty pane, or a reconnect doubles them.
      $("#log").replaceChildren();
      setText($("#log-state"), "live");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          handleSseEvent(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
      setText($("#log-state"), "stream ended; reconnecting…");
    } catch (error) {
      setText($("#log-state"), `disconnected (${error.message}); retrying…`);
    }
    await sleep(LOG_RETRY_MS);
  }
}

function applyLogFilter() {
  const filter = $("#log-source").value;
  for (const row of $("#log").children) row.hidden = Boolean(filter) && row.dataset.source !== filter;
}

document.addEventListener("DOMContentLoaded", () => {
  $("#unload-all").addEventListener("click", unloadAll);
  $("#log-source").addEventListener("change", applyLogFilter);
  pollForever();
  streamLogs();
});
