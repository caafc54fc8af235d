// ANSI colours in log lines, through ansi_up when it is installed (`make ui-vendor`).
//
// ansi_up escapes the text before it wraps it in colour spans, which is why its output
// (and only its output) is set as HTML. Without it, the escape codes are stripped and the
// line is set as plain text.

import { loadAnsiUp } from "./vendor.js";

// CSI sequences (colours, cursor moves) and OSC strings (titles, links).
const ESCAPES = /\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]/g;

let AnsiUp = null;

/** Resolve once ansi_up is loaded (or known to be missing). */
export async function ansiReady() {
  AnsiUp = await loadAnsiUp();
  return AnsiUp !== null;
}

export function stripAnsi(text) {
  return text.replace(ESCAPES, "");
}

/** A renderer for one stream of lines: `render(node, text)`. Colour state carries from one
line to the next, as in a terminal, so each stream (proxy, upstream, one model) has its own. */
export function ansiRenderer() {
  if (!AnsiUp) return (node, text) => (node.textContent = stripAnsi(text));
  const converter = new AnsiUp();
  converter.use_classes = true; // colours from ui.css, tuned to each theme
  converter.escape_html = true;
  converter.url_allowlist = {}; // no links out of a log line
  return (node, text) => {
    node.innerHTML = converter.ansi_to_html(text);
  };
}
