// #/models/{id}: one model: its state and actions, its facts, its config entry as written,
// its live log (`/logs/stream/{id}`, history first) and its own activity.

import { modelPath, send } from "./api.js";
import { createActivityTable } from "./activity.js";
import { h, setText } from "./dom.js";
import { duration, gib } from "./format.js";
import { icon } from "./icons.js";
import { createLogPane } from "./logpane.js";
import { on, reconnectDelay, state } from "./live.js";
import { findModel, modelActions, modelChips, modelFacts, modelProblem, progressBar, setState, stateBadge } from "./modelparts.js";

/** Read the model's plain-text log stream into `pane` until `signal` aborts; reconnect when it drops. */
async function streamLog(id, pane, signal) {
  const prefix = `[${id}] `;
  for (let attempt = 0; !signal.aborted; attempt += 1) {
    try {
      const response = await send(`/logs/stream/${modelPath(id)}`, { signal });
      pane.reset(); // the stream starts with the history: a reconnect must not show it twice
      pane.setStatus("");
      attempt = 0;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let partial = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const pieces = (partial + value).split("\n");
        partial = pieces.pop();
        pane.append(pieces.map((text) => ({ source: id, text: text.startsWith(prefix) ? text.slice(prefix.length) : text })));
      }
    } catch (error) {
      if (signal.aborted) return;
      pane.setStatus(`log stream: ${error.message}`);
    }
    if (signal.aborted) return;
    await new Promise((resolve) => setTimeout(resolve, reconnectDelay(attempt)));
  }
}

/** The entry as written, without the indentation it had under `models:`. */
export function dedent(text) {
  const lines = text.replace(/\s+$/, "").split("\n");
  const indents = lines.filter((line) => line.trim()).map((line) => line.match(/^ */)[0].length);
  const common = indents.length ? Math.min(...indents) : 0;
  return lines.map((line) => line.slice(common)).join("\n");
}

function fact(label, value) {
  if (value === null || value === undefined || value === "" || (Array.isArray(value) && !value.length)) return null;
  return [h("dt", {}, label), h("dd", {}, value)];
}

function factList(model) {
  const sleep = model.sleep;
  return h(
    "dl",
    { class: "facts" },
    fact("Name", model.name),
    fact("Description", model.description),
    fact("Process", [model.pid ? `pid ${model.pid}` : "", model.proxy || ""].filter(Boolean).join(" · ")),
    fact("Started in", model.startSeconds != null && model.state !== "stopped" ? duration(model.startSeconds) : ""),
    fact("Stops when idle", model.ttl ? `after ${model.ttl} s` : ""),
    fact("Sleep", sleep ? [`${sleep.engine}${sleep.engine === "vllm" ? ` level ${sleep.level}` : ""}`, `${sleep.sleeps} sleeps, ${sleep.wakes} wakes`, sleep.host_gib != null ? `${gib(sleep.host_gib)} RAM asleep` : ""].filter(Boolean).join(" · ") : ""),
    fact("Config hash", model.configHash ? h("code", {}, model.configHash) : ""),
  );
}

export function createModelView() {
  const back = h("a", { class: "back-link", href: "#/models" }, icon("back"), h("span", {}, "Models"));
  const title = h("h1", { class: "view-title model-id" });
  const badge = stateBadge("stopped");
  const subtitle = h("p", { class: "view-subtitle" });
  const tools = h("div", { class: "view-tools" });
  const chips = h("div", { class: "chips" });
  const problem = h("p", { class: "model-problem" });
  const progress = h("div", { class: "model-progress" });
  const facts = h("div", {});
  const entry = h("pre", { class: "code config-entry" });
  const logSlot = h("div", {});
  const activitySlot = h("div", {});
  const missing = h("p", { class: "empty", hidden: true });
  const content = h(
    "div",
    { class: "model-detail" },
    h(
      "div",
      { class: "detail-grid" },
      h("section", { class: "section" }, h("h2", { class: "section-title" }, "Overview"), h("div", { class: "panel panel-padded" }, chips, problem, progress, facts)),
      h("section", { class: "section" }, h("h2", { class: "section-title" }, "Config entry"), entry),
    ),
    h("section", { class: "section" }, h("h2", { class: "section-title" }, "Log"), logSlot),
    h("section", { class: "section" }, h("h2", { class: "section-title" }, "Activity"), activitySlot),
  );
  const root = h(
    "section",
    { class: "view view-model" },
    back,
    h("header", { class: "view-head" }, h("div", {}, h("div", { class: "model-heading" }, title, badge), subtitle), tools),
    missing,
    content,
  );

  let current = null; // {id, actions, activity, pane, abort}

  function render() {
    if (!current) return;
    const model = findModel(current.id);
    const known = Boolean(model);
    missing.hidden = known || state.models.length === 0;
    setText(missing, `No local model is named ${current.id}.`);
    content.hidden = !known;
    tools.hidden = !known;
    if (!model) return;
    root.dataset.model = model.id;
    setState(badge, model.state);
    setText(subtitle, modelFacts(model).map((entry) => entry.text).join(" · "));
    chips.replaceChildren(...modelChips(model));
    const trouble = modelProblem(model);
    problem.hidden = !trouble;
    problem.dataset.kind = trouble ? trouble.kind : "";
    setText(problem, trouble ? trouble.text : "");
    progress.replaceChildren(progressBar(model));
    const next = factList(model);
    if (facts.firstElementChild?.textContent !== next.textContent) facts.replaceChildren(next);
    setText(entry, model.entry ? dedent(model.entry) : "(no entry text)");
    current.actions.update(model);
  }

  function open(id) {
    close();
    const actions = modelActions(id);
    const pane = createLogPane({ label: `${id} log` });
    const activity = createActivityTable({ model: id });
    const abort = new AbortController();
    current = { id, actions, activity, pane, abort };
    setText(title, id);
    tools.replaceChildren(actions.root);
    logSlot.replaceChildren(pane.root);
    activitySlot.replaceChildren(activity.root);
    streamLog(id, pane, abort.signal);
    activity.show();
    render();
  }

  function close() {
    if (!current) return;
    current.abort.abort();
    current.actions.dispose();
    current.activity.dispose();
    current = null;
  }

  on("models", render);
  on("inflight", render);

  return {
    root,
    title: "Model",
    show(id) {
      if (!current || current.id !== id) open(id);
      else {
        current.activity.show();
        render();
      }
    },
    hide: close,
  };
}
