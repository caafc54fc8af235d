// Requests on their way, live from the feed's `inflight` messages, each with a Cancel
// button (`POST /api/inflight/{id}/cancel`: the upstream is closed, as if the client left).

import { postJson } from "./api.js";
import { empty, h, reconcile, setText } from "./dom.js";
import { bytes, duration } from "./format.js";
import { on, state } from "./live.js";
import { toast } from "./toast.js";

const TICK_MS = 200;

function elapsedSeconds(entry) {
  return ((entry.elapsed_ms || 0) + (performance.now() - entry.receivedAt)) / 1000;
}

function cell(label, className = "") {
  return h("td", { class: className, dataset: { label } });
}

function row(entry) {
  const cancel = h("button", { type: "button", class: "button button-small button-danger" }, "Cancel");
  const node = h(
    "tr",
    {},
    cell("ID", "num muted"),
    cell("Model", "model-id wide"),
    cell("Request", "mono wide"),
    cell("Client", "muted"),
    cell("Stage"),
    cell("Elapsed", "num"),
    cell("Received", "num"),
    h("td", { class: "cell-actions" }, cancel),
  );
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    setText(cancel, "Cancelling…");
    try {
      await postJson(`/api/inflight/${encodeURIComponent(node.dataset.id)}/cancel`);
    } catch (error) {
      toast(`Cancel: ${error.message}`, "error");
      cancel.disabled = false;
      setText(cancel, "Cancel");
    }
  });
  return node;
}

function update(node, entry) {
  node.dataset.id = entry.id;
  node.dataset.model = entry.model;
  const cells = node.children;
  setText(cells[0], entry.id);
  setText(cells[1], entry.model);
  setText(cells[2], `${entry.method} ${entry.req_path}`);
  setText(cells[3], entry.remote_ip || "");
  const answering = entry.resp_headers && Object.keys(entry.resp_headers).length > 0;
  setText(cells[4], answering ? "answering" : "waiting");
  cells[4].dataset.stage = answering ? "answering" : "waiting";
  setText(cells[5], duration(elapsedSeconds(entry)));
  setText(cells[6], bytes(entry.resp_bytes || 0));
}

export function createInflightTable() {
  const body = h("tbody");
  const table = h(
    "table",
    { class: "table table-stack", id: "inflight" },
    h("thead", {}, h("tr", {}, ["ID", "Model", "Request", "Client", "Stage", "Elapsed", "Received", ""].map((label, index) => h("th", { class: [0, 5, 6].includes(index) ? "num" : "" }, label)))),
    body,
  );
  const none = empty("Nothing in flight.");
  const root = h("div", { class: "panel" }, h("div", { class: "table-scroll" }, table), none);
  let ticker = null;
  let visible = false;

  function render() {
    const entries = [...state.inflight.values()].sort((a, b) => Number(a.id) - Number(b.id));
    reconcile(body, entries, (entry) => entry.id, row, update);
    table.hidden = entries.length === 0;
    none.hidden = entries.length > 0;
    // Tick only while something is on its way and someone looks.
    if (entries.length && visible && !ticker) ticker = setInterval(render, TICK_MS);
    if ((!entries.length || !visible) && ticker) {
      clearInterval(ticker);
      ticker = null;
    }
  }

  on("inflight", render);
  return {
    root,
    show() {
      visible = true;
      render();
    },
    hide() {
      visible = false;
      render();
    },
  };
}
