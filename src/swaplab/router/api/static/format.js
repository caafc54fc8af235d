// How numbers, sizes and times read on the page. llama-swap's activity rows use -1 for
// "not reported" (and 0 for everything when nothing was parsed): both show as a dash.

const DASH = "–";
const grouping = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });

export function count(value) {
  if (value === null || value === undefined || value === "" || Number(value) < 0) return DASH;
  return grouping.format(Number(value));
}

export function fixed(value, digits = 1) {
  if (value === null || value === undefined || !Number.isFinite(Number(value)) || Number(value) < 0) return DASH;
  return Number(value).toFixed(digits);
}

/** Tokens per second: unknown (-1) and zero both read as a dash. */
export function rate(value) {
  return Number(value) > 0 ? Number(value).toFixed(1) : DASH;
}

/** Milliseconds, as ms below a second, seconds above. */
export function ms(value) {
  if (value === null || value === undefined || !Number.isFinite(Number(value))) return DASH;
  const number = Number(value);
  if (number < 1000) return `${Math.round(number)} ms`;
  if (number < 60_000) return `${(number / 1000).toFixed(number < 10_000 ? 2 : 1)} s`;
  return duration(number / 1000);
}

/** Seconds as `12.3 s`, `4:05` or `1:02:03`. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(Number(seconds))) return DASH;
  const total = Number(seconds);
  if (total < 60) return `${total.toFixed(1)} s`;
  const whole = Math.floor(total);
  const h = Math.floor(whole / 3600);
  const m = Math.floor((whole % 3600) / 60);
  const s = String(whole % 60).padStart(2, "0");
  return h ? `${h}:${String(m).padStart(2, "0")}:${s}` : `${m}:${s}`;
}

export function gib(value, digits = 1) {
  if (value === null || value === undefined || !Number.isFinite(Number(value))) return DASH;
  return `${Number(value).toFixed(digits)} GiB`;
}

export function bytes(value) {
  const number = Number(value);
  if (!Number.isFinite(number) || number < 0) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = number;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${size} B` : `${size.toFixed(size < 10 ? 1 : 0)} ${units[unit]}`;
}

export function clock(date) {
  return date.toLocaleTimeString([], { hour12: false });
}

/** `Dec 1, 18:11:23`: a date a person can place without its year. */
export function when(date) {
  const day = date.toLocaleDateString([], { month: "short", day: "numeric" });
  return `${day}, ${clock(date)}`;
}

/** `12 s ago`, `3 min ago`, `2 h ago`, `4 d ago`. */
export function ago(date, now = Date.now()) {
  const seconds = Math.max(0, (now - date.getTime()) / 1000);
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

/** An activity row's time: swaplab's float `time` when there, else llama-swap's RFC 3339 `timestamp`. */
export function rowDate(row) {
  return typeof row.time === "number" ? new Date(row.time * 1000) : new Date(row.timestamp);
}

/** `falling_asleep` -> `falling asleep`. */
export function stateLabel(state) {
  return String(state || "stopped").replaceAll("_", " ");
}
