// The live state every view reads, fed by `/api/events` (llama-swap's feed, never polled).
//
// The feed's messages: modelStatus (every model's state), logData (proxy and upstream log
// text), activity (a new row's id), inflight (requests on their way), uiConfig and
// profileChanged. A modelStatus also refetches `/running` and `/api/models` once (the
// devices' memory, a crash loop's last error, a model's config entry), so what the feed
// does not carry is fresh exactly when something changed.

import { apiKey, authHeaders, ApiError, getJson, unauthorized } from "./api.js";
import { readEvents } from "./sse.js";

const LOG_LINES_KEPT = 5000;
const RECONNECT_MS = [1000, 2000, 4000, 5000]; // llama-swap's page backs off the same way

/** How long to wait before reconnecting a stream, after `attempt` failures in a row. */
export function reconnectDelay(attempt) {
  return RECONNECT_MS[Math.min(attempt, RECONNECT_MS.length - 1)];
}

export const state = {
  connection: "connecting", // connecting | live | reconnecting | unauthorized
  models: [], // modelStatus entries of local models, sorted by id
  peers: [], // modelStatus entries of peers' models
  running: { running: [], devices: [], peers: [] }, // GET /running
  catalog: new Map(), // GET /api/models, by id: entry text, capabilities, sleep, config_hash
  profile: null,
  inflight: new Map(), // id -> entry, with `receivedAt` (performance.now()) for the ticking elapsed time
  logs: [], // {seq, source, text}, oldest first, both sources
};

const listeners = new Map();

/** `on("models", fn)`: fn runs on each change of that kind; returns the unsubscribe function. */
export function on(type, callback) {
  if (!listeners.has(type)) listeners.set(type, new Set());
  listeners.get(type).add(callback);
  return () => listeners.get(type).delete(callback);
}

function emit(type, detail) {
  for (const callback of listeners.get(type) || []) {
    try {
      callback(detail);
    } catch (error) {
      console.error(error); // one broken view must not stop the others hearing the feed
    }
  }
}

function setConnection(connection) {
  if (state.connection === connection) return;
  state.connection = connection;
  emit("connection", connection);
}

// -- the feed ---------------------------------------------------------------------

let attempt = 0;
let historyExpected = new Set();

export function connect() {
  historyExpected = new Set(["proxy", "upstream"]);
  if (!apiKey() && typeof EventSource === "function") {
    const source = new EventSource("/api/events");
    source.onopen = opened;
    source.onmessage = (message) => receive(message.data);
    source.onerror = () => {
      source.close();
      dropped();
    };
  } else {
    streamWithKey();
  }
}

/** The feed with the key as a header: fetch and read the events ourselves. */
async function streamWithKey() {
  try {
    const response = await fetch("/api/events", { credentials: "omit", headers: authHeaders({ Accept: "text/event-stream" }) });
    if (response.status === 401) {
      setConnection("unauthorized");
      unauthorized();
      return; // the key dialog reloads the page with a new key
    }
    if (!response.ok) throw new Error(`${response.status}`);
    opened();
    for await (const event of readEvents(response.body)) receive(event.data);
  } catch {
    // a dropped connection; reconnect below
  }
  dropped();
}

function opened() {
  attempt = 0;
  setConnection("live");
  refreshDetails();
  // Rows written before the feed was up (the page still loading, or the feed down) were
  // never announced: whoever shows rows reloads.
  emit("activity", { resync: true });
}

function dropped() {
  setConnection("reconnecting");
  setTimeout(connect, reconnectDelay(attempt));
  attempt += 1;
}

function receive(text) {
  let type;
  let payload;
  try {
    const envelope = JSON.parse(text);
    type = envelope.type;
    payload = JSON.parse(envelope.data); // llama-swap encodes the payload twice
  } catch {
    return;
  }
  switch (type) {
    case "modelStatus":
      state.models = payload.filter((model) => !model.peerID);
      state.peers = payload.filter((model) => model.peerID);
      emit("models");
      refreshDetails();
      break;
    case "logData":
      addLog(payload.source, payload.data || "");
      break;
    case "activity":
      emit("activity", payload);
      break;
    case "inflight":
      applyInflight(payload);
      emit("inflight");
      break;
    case "profileChanged":
      state.profile = payload.active ?? null;
      emit("profile");
      break;
    default:
      break; // uiConfig, and whatever a newer router adds
  }
}

// -- what the feed does not carry: /running and /api/models, refetched on change ----

let detailsRunning = false;
let detailsAgain = false;

export async function refreshDetails() {
  if (detailsRunning) {
    detailsAgain = true;
    return;
  }
  detailsRunning = true;
  try {
    const [running, catalog] = await Promise.all([getJson("/running"), getJson("/api/models")]);
    state.running = { running: running.running || [], devices: running.devices || [], peers: running.peers || [] };
    state.catalog = new Map((catalog.models || []).map((model) => [model.id, model]));
    emit("models");
  } catch (error) {
    if (!(error instanceof ApiError)) setConnection("reconnecting");
  } finally {
    detailsRunning = false;
    if (detailsAgain) {
      detailsAgain = false;
      refreshDetails();
    }
  }
}

// -- in-flight requests -------------------------------------------------------------

function applyInflight(message) {
  const now = performance.now();
  const put = (entry) => state.inflight.set(entry.id, { ...entry, receivedAt: now });
  if (message.operation === "snapshot") {
    state.inflight.clear();
    (message.requests || []).forEach(put);
  } else if (message.operation === "upsert" && message.request) {
    put(message.request);
  } else if (message.operation === "remove") {
    state.inflight.delete(message.id);
  }
}

/** Requests on their way to each model (queued ones included), counted from the live feed. */
export function inflightByModel() {
  const counts = new Map();
  for (const entry of state.inflight.values()) counts.set(entry.model, (counts.get(entry.model) || 0) + 1);
  return counts;
}

// -- logs ---------------------------------------------------------------------------

let logSeq = 0;
const partial = { proxy: "", upstream: "" };

/** Log text arrives in chunks that need not end at a line's end: keep the tail for the next one.
On each (re)connect the first chunk per source is its history: the buffer starts over then,
so a reconnect never shows a line twice. */
function addLog(source, text) {
  let reset = false;
  if (historyExpected.has(source)) {
    if (historyExpected.size === 2) {
      state.logs = [];
      partial.proxy = "";
      partial.upstream = "";
      reset = true;
    }
    historyExpected.delete(source);
  }
  const pieces = (partial[source] + text).split("\n");
  partial[source] = pieces.pop();
  const lines = pieces.map((line) => ({ seq: ++logSeq, source, text: line.replace(/\r$/, "") }));
  state.logs.push(...lines);
  if (state.logs.length > LOG_LINES_KEPT) state.logs.splice(0, state.logs.length - LOG_LINES_KEPT);
  if (reset || lines.length) emit("logs", { reset, lines });
}
