// The router's web page: the header, the hash routes (#/models, #/models/{id},
// #/playground, #/activity, #/logs, #/performance) and the live feed they all read.

import { adoptKeyFromAddress, ApiError, apiKey, getJson, setApiKey, whenUnauthorized } from "./api.js";
import { createActivityView } from "./activity.js";
import { $, setText } from "./dom.js";
import { icon } from "./icons.js";
import { connect, on, state } from "./live.js";
import { createLogsView } from "./logs.js";
import { createModelView } from "./model.js";
import { createModelsView } from "./models.js";
import { createPerformanceView } from "./performance.js";
import { createPlaygroundView } from "./playground.js";

const THEME_STORAGE = "swaplab.theme";

const VIEWS = {
  models: createModelsView,
  model: createModelView,
  playground: createPlaygroundView,
  activity: createActivityView,
  logs: createLogsView,
  performance: createPerformanceView,
};

const ROUTES = [
  [/^\/models\/(.+)$/, "model"],
  [/^\/models\/?$/, "models"],
  [/^\/playground\/?$/, "playground"],
  [/^\/activity\/?$/, "activity"],
  [/^\/logs\/?$/, "logs"],
  [/^\/performance\/?$/, "performance"],
];

const views = new Map();
let active = null;

function route() {
  const path = location.hash.replace(/^#/, "") || "/models";
  for (const [pattern, name] of ROUTES) {
    const match = pattern.exec(path);
    if (match) return show(name, match[1] === undefined ? undefined : decodeURIComponent(match[1]));
  }
  location.replace("#/models");
}

function show(name, parameter) {
  if (!views.has(name)) {
    const view = VIEWS[name]();
    view.root.hidden = true;
    views.set(name, view);
    $("#main").append(view.root);
  }
  const view = views.get(name);
  if (active && active !== view) {
    active.hide();
    active.root.hidden = true;
    window.scrollTo(0, 0);
  }
  view.root.hidden = false;
  active = view;
  view.show(parameter);
  document.title = `${parameter || view.title} · swaplab`;
  const section = name === "model" ? "models" : name;
  for (const link of document.querySelectorAll(".nav a")) {
    if (link.dataset.view === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.body.classList.remove("menu-open");
}

// -- header -------------------------------------------------------------------------

const CONNECTION_LABELS = { connecting: "Connecting", live: "Live", reconnecting: "Reconnecting", unauthorized: "Key needed" };

function renderConnection() {
  const pill = $("#connection");
  pill.dataset.state = state.connection;
  setText($(".connection-label", pill), CONNECTION_LABELS[state.connection] || state.connection);
  pill.title = state.connection === "live" ? "Live updates from /api/events" : "The live feed (/api/events) is not connected";
}

function renderInflightCount() {
  const badge = $("#inflight-count");
  const number = state.inflight.size;
  badge.hidden = number === 0;
  setText(badge, number);
  badge.title = `${number} in flight`;
}

/** The version in the header; false when the router wants a key this page does not have. */
async function showVersion() {
  try {
    const version = await getJson("/api/version");
    const node = $("#version");
    // `version` is the Ollama release Ollama's clients are told; swaplab's own is `swaplab_version`.
    setText(node, `v${version.swaplab_version}${version.commit && version.commit !== "unknown" ? ` · ${version.commit}` : ""}`);
    node.title = version.build_date && version.build_date !== "unknown" ? `built ${version.build_date}` : "";
    return true;
  } catch (error) {
    return !(error instanceof ApiError && error.status === 401); // else the connection pill says what is wrong
  }
}

function currentTheme() {
  return document.documentElement.dataset.theme === "dark" ? "dark" : "light";
}

function setTheme(theme, remember) {
  document.documentElement.dataset.theme = theme;
  if (remember) localStorage.setItem(THEME_STORAGE, theme);
  const button = $("#theme-toggle");
  button.replaceChildren(icon(theme === "dark" ? "sun" : "moon"));
  button.setAttribute("aria-label", theme === "dark" ? "Switch to the light theme" : "Switch to the dark theme");
  button.title = button.getAttribute("aria-label");
  document.dispatchEvent(new Event("themechange"));
}

function setUpTheme() {
  setTheme(currentTheme(), false);
  $("#theme-toggle").addEventListener("click", () => setTheme(currentTheme() === "dark" ? "light" : "dark", true));
  // Follow the system's choice until the toggle makes one.
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", (event) => {
    if (!localStorage.getItem(THEME_STORAGE)) setTheme(event.matches ? "dark" : "light", false);
  });
}

function setUpKeyDialog() {
  const dialog = $("#key-dialog");
  const input = $("#key-input");
  const forget = $("#key-forget");
  const keyButton = $("#key-button");
  keyButton.hidden = !apiKey();
  keyButton.append(icon("key"));
  keyButton.addEventListener("click", () => open());
  const open = () => {
    if (dialog.open) return;
    input.value = "";
    forget.hidden = !apiKey();
    $("#key-reason").hidden = Boolean(apiKey()) && state.connection !== "unauthorized";
    dialog.showModal();
  };
  whenUnauthorized(() => {
    state.connection = "unauthorized";
    renderConnection();
    open();
  });
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!input.value.trim()) return;
    setApiKey(input.value.trim());
    location.reload(); // every view and the feed start again with the key
  });
  forget.addEventListener("click", () => {
    setApiKey("");
    location.reload();
  });
  $("#key-cancel").addEventListener("click", () => dialog.close());
}

function setUpMenu() {
  const button = $("#menu-toggle");
  button.append(icon("menu"));
  button.addEventListener("click", () => {
    const open = document.body.classList.toggle("menu-open");
    button.setAttribute("aria-expanded", String(open));
  });
}

function start() {
  adoptKeyFromAddress();
  setUpTheme();
  setUpKeyDialog();
  setUpMenu();
  on("connection", renderConnection);
  on("inflight", renderInflightCount);
  renderConnection();
  window.addEventListener("hashchange", route);
  route();
  // The feed opens once the router has let us in: an EventSource refused for want of a key
  // would only retry, and fill the console doing so.
  showVersion().then((allowed) => allowed && connect());
}

start();
