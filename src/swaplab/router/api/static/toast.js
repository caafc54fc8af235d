// Short messages about what a button did (or why it could not), bottom right.

import { h } from "./dom.js";
import { icon } from "./icons.js";

let stack = null;

export function toast(message, kind = "info") {
  if (!stack) {
    stack = h("div", { class: "toasts", role: "status", "aria-live": "polite" });
    document.body.append(stack);
  }
  const close = h("button", { class: "icon-button", type: "button", "aria-label": "Dismiss" }, icon("close"));
  const note = h("div", { class: "toast", dataset: { kind } }, h("span", {}, message), close);
  const remove = () => note.remove();
  close.addEventListener("click", remove);
  stack.append(note);
  setTimeout(remove, kind === "error" ? 12000 : 5000);
}
