// #/activity: requests on their way, the statistics, and the activity table
// (`/api/metrics/activity`: filtered, sorted and paged by the router), refreshed when the
// feed says a row was written. A row with a capture opens it.

import { getJson } from "./api.js";
import { openCapture } from "./capture.js";
import { histogramChart } from "./charts.js";
import { debounce, download, empty, h, setText } from "./dom.js";
import { clock, count, ms, rate, rowDate, when } from "./format.js";
import { icon } from "./icons.js";
import { createInflightTable } from "./inflight.js";
import { on, state } from "./live.js";
import { toast } from "./toast.js";

const EXPORT_PAGE = 999; // the router's largest page

function tokens(row) {
  return row.tokens || {};
}

function statusCell(row) {
  const code = Number(row.resp_status_code);
  const badge = h("span", { class: "http", dataset: { class: code >= 500 || code === 0 ? "error" : code >= 400 ? "warning" : "ok" } }, String(row.resp_status_code || "–"));
  const cellNodes = [badge];
  if (row.client_disconnected) cellNodes.push(h("span", { class: "tag", title: "the client went away before the answer ended" }, "client left"));
  return cellNodes;
}

function ttftCell(row) {
  const nodes = [ms(row.ttft_ms)];
  if (row.waited_for) {
    // A request that waited for its model says whether a wake (seconds) or a cold start (minutes) it was.
    const title = row.waited_for === "wake" ? "waited for its model to wake" : "waited for its model to start";
    nodes.push(h("span", { class: "waited", dataset: { waited: row.waited_for }, title }, row.waited_for));
  }
  if (row.metadata && row.metadata.context === "restored") {
    // Its prompt came from a context saved before a swap and restored on this start (kvCache).
    nodes.push(h("span", { class: "waited", dataset: { waited: "restored" }, title: "its prompt was read from a saved context restored after a swap" }, "restored"));
  }
  return nodes;
}

function modelCell(row) {
  const nodes = [h("span", { class: "model-id" }, row.model)];
  if (row.requested_model && row.requested_model !== row.model) nodes.push(h("span", { class: "muted small via" }, `as ${row.requested_model}`));
  return nodes;
}

/** Today's rows by their time alone, older ones with their day; the full timestamp on hover. */
function timeCell(row) {
  const date = rowDate(row);
  const today = date.toDateString() === new Date().toDateString();
  return h("time", { datetime: date.toISOString(), title: date.toString() }, today ? clock(date) : when(date));
}

// `short` is the header's label where the full one would widen the table; phones show `label`.
const COLUMNS = [
  { label: "#", sort: "id", num: true, cardTitle: true, cell: (row) => String(row.id) },
  { label: "Time", sort: "time", cardTitle: true, cell: timeCell },
  { label: "Model", sort: "model", wide: true, cell: modelCell, model: true },
  { label: "Path", sort: "req_path", wide: true, cell: (row) => h("span", { class: "mono" }, row.req_path) },
  { label: "Status", sort: "resp_status_code", cell: statusCell },
  { label: "Cached", sort: "cached", num: true, cell: (row) => count(tokens(row).cache_tokens) },
  { label: "Prompt", sort: "prompt", num: true, cell: (row) => count(tokens(row).input_tokens) },
  { label: "Generated", sort: "generated", num: true, cell: (row) => count(tokens(row).output_tokens) },
  { label: "Prefill tok/s", short: "Prefill", title: "prefill (prompt processing) speed, tokens per second", sort: "prompt_speed", num: true, cell: (row) => rate(tokens(row).prompt_per_second) },
  { label: "Decode tok/s", short: "Decode", title: "decode (generation) speed, tokens per second", sort: "gen_speed", num: true, cell: (row) => rate(tokens(row).tokens_per_second) },
  { label: "TTFT", title: "time to first token; a badge when the request waited for its model to start or wake", sort: null, num: true, cell: ttftCell },
  { label: "Duration", sort: "duration", num: true, cell: (row) => ms(row.duration_ms) },
];

// -- export -------------------------------------------------------------------------

