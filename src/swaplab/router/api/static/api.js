// The router's HTTP API as the page calls it: the API key on every request, the router's
// own error message on every failure.
//
// With `apiKeys` configured the page asks for a key once (on the first 401) and keeps it
// in localStorage; `/ui?key=KEY` still works and is stored the same way, then dropped
// from the address bar. The key travels as `Authorization: Bearer`, never in a URL.

const KEY_STORAGE = "swaplab.apiKey";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY_STORAGE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

/** Keep a `?key=` from the address, as the page always accepted it, and take it out of the URL. */
export function adoptKeyFromAddress() {
  const params = new URLSearchParams(location.search);
  const key = params.get("key");
  if (!key) return;
  setApiKey(key);
  params.delete("key");
  const query = params.toString();
  history.replaceState(null, "", `${location.pathname}${query ? `?${query}` : ""}${location.hash}`);
}

/** A model id as the last part of a path (`/api/models/unload/{id}`): each segment encoded, its slashes kept. */
export function modelPath(id) {
  return id.split("/").map(encodeURIComponent).join("/");
}

export function authHeaders(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

let onUnauthorized = () => {};

/** What to do when the router answers 401 (the page opens its key dialog). */
export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

export function unauthorized() {
  onUnauthorized();
}

/** The message in an error answer: llama-swap's and swaplab's envelopes, or the plain text. */
export async function errorMessage(response) {
  const text = await response.text().catch(() => "");
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  const error = body && (body.error ?? body.message ?? body.detail);
  const message = (error && (error.message || (typeof error === "string" ? error : null))) || text.trim();
  return message || `${response.status} ${response.statusText}`;
}

/** `fetch` with the key; a non-2xx answer throws `ApiError` with the router's message.
No credentials of the browser's own go along: a 401 then comes back to the page, which asks
for the key, instead of making the browser prompt for a Basic login (the router's 401 offers it). */
export async function send(path, options = {}) {
  const response = await fetch(path, { ...options, credentials: "omit", headers: authHeaders(options.headers) });
  if (response.status === 401) onUnauthorized();
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  return response;
}

export async function getJson(path, options) {
  return (await send(path, options)).json();
}

export async function postJson(path, body, options = {}) {
  const response = await send(path, {
    ...options,
    method: options.method || "POST",
    headers: { "Content-Type": "application/json", ...(options.headers || {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return text; // llama-swap answers some actions with a plain `OK`
  }
}
