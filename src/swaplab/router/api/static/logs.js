// #/logs: the router's own log (llama-swap's `proxy`) and the models' output (`upstream`),
// live from the feed's logData messages, kept since the page opened.

import { h } from "./dom.js";
import { createLogPane } from "./logpane.js";
import { on, state } from "./live.js";

const SOURCES = [
  ["", "All"],
  ["proxy", "Router"],
  ["upstream", "Models"],
];

export function createLogsView() {
  const segmented = h("div", { class: "segmented", role: "radiogroup", "aria-label": "Source" });
  let source = "";
  for (const [value, label] of SOURCES) {
    const button = h("button", { type: "button", role: "radio", "aria-checked": String(value === source), dataset: { source: value } }, label);
    button.addEventListener("click", () => {
      source = value;
      for (const other of segmented.children) other.setAttribute("aria-checked", String(other === button));
      pane.reset(wanted(state.logs));
    });
    segmented.append(button);
  }
  const pane = createLogPane({ showSource: true, label: "Router and model logs", extraTools: [segmented] });
  const root = h(
    "section",
    { class: "view view-logs" },
    h("header", { class: "view-head" }, h("div", {}, h("h1", { class: "view-title" }, "Logs"), h("p", { class: "view-subtitle" }, "The router's own lines and every model's output, live."))),
    h("section", { class: "section" }, pane.root),
  );

  // A model's line arrives as `[model] text`: the model becomes the line's tag.
  const tagged = (line) => {
    if (line.source !== "upstream") return { ...line, tag: "router" };
    const match = /^\[([^\]]+)\] ?(.*)$/s.exec(line.text);
    return match ? { ...line, tag: match[1], text: match[2] } : { ...line, tag: "model" };
  };
  const wanted = (lines) => (source ? lines.filter((line) => line.source === source) : lines).map(tagged);
  on("logs", ({ reset, lines }) => (reset ? pane.reset(wanted(state.logs)) : pane.append(wanted(lines))));
  pane.reset(wanted(state.logs));

  return { root, title: "Logs", show() {}, hide() {} };
}
