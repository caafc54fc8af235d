// The page's few icons: 24-unit line drawings, stroked in the current text colour.

import { svg } from "./dom.js";

const SHAPES = {
  sun: [["circle", { cx: 12, cy: 12, r: 4 }], ["path", { d: "M12 2v2M12 20v2M4.9 4.9l1.4 1.4M17.7 17.7l1.4 1.4M2 12h2M20 12h2M4.9 19.1l1.4-1.4M17.7 6.3l1.4-1.4" }]],
  moon: [["path", { d: "M20.5 14.5A8.5 8.5 0 0 1 9.5 3.5a8.5 8.5 0 1 0 11 11z" }]],
  menu: [["path", { d: "M4 7h16M4 12h16M4 17h16" }]],
  key: [["circle", { cx: 8, cy: 15, r: 4 }], ["path", { d: "M11 12l9-9M16 7l3 3M14 9l2 2" }]],
  close: [["path", { d: "M6 6l12 12M18 6L6 18" }]],
  stop: [["rect", { x: 6, y: 6, width: 12, height: 12, rx: 2 }]],
  send: [["path", { d: "M12 19V5M6 11l6-6 6 6" }]],
  download: [["path", { d: "M12 4v11M7 10l5 5 5-5M5 20h14" }]],
  pause: [["path", { d: "M9 5v14M15 5v14" }]],
  play: [["path", { d: "M7 5l12 7-12 7z" }]],
  follow: [["path", { d: "M7 7l5 5 5-5M7 13l5 5 5-5" }]],
  clear: [["path", { d: "M4 7h16M9 7V4h6v3M6 7l1 13h10l1-13" }]],
  back: [["path", { d: "M15 18l-6-6 6-6" }]],
  copy: [["rect", { x: 9, y: 9, width: 11, height: 11, rx: 2 }], ["path", { d: "M5 15V5a1 1 0 0 1 1-1h9" }]],
};

/** `icon("sun")`: an inline SVG, decorative (the button around it carries the label). */
export function icon(name) {
  return svg(
    "svg",
    {
      class: "icon",
      viewBox: "0 0 24 24",
      width: 16,
      height: 16,
      fill: "none",
      stroke: "currentColor",
      "stroke-width": 1.75,
      "stroke-linecap": "round",
      "stroke-linejoin": "round",
      "aria-hidden": "true",
    },
    SHAPES[name].map(([tag, props]) => svg(tag, props)),
  );
}
