// The two vendored libraries (`make ui-vendor`): uPlot and ansi_up. The router says which
// are present (`/ui/static/vendor.json`), so a missing one is never requested: the page
// runs without it, and says what to run.

export const CHARTS_MISSING = "charting library not installed: run make ui-vendor";

const BASE = "/ui/static/vendor/";
let present = null;
let uplot = null;
let ansiUp = null;

function vendored() {
  present ??= fetch("/ui/static/vendor.json")
    .then((response) => (response.ok ? response.json() : { files: [] }))
    .then((manifest) => new Set(manifest.files || []))
    .catch(() => new Set());
  return present;
}

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = src;
    script.onload = resolve;
    script.onerror = reject;
    document.head.append(script);
  });
}

/** uPlot's constructor, or null when it is not installed. */
export function loadUPlot() {
  uplot ??= (async () => {
    const files = await vendored();
    if (!files.has("uPlot.iife.min.js")) return null;
    if (files.has("uPlot.min.css")) {
      const link = document.createElement("link");
      link.rel = "stylesheet";
      link.href = `${BASE}uPlot.min.css`;
      document.head.prepend(link); // before ui.css, which adjusts it
    }
    await loadScript(`${BASE}uPlot.iife.min.js`);
    return window.uPlot || null;
  })().catch(() => null);
  return uplot;
}

/** ansi_up's `AnsiUp` class (an ES module), or null when it is not installed. */
export function loadAnsiUp() {
  ansiUp ??= (async () => {
    const files = await vendored();
    if (!files.has("ansi_up.js")) return null;
    const module = await import(`${BASE}ansi_up.js`);
    return module.AnsiUp || null;
  })().catch(() => null);
  return ansiUp;
}
