// A live log pane: ANSI colours, a filter, follow (keep the newest line in view) and pause.
// The Logs view feeds it the router's and the models' lines from the live feed; a model's
// page feeds it that model's own stream.

import { ansiReady, ansiRenderer, stripAnsi } from "./ansi.js";
import { h, setText } from "./dom.js";
import { icon } from "./icons.js";

const LINES_SHOWN = 3000;

/** A steady colour per tag: the router blue, each model its own. */
function hue(tag) {
  if (tag === "router") return 215;
  let hash = 0;
  for (const char of tag) hash = (hash * 31 + char.codePointAt(0)) >>> 0;
  return hash % 360;
}

function toggle(label, iconName, pressed) {
  return h("button", { type: "button", class: "button button-small toggle", "aria-pressed": String(pressed) }, icon(iconName), h("span", {}, label));
}

/** `showSource`: tag each line with where it came from (the Logs view mixes two). */
export function createLogPane({ showSource = false, label = "Log", extraTools = [] } = {}) {
  const filter = h("input", { type: "search", class: "input input-small log-filter", placeholder: "Filter lines", "aria-label": "Filter log lines" });
  const follow = toggle("Follow", "follow", true);
  const pause = toggle("Pause", "pause", false);
  const clear = h("button", { type: "button", class: "button button-small", "aria-label": "Clear the pane" }, icon("clear"), h("span", {}, "Clear"));
  const status = h("span", { class: "log-status muted" });
  const lines = h("div", { class: "log", role: "log", "aria-label": label, tabindex: "0" });
  const placeholder = h("p", { class: "log-empty" }, "No log lines yet.");
  const root = h(
    "div",
    { class: "log-pane" },
    h("div", { class: "toolbar" }, ...extraTools, filter, h("span", { class: "toolbar-gap" }), status, follow, pause, clear),
    h("div", { class: "log-box" }, lines, placeholder),
  );

  const renderers = new Map();
  let queue = [];
  let held = 0; // lines that arrived while paused
  let scheduled = false;
  let ready = false;
  let needle = "";

  ansiReady().then(() => {
    ready = true;
    schedule();
  });

  const isOn = (button) => button.getAttribute("aria-pressed") === "true";
  const setOn = (button, on) => button.setAttribute("aria-pressed", String(on));

  function renderer(source) {
    if (!renderers.has(source)) renderers.set(source, ansiRenderer());
    return renderers.get(source);
  }

  function lineNode(line) {
    const tag = line.tag ?? line.source;
    const text = h("span", { class: "log-text" });
    renderer(tag)(text, line.text);
    let label = null;
    if (showSource) {
      label = h("span", { class: "log-source" }, tag);
      label.style.setProperty("--hue", hue(tag));
    }
    const node = h("div", { class: "log-line", dataset: { source: line.source } }, label, text);
    node.plain = stripAnsi(line.text).toLowerCase();
    node.hidden = Boolean(needle) && !node.plain.includes(needle);
    return node;
  }

  function schedule() {
    if (scheduled || !ready || isOn(pause)) return;
    scheduled = true;
    requestAnimationFrame(flush);
  }

  function flush() {
    scheduled = false;
    if (!queue.length) return;
    const batch = queue.slice(-LINES_SHOWN);
    queue = [];
    held = 0;
    setText(status, "");
    const fragment = document.createDocumentFragment();
    for (const line of batch) fragment.append(lineNode(line));
    lines.append(fragment);
    while (lines.childElementCount > LINES_SHOWN) lines.firstElementChild.remove();
    placeholder.hidden = lines.childElementCount > 0;
    if (isOn(follow)) lines.scrollTop = lines.scrollHeight;
  }

  function applyFilter() {
    needle = filter.value.trim().toLowerCase();
    for (const node of lines.children) node.hidden = Boolean(needle) && !node.plain.includes(needle);
  }

  filter.addEventListener("input", applyFilter);
  follow.addEventListener("click", () => {
    setOn(follow, !isOn(follow));
    if (isOn(follow)) lines.scrollTop = lines.scrollHeight;
  });
  pause.addEventListener("click", () => {
    setOn(pause, !isOn(pause));
    setText(pause.lastElementChild, isOn(pause) ? "Resume" : "Pause");
    pause.replaceChild(icon(isOn(pause) ? "play" : "pause"), pause.firstElementChild);
    if (!isOn(pause)) schedule();
  });
  clear.addEventListener("click", () => {
    lines.replaceChildren();
    queue = [];
    held = 0;
    setText(status, "");
    placeholder.hidden = false;
  });
  // Scrolling up to read stops following; scrolling back to the end follows again.
  lines.addEventListener("scroll", () => {
    const atEnd = lines.scrollHeight - lines.scrollTop - lines.clientHeight < 24;
    if (atEnd !== isOn(follow)) setOn(follow, atEnd);
  });

  return {
    root,
    /** New lines, each `{source, text}` (and a `tag` to show instead of the source). */
    append(batch) {
      if (!batch.length) return;
      queue.push(...batch);
      if (isOn(pause)) {
        held += batch.length;
        setText(status, `${held} new ${held === 1 ? "line" : "lines"}`);
      }
      schedule();
    },
    /** Start over with these lines (a reconnect's history, another model). */
    reset(batch = []) {
      lines.replaceChildren();
      renderers.clear();
      queue = [...batch];
      held = 0;
      setText(status, "");
      placeholder.hidden = batch.length > 0;
      schedule();
    },
    setStatus(text) {
      setText(status, text);
    },
  };
}
