// #/performance: the host's CPU and memory and each GPU's use over the last hour
// (`/api/performance`, then only the newer samples with `?after=`), and the hardware as
// detected once (`/api/hardware`).

import { ApiError, getJson } from "./api.js";
import { timeChart } from "./charts.js";
import { empty, h, setText } from "./dom.js";
import { bytes, fixed } from "./format.js";

const REFRESH_MS = 5000; // the sampler's default pace
const KEPT_SECONDS = 3600;

const percent = (value) => `${Math.round(value)}%`;
const gibFromMb = (mb) => mb / 1024;
const gibLabel = (value) => `${fixed(value, value > 0 && value < 10 ? 1 : 0)} GiB`;

function average(values) {
  return values.length ? values.reduce((sum, value) => sum + value, 0) / values.length : 0;
}

function seconds(timestamp) {
  return Date.parse(timestamp) / 1000;
}

function chartCard(title, chart, note = null) {
  return h("article", { class: "card" }, h("header", { class: "card-head" }, h("h3", { class: "card-title" }, title), note), chart.root);
}

function hardwareSummary(hardware) {
  const cpu = hardware.cpu || {};
  const os = hardware.operating_system || {};
  const environment = hardware.environment || {};
  const rows = [
    ["CPU", [cpu.model, cpu.vendor && !String(cpu.model || "").includes(cpu.vendor) ? `(${cpu.vendor})` : ""].filter(Boolean).join(" ") || "unknown"],
    ["Cores", [cpu.physical_core_count && `${cpu.physical_core_count} cores`, cpu.logical_thread_count && `${cpu.logical_thread_count} threads`, cpu.socket_count > 1 && `${cpu.socket_count} sockets`].filter(Boolean).join(" · ") || "unknown"],
    ["Memory", hardware.memory ? bytes(hardware.memory.capacity_bytes) : "unknown"],
    ["System", [os.name || os.family, os.version, os.kernel && `kernel ${os.kernel}`].filter(Boolean).join(" · ")],
    ["Runs in", [environment.kind, environment.name].filter(Boolean).join(" · ")],
    ["Architecture", hardware.architecture ? hardware.architecture.name : ""],
  ];
  for (const accelerator of hardware.accelerators || []) {
    const memory = accelerator.memory && accelerator.memory.capacity_bytes ? bytes(accelerator.memory.capacity_bytes) : "";
    const driver = accelerator.driver && accelerator.driver.version ? `driver ${accelerator.driver.version}` : "";
    rows.push([`GPU ${accelerator.index}`, [accelerator.model || accelerator.vendor || accelerator.kind, memory, driver].filter(Boolean).join(" · ")]);
  }
  if (!(hardware.accelerators || []).length) rows.push(["GPUs", "none detected"]);
  return h("dl", { class: "facts" }, rows.filter(([, value]) => value).map(([label, value]) => [h("dt", {}, label), h("dd", {}, value)]));
}