const CSV_FIELDS = [
  ["id", (row) => row.id],
  ["timestamp", (row) => row.timestamp],
  ["model", (row) => row.model],
  ["requested_model", (row) => row.requested_model ?? ""],
  ["req_path", (row) => row.req_path],
  ["resp_status_code", (row) => row.resp_status_code],
  ["resp_content_type", (row) => row.resp_content_type],
  ["cache_tokens", (row) => tokens(row).cache_tokens],
  ["input_tokens", (row) => tokens(row).input_tokens],
  ["output_tokens", (row) => tokens(row).output_tokens],
  ["draft_tokens", (row) => tokens(row).draft_tokens],
  ["draft_acc_tokens", (row) => tokens(row).draft_acc_tokens],
  ["prompt_per_second", (row) => tokens(row).prompt_per_second],
  ["tokens_per_second", (row) => tokens(row).tokens_per_second],
  ["ttft_ms", (row) => row.ttft_ms ?? ""],
  ["duration_ms", (row) => row.duration_ms],
  ["waited_for", (row) => row.waited_for ?? ""],
  ["session_id", (row) => row.session_id ?? ""],
  ["error_msg", (row) => row.error_msg ?? ""],
];

function csvCell(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return String(value);
  let text = String(value);
  if (/^[=+\-@\t\r]/.test(text)) text = `'${text}`; // a spreadsheet must not run a cell as a formula
  return /[",\n\r]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

export function toCsv(rows) {
  const lines = [CSV_FIELDS.map(([name]) => name).join(",")];
  for (const row of rows) lines.push(CSV_FIELDS.map(([, read]) => csvCell(read(row))).join(","));
  return `${lines.join("\r\n")}\r\n`;
}

// -- the table ----------------------------------------------------------------------

/** The activity table: `model` fixes the filter (a model's page); otherwise a select offers it. */
export function createActivityTable({ model = null, onFilter = () => {} } = {}) {
  const query = { model: model || "", page: 1, limit: 25, sort: "id", order: "desc" };
  const columns = COLUMNS.filter((column) => !(model && column.model));
  const modelSelect = h("select", { class: "select select-small", "aria-label": "Model" });
  const sizeSelect = h("select", { class: "select select-small", "aria-label": "Rows per page" }, [25, 50, 100].map((size) => h("option", { value: size }, `${size} rows`)));
  const exportJson = h("button", { type: "button", class: "button button-small" }, icon("download"), h("span", {}, "JSON"));
  const exportCsv = h("button", { type: "button", class: "button button-small" }, icon("download"), h("span", {}, "CSV"));
  const head = h("tr");
  const body = h("tbody");
  const table = h("table", { class: "table table-stack activity-table" }, h("thead", {}, head), body);
  const none = empty(model ? "No requests for this model yet." : "No requests yet.");
  const range = h("span", { class: "muted small" });
  const previous = h("button", { type: "button", class: "button button-small", "aria-label": "Previous page" }, "Previous");
  const next = h("button", { type: "button", class: "button button-small", "aria-label": "Next page" }, "Next");
  const root = h(
    "div",
    { class: "activity" },
    h("div", { class: "toolbar" }, model ? null : modelSelect, sizeSelect, h("span", { class: "toolbar-gap" }), h("span", { class: "muted small" }, "Export"), exportJson, exportCsv),
    h("div", { class: "panel" }, h("div", { class: "table-scroll" }, table), none, h("footer", { class: "pager" }, range, h("span", { class: "toolbar-gap" }), previous, next)),
  );
  let visible = false;
  let stale = true;
  let loading = null;

  for (const column of columns) {
    const th = h("th", { class: column.num ? "num" : "", scope: "col", title: column.title });
    const label = column.short || column.label;
    if (column.sort) {
      const button = h("button", { type: "button", class: "sort", dataset: { sort: column.sort } }, label, h("span", { class: "sort-mark", "aria-hidden": "true" }));
      button.addEventListener("click", () => {
        if (query.sort === column.sort) query.order = query.order === "desc" ? "asc" : "desc";
        else Object.assign(query, { sort: column.sort, order: column.num || column.sort === "time" || column.sort === "id" ? "desc" : "asc" });
        query.page = 1;
        load();
      });
      th.append(button);
    } else {
      th.textContent = label;
    }
    head.append(th);
  }

  function params(overrides = {}) {
    const values = { ...query, ...overrides };
    const search = new URLSearchParams();
    if (values.model) search.set("model", values.model);
    for (const key of ["page", "limit", "sort", "order"]) search.set(key, values[key]);
    return search;
  }

  function renderHead() {
    for (const button of head.querySelectorAll("button.sort")) {
      const active = button.dataset.sort === query.sort;
      button.parentElement.setAttribute("aria-sort", active ? (query.order === "asc" ? "ascending" : "descending") : "none");
      setText(button.lastElementChild, active ? (query.order === "asc" ? "↑" : "↓") : "");
    }
  }

  function renderRows(page) {
    const rows = page.data || [];
    body.replaceChildren(
      ...rows.flatMap((row) => {
        const tr = h("tr", { dataset: { id: row.id, model: row.model } });
        if (row.has_capture) {
          tr.classList.add("has-capture");
          tr.tabIndex = 0;
          tr.title = "Open the capture";
          tr.addEventListener("click", () => openCapture(row));
          tr.addEventListener("keydown", (event) => event.key === "Enter" && openCapture(row));
        }
        if (row.error_msg) tr.classList.add("has-error");
        for (const column of columns) {
          const className = [column.num ? "num" : "", column.wide ? "wide" : "", column.cardTitle ? "card-title-cell" : ""].join(" ").trim();
          tr.append(h("td", { class: className, dataset: { label: column.label } }, h("span", { class: "cell" }, column.cell(row))));
        }
        if (!row.error_msg) return [tr];
        return [tr, h("tr", { class: "error-row" }, h("td", { colspan: columns.length }, row.error_msg))];
      }),
    );
    table.hidden = rows.length === 0;
    none.hidden = rows.length > 0;
    const first = (page.page - 1) * page.limit + 1;
    setText(range, page.total ? `${first}–${first + rows.length - 1} of ${count(page.total)}` : "");
    previous.disabled = page.page <= 1;
    next.disabled = page.page >= page.total_pages;
  }

  async function load() {
    stale = false;
    renderHead();
    const ticket = {};
    loading = ticket;
    try {
      const page = await getJson(`/api/metrics/activity?${params()}`);
      if (loading !== ticket) return; // a newer load overtook this one
      renderRows(page);
    } catch (error) {
      if (loading === ticket) toast(`Activity: ${error.message}`, "error");
    }
  }

  const refresh = debounce(() => (visible ? load() : (stale = true)), 300);

  function renderModelOptions() {
    const ids = [...state.models.map((entry) => entry.id), ...state.peers.map((entry) => entry.id)];
    const current = [...modelSelect.options].map((option) => option.value).join("\u0000");
    if (current === ["", ...ids].join("\u0000")) return;
    modelSelect.replaceChildren(h("option", { value: "" }, "All models"), ...ids.map((id) => h("option", { value: id }, id)));
    modelSelect.value = query.model;
  }

  async function exportAll(format) {
    const rows = [];
    try {
      for (let page = 1; ; page += 1) {
        const answer = await getJson(`/api/metrics/activity?${params({ page, limit: EXPORT_PAGE })}`);
        rows.push(...(answer.data || []));
        if (page >= answer.total_pages) break;
      }
    } catch (error) {
      toast(`Export: ${error.message}`, "error");
      return;
    }
    const stamp = new Date().toISOString().replace(/[:.]/g, "-").slice(0, 19);
    const name = `swaplab-activity${query.model ? `-${query.model.replace(/[^\w.-]+/g, "_")}` : ""}-${stamp}`;
    if (format === "json") download(`${name}.json`, JSON.stringify(rows, null, 2), "application/json");
    else download(`${name}.csv`, toCsv(rows), "text/csv");
  }

  modelSelect.addEventListener("change", () => {
    query.model = modelSelect.value;
    query.page = 1;
    onFilter(query.model);
    load();
  });
  sizeSelect.addEventListener("change", () => {
    query.limit = Number(sizeSelect.value);
    query.page = 1;
    load();
  });
  previous.addEventListener("click", () => {
    query.page = Math.max(1, query.page - 1);
    load();
  });
  next.addEventListener("click", () => {
    query.page += 1;
    load();
  });
  exportJson.addEventListener("click", () => exportAll("json"));
  exportCsv.addEventListener("click", () => exportAll("csv"));
  const listening = [on("activity", refresh), on("models", renderModelOptions)];
  renderModelOptions();

  return {
    root,
    show() {
      visible = true;
      if (stale) load();
    },
    hide() {
      visible = false;
    },
    /** Stop listening (a model's page makes a new table for each model). */
    dispose() {
      visible = false;
      listening.forEach((stop) => stop());
    },
  };
}

// -- statistics ---------------------------------------------------------------------

const HISTOGRAMS = [
  { key: "prompt_histogram", title: "Prefill speed", unit: "tok/s", format: (value) => `${Math.round(value)}` },
  { key: "gen_histogram", title: "Decode speed", unit: "tok/s", format: (value) => `${Math.round(value)}` },
  { key: "ttft_histogram", title: "Time to first token", unit: "ms", format: (value) => ms(value) },
  { key: "duration_histogram", title: "Duration", unit: "ms", format: (value) => ms(value) },
];

function createStats(onStore = () => {}) {
  const totals = h("div", { class: "totals" });
  const cards = HISTOGRAMS.map((spec) => {
    const chart = histogramChart({ label: spec.title, format: spec.format });
    const percentiles = h("p", { class: "percentiles" });
    const card = h("article", { class: "card histogram", dataset: { histogram: spec.key } }, h("header", { class: "card-head" }, h("h3", { class: "card-title" }, spec.title), h("span", { class: "muted small" }, spec.unit)), percentiles, chart.root);
    return { spec, chart, percentiles, card };
  });
  const root = h("div", { class: "stats" }, totals, h("div", { class: "histograms" }, cards.map((entry) => entry.card)));
  let model = "";
  let visible = false;
  let stale = true;

  async function load() {
    stale = false;
    try {
      const stats = await getJson(`/api/metrics/stats${model ? `?model=${encodeURIComponent(model)}` : ""}`);
      if (stats.store) onStore(stats.store);
      totals.replaceChildren(
        ...[
          ["Requests", stats.total_requests],
          ["Input tokens", stats.total_input_tokens],
          ["Output tokens", stats.total_output_tokens],
          ["Cached tokens", stats.total_cache_tokens],
        ].map(([label, value]) => h("div", { class: "total" }, h("span", { class: "total-label" }, label), h("span", { class: "total-value" }, count(value)))),
      );
      for (const { spec, chart, percentiles } of cards) {
        const histogram = stats[spec.key] || null;
        chart.set(histogram);
        percentiles.replaceChildren(
          ...(histogram
            ? ["p50", "p95", "p99"].map((name) => h("span", { class: "percentile" }, h("span", { class: "muted" }, name), ` ${spec.format(histogram[name])}`))
            : [h("span", { class: "muted" }, "p50 – · p95 – · p99 –")]),
        );
      }
    } catch (error) {
      toast(`Statistics: ${error.message}`, "error");
    }
  }

  const refresh = debounce(() => (visible ? load() : (stale = true)), 1000);
  on("activity", refresh);
  return {
    root,
    setModel(next) {
      model = next;
      load();
    },
    show() {
      visible = true;
      if (stale) load();
    },
    hide() {
      visible = false;
    },
  };
}

// -- the view -----------------------------------------------------------------------

export function createActivityView() {
  const inflight = createInflightTable();
  // The SQLite file the router records into, as /api/metrics/stats names it: what `swaplab activity --db` reads.
  const store = h("code", { class: "activity-store", id: "activity-store" });
  const storeLine = h("p", { class: "view-subtitle", hidden: true }, "Recorded in ", store);
  const stats = createStats((path) => {
    setText(store, path);
    storeLine.hidden = false;
  });
  const table = createActivityTable({ onFilter: (model) => stats.setModel(model) });
  const root = h(
    "section",
    { class: "view view-activity" },
    h("header", { class: "view-head" }, h("div", {}, h("h1", { class: "view-title" }, "Activity"), h("p", { class: "view-subtitle" }, "Every proxied request, as the router recorded it. Rows with a capture open it."), storeLine)),
    h("section", { class: "section" }, h("h2", { class: "section-title" }, "In flight"), inflight.root),
    h("section", { class: "section" }, h("h2", { class: "section-title" }, "Statistics"), stats.root),
    h("section", { class: "section" }, h("h2", { class: "section-title" }, "Requests"), table.root),
  );
  const parts = [inflight, stats, table];
  return {
    root,
    title: "Activity",
    show: () => parts.forEach((part) => part.show()),
    hide: () => parts.forEach((part) => part.hide()),
  };
}
