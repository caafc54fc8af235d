// The capture of one proxied request (`/api/captures/{activity row id}`): its request and
// response, headers and bodies, in a dialog. Bodies come base64-encoded; JSON is shown
// indented, server-sent events and other text as they were sent, binary as its size.

import { getJson } from "./api.js";
import { h, setText } from "./dom.js";
import { bytes, ms, rowDate, when } from "./format.js";
import { icon } from "./icons.js";

let dialog = null;

function header(headers, name) {
  const wanted = name.toLowerCase();
  for (const [key, value] of Object.entries(headers || {})) if (key.toLowerCase() === wanted) return value;
  return "";
}

/** A captured body as `{text, note}`: decoded, JSON indented; binary bodies only by size. */
export function describeBody(base64, contentType) {
  if (base64 === null || base64 === undefined) return { text: "", note: "No body captured." };
  const raw = atob(base64);
  const data = Uint8Array.from(raw, (char) => char.charCodeAt(0));
  if (!data.length) return { text: "", note: "Empty body." };
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(data);
  } catch {
    return { text: "", note: `${bytes(data.length)} of binary data (${contentType || "no content type"}), not shown.` };
  }
  const looksJson = /json/i.test(contentType) || /^\s*[[{]/.test(text);
  if (looksJson && !/event-stream/i.test(contentType)) {
    try {
      return { text: JSON.stringify(JSON.parse(text), null, 2), note: `${bytes(data.length)} · JSON` };
    } catch {
      // not JSON after all: shown as it is
    }
  }
  return { text, note: `${bytes(data.length)}${contentType ? ` · ${contentType}` : ""}` };
}

function headersTable(headers) {
  const entries = Object.entries(headers || {});
  if (!entries.length) return h("p", { class: "muted small" }, "No headers captured.");
  return h("dl", { class: "headers" }, entries.map(([key, value]) => [h("dt", {}, key), h("dd", {}, String(value))]));
}

function bodyBlock(base64, headers) {
  const body = describeBody(base64, header(headers, "Content-Type"));
  const copy = h("button", { type: "button", class: "button button-small", hidden: !body.text || !navigator.clipboard }, icon("copy"), h("span", {}, "Copy"));
  copy.addEventListener("click", () => navigator.clipboard.writeText(body.text).then(() => setText(copy.lastElementChild, "Copied")));
  return h(
    "div",
    { class: "capture-body" },
    h("div", { class: "capture-body-head" }, h("span", { class: "muted small" }, body.note), copy),
    body.text ? h("pre", { class: "code" }, body.text) : null,
  );
}

function part(headers, base64) {
  return h("section", { class: "capture-part" }, h("h3", { class: "capture-title" }, "Headers"), headersTable(headers), h("h3", { class: "capture-title" }, "Body"), bodyBlock(base64, headers));
}

function ensureDialog() {
  if (dialog) return dialog;
  const title = h("h2", { class: "dialog-title" });
  const summary = h("p", { class: "muted small dialog-summary" });
  const close = h("button", { type: "button", class: "icon-button", "aria-label": "Close" }, icon("close"));
  const content = h("div", { class: "dialog-content" });
  dialog = h("dialog", { class: "dialog dialog-wide", id: "capture", "aria-labelledby": "capture-title" }, h("header", { class: "dialog-head" }, h("div", {}, title, summary), close), content);
  title.id = "capture-title";
  dialog.parts = { title, summary, content };
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("click", (event) => {
    if (event.target === dialog) dialog.close(); // a click on the backdrop
  });
  document.body.append(dialog);
  return dialog;
}

function tabs(panels) {
  const list = h("div", { class: "tabs", role: "tablist" });
  const bodies = panels.map(([label, node], index) => {
    const tab = h("button", { type: "button", class: "tab", role: "tab", "aria-selected": String(index === 0) }, label);
    node.hidden = index !== 0;
    tab.addEventListener("click", () => {
      for (const other of list.children) other.setAttribute("aria-selected", String(other === tab));
      panels.forEach(([, panel]) => (panel.hidden = panel !== node));
    });
    list.append(tab);
    return node;
  });
  return [list, ...bodies];
}

/** Open the capture of activity row `row` (which has `has_capture`). */
export async function openCapture(row) {
  const { title, summary, content } = ensureDialog().parts;
  setText(title, `${row.req_path} · #${row.id}`);
  setText(summary, [row.model, `HTTP ${row.resp_status_code}`, ms(row.duration_ms), when(rowDate(row))].join(" · "));
  content.replaceChildren(h("p", { class: "muted" }, "Loading the capture…"));
  if (!dialog.open) dialog.showModal();
  try {
    const capture = await getJson(`/api/captures/${row.id}`);
    const request = part(capture.req_headers, capture.req_body);
    const response = part(capture.resp_headers, capture.resp_body);
    content.replaceChildren(...tabs([[`Request${capture.req_method ? ` · ${capture.req_method}` : ""}`, request], [`Response${capture.resp_status ? ` · ${capture.resp_status}` : ""}`, response]]));
  } catch (error) {
    content.replaceChildren(h("p", { class: "error-text" }, `The capture could not be read: ${error.message}`));
  }
}