export function createPerformanceView() {
  const status = h("p", { class: "view-subtitle" }, "The host and its GPUs over the last hour.");
  const hardware = h("div", { class: "panel panel-padded" }, h("p", { class: "muted" }, "Reading the hardware…"));
  const disabled = h("div", { class: "panel", hidden: true }, empty("Performance sampling is off (performance.disabled in the config): nothing is sampled, so there is nothing to chart."));
  const cpu = timeChart({ series: [{ label: "average" }, { label: "busiest core" }], format: percent, range: [0, 100] });
  const memory = timeChart({ series: [{ label: "used" }], format: gibLabel });
  const load = timeChart({ series: [{ label: "1 min" }, { label: "5 min" }, { label: "15 min" }], format: (value) => fixed(value, 1) });
  const memoryNote = h("span", { class: "muted small" });
  const hostCharts = h("div", { class: "chart-grid" }, chartCard("CPU", cpu), chartCard("Memory", memory, memoryNote), chartCard("Load average", load));
  const gpuCharts = h("div", { class: "chart-grid" });
  const gpuSection = h("section", { class: "section" }, h("h2", { class: "section-title" }, "GPUs"), gpuCharts);
  const hostSection = h("section", { class: "section" }, h("h2", { class: "section-title" }, "Host"), hostCharts);
  const root = h(
    "section",
    { class: "view view-performance" },
    h("header", { class: "view-head" }, h("div", {}, h("h1", { class: "view-title" }, "Performance"), status)),
    h("section", { class: "section" }, h("h2", { class: "section-title" }, "Hardware"), hardware),
    disabled,
    hostSection,
    gpuSection,
  );
  const showCharts = (shown) => {
    hostSection.hidden = !shown;
    gpuSection.hidden = !shown;
    disabled.hidden = shown;
  };

  let system = [];
  let gpus = [];
  let gpuIds = "";
  let gpuChartSet = null;
  let timer = null;
  let visible = false;
  let hardwareRead = false;

  /** The last hour, by the router's clock (the newest sample), whatever this browser's clock says. */
  function trim(samples) {
    if (!samples.length) return samples;
    const oldest = seconds(samples[samples.length - 1].timestamp) - KEPT_SECONDS;
    return samples.filter((sample) => seconds(sample.timestamp) >= oldest);
  }

  function renderHost() {
    const times = system.map((sample) => seconds(sample.timestamp));
    const cores = system.map((sample) => sample.cpu_util_per_core || []);
    cpu.set([times, cores.map(average), cores.map((values) => (values.length ? Math.max(...values) : 0))]);
    memory.set([times, system.map((sample) => gibFromMb(sample.mem_used_mb))]);
    load.set([times, system.map((sample) => sample.load_avg_1), system.map((sample) => sample.load_avg_5), system.map((sample) => sample.load_avg_15)]);
    const last = system[system.length - 1];
    setText(memoryNote, last ? `${gibLabel(gibFromMb(last.mem_used_mb))} of ${gibLabel(gibFromMb(last.mem_total_mb))}` : "");
  }

  function renderGpus() {
    const ids = [...new Set(gpus.map((sample) => sample.id))].sort((a, b) => a - b);
    if (!ids.length) {
      gpuCharts.replaceChildren(h("div", { class: "panel" }, empty("No GPU is sampled: none was found, or NVML is not installed (pip install 'swaplab[gpu]').")));
      gpuIds = "";
      gpuChartSet = null;
      return;
    }
    const key = ids.join(",");
    if (key !== gpuIds) {
      gpuIds = key;
      const names = new Map(gpus.map((sample) => [sample.id, sample.name]));
      const series = ids.map((id) => ({ label: `GPU ${id}${names.get(id) ? ` ${names.get(id)}` : ""}` }));
      gpuChartSet = {
        util: timeChart({ series, format: percent, range: [0, 100] }),
        memory: timeChart({ series, format: gibLabel }),
        power: timeChart({ series, format: (value) => `${Math.round(value)} W` }),
        temperature: timeChart({ series, format: (value) => `${Math.round(value)} °C` }),
      };
      gpuCharts.replaceChildren(
        chartCard("Utilisation", gpuChartSet.util),
        chartCard("Memory used", gpuChartSet.memory),
        chartCard("Power", gpuChartSet.power),
        chartCard("Temperature", gpuChartSet.temperature),
      );
    }
    // One sample per GPU per tick: line them up on the ticks' times.
    const times = [...new Set(gpus.map((sample) => sample.timestamp))].sort();
    const index = new Map(times.map((time, position) => [time, position]));
    const column = (read) =>
      ids.map((id) => {
        const values = new Array(times.length).fill(null);
        for (const sample of gpus) if (sample.id === id) values[index.get(sample.timestamp)] = read(sample);
        return values;
      });
    const xs = times.map(seconds);
    gpuChartSet.util.set([xs, ...column((sample) => sample.gpu_util_pct)]);
    gpuChartSet.memory.set([xs, ...column((sample) => gibFromMb(sample.mem_used_mb))]);
    gpuChartSet.power.set([xs, ...column((sample) => sample.power_draw_w)]);
    gpuChartSet.temperature.set([xs, ...column((sample) => sample.temp_c)]);
  }

  async function readHardware() {
    try {
      hardware.replaceChildren(hardwareSummary(await getJson("/api/hardware")));
      hardwareRead = true;
    } catch (error) {
      hardware.replaceChildren(h("p", { class: "muted" }, `The hardware could not be read: ${error.message}`));
    }
  }

  async function refresh() {
    const last = system.length ? system[system.length - 1].timestamp : null;
    try {
      const report = await getJson(`/api/performance${last ? `?after=${encodeURIComponent(last)}` : ""}`);
      showCharts(true);
      system = trim([...system, ...(report.sys_stats || [])]);
      gpus = trim([...gpus, ...(report.gpu_stats || [])]);
      renderHost();
      renderGpus();
    } catch (error) {
      if (error instanceof ApiError && error.status === 503) {
        showCharts(false);
        system = [];
        gpus = [];
      }
    }
  }

  function tick() {
    if (!visible) return;
    refresh().finally(() => {
      if (visible) timer = setTimeout(tick, REFRESH_MS);
    });
  }

  return {
    root,
    title: "Performance",
    show() {
      visible = true;
      if (!hardwareRead) readHardware();
      clearTimeout(timer);
      tick();
    },
    hide() {
      visible = false;
      clearTimeout(timer);
    },
  };
}
