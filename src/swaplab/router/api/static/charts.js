// Charts through uPlot (`make ui-vendor`): histograms of the activity and the performance
// view's time series. Without uPlot each chart is a sentence saying how to install it.
//
// A chart is built when its data and its width are known (a hidden view has no width
// yet), resized with its box, and rebuilt when the theme changes its colours.

import { h } from "./dom.js";
import { CHARTS_MISSING, loadUPlot } from "./vendor.js";

function colours() {
  const style = getComputedStyle(document.documentElement);
  const read = (name) => style.getPropertyValue(name).trim();
  return {
    axis: read("--chart-axis"),
    grid: read("--chart-grid"),
    series: [1, 2, 3, 4, 5, 6].map((index) => read(`--chart-${index}`)),
  };
}

/** Ticks a few seconds apart name the second; minutes apart, the minute. */
function timeTicks(plot, splits) {
  const step = splits.length > 1 ? splits[1] - splits[0] : 60;
  const options = step < 60 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
  return splits.map((value) => new Date(value * 1000).toLocaleTimeString([], { ...options, hour12: false }));
}

/** uPlot's tick labels from a formatter of one value. */
const each = (format) => (format ? (plot, splits) => splits.map(format) : undefined);

function axis(palette, values) {
  return {
    stroke: palette.axis,
    grid: { stroke: palette.grid, width: 1 },
    ticks: { stroke: palette.grid, width: 1, size: 4 },
    font: "11px system-ui, sans-serif",
    values,
  };
}

/** A chart box; `set(data)` gives it uPlot's data (`[xs, ys1, ys2, ...]`). */
function chartBox(options, height) {
  const root = h("div", { class: "chart" });
  root.style.minHeight = `${height}px`;
  let uPlot = null;
  let plot = null;
  let data = null;

  const size = () => ({ width: Math.max(root.clientWidth, 160), height });
  const build = () => {
    if (!uPlot || !data || root.clientWidth === 0 || plot) return;
    plot = new uPlot({ ...options(colours(), uPlot), ...size() }, data, root);
  };
  const rebuild = () => {
    if (plot) plot.destroy();
    plot = null;
    build();
  };

  new ResizeObserver(() => (plot ? plot.setSize(size()) : build())).observe(root);
  document.addEventListener("themechange", rebuild);
  loadUPlot().then((constructor) => {
    uPlot = constructor;
    if (!uPlot) root.replaceChildren(h("p", { class: "chart-missing" }, CHARTS_MISSING));
    else build();
  });

  return {
    root,
    set(next) {
      const shapeChanged = !data || data.length !== next.length;
      data = next;
      if (plot && !shapeChanged) plot.setData(next);
      else rebuild();
    },
  };
}

/** A histogram of llama-swap's shape `{bins, min, max, binSize, p50, p95, p99}`; null shows no bars. */
export function histogramChart({ label, format, height = 150 }) {
  let range = [0, 1];
  const box = chartBox(
    (palette, uPlot) => ({
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      padding: [8, 8, 0, 0],
      scales: { x: { time: false, range: () => range }, y: { range: (plot, low, high) => [0, Math.max(1, high * 1.15)] } },
      axes: [axis(palette, each(format)), { ...axis(palette, each((value) => (Number.isInteger(value) ? String(value) : ""))), size: 36 }],
      series: [
        {},
        {
          label,
          stroke: palette.series[0],
          fill: `${palette.series[0]}55`,
          width: 1,
          points: { show: false },
          paths: uPlot.paths.bars({ size: [0.86, 80], align: 0 }),
        },
      ],
    }),
    height,
  );
  const none = h("div", { class: "chart-empty", hidden: true }, "No data yet");
  none.style.height = `${height}px`;
  return {
    root: h("div", {}, none, box.root),
    set(histogram) {
      const empty = !histogram || !histogram.bins || !histogram.bins.length;
      none.hidden = !empty;
      box.root.hidden = empty;
      if (empty) return;
      const { bins, min, binSize } = histogram;
      if (!binSize) {
        // every value the same: one bar, centred
        const spread = Math.max(Math.abs(min) * 0.1, 1);
        range = [min - spread, min + spread];
        box.set([[min], [bins[0]]]);
        return;
      }
      range = [min, min + binSize * bins.length];
      box.set([bins.map((_, index) => min + binSize * (index + 0.5)), bins]);
    },
  };
}

/** A minute at least, ending at the newest sample, so the first samples do not fill the width. */
function atLeastAMinute(plot) {
  // From the data itself: uPlot widens a single point's range by days before asking.
  const times = plot.data[0] || [];
  const now = Date.now() / 1000;
  if (!times.length) return [now - 60, now];
  const first = times[0];
  const last = times[times.length - 1];
  return last - first < 60 ? [last - 60, last] : [first, last];
}

/** Dots while there are too few samples for a line to show. */
function fewPoints(plot) {
  return plot.data[0].length < 3;
}

/** Lines over time: `series` is `[{label}]`; `set([unixSeconds[], values1[], ...])`. */
export function timeChart({ series, format, range, height = 180 }) {
  const box = chartBox(
    (palette) => ({
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } },
      padding: [8, 8, 0, 0],
      scales: { x: { time: true, range: atLeastAMinute }, y: range ? { range } : { range: (plot, low, high) => [0, Math.max(high * 1.1, 1)] } },
      axes: [axis(palette, timeTicks), { ...axis(palette, each(format)), size: 56 }],
      series: [
        { label: "", value: (plot, value) => (value == null ? "" : new Date(value * 1000).toLocaleTimeString([], { hour12: false })) },
        ...series.map((entry, index) => {
          const colour = palette.series[index % palette.series.length];
          return {
            label: entry.label,
            stroke: colour,
            width: 1.5,
            fill: series.length === 1 ? `${colour}22` : undefined,
            points: { show: fewPoints },
            value: (plot, value) => (value == null ? "" : format ? format(value) : String(value)),
          };
        }),
      ],
    }),
    height,
  );
  return box;
}
