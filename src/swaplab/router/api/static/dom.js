// Building the page without innerHTML: whatever a model, a log or a user wrote arrives
// as a text node, so it can never become markup. (ansi.js is the one exception, and
// ansi_up escapes the text before it adds its colour spans.)

/** `h("button", {class: "x", onclick}, "Load")`: an element with properties and children. */
export function h(tag, props, ...children) {
  const node = document.createElement(tag);
  setProps(node, props);
  appendAll(node, children);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** An SVG element (icons), same call shape as `h`. */
export function svg(tag, props, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(props || {})) node.setAttribute(key, value);
  appendAll(node, children);
  return node;
}

function setProps(node, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "value" || key === "checked") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function appendAll(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
}

export const $ = (selector, root = document) => root.querySelector(selector);

/** Set a node's text only when it changed (no needless layout, selections survive). */
export function setText(node, value) {
  const text = value === undefined || value === null ? "" : String(value);
  if (node.textContent !== text) node.textContent = text;
}

/** Keep exactly `items` as `container`'s children, in order, one node per key.

`create(item)` builds a node once; `update(node, item)` refreshes it each time, so a
row's buttons, focus and open details survive every live update. */
export function reconcile(container, items, keyOf, create, update) {
  const existing = new Map();
  for (const child of container.children) existing.set(child.dataset.key, child);
  const wanted = items.map((item) => {
    const key = String(keyOf(item));
    let node = existing.get(key);
    if (!node) {
      node = create(item);
      node.dataset.key = key;
    }
    update(node, item);
    return node;
  });
  wanted.forEach((node, index) => {
    if (container.children[index] !== node) container.insertBefore(node, container.children[index] || null);
  });
  while (container.children.length > wanted.length) container.lastElementChild.remove();
}

/** A trailing-edge debounce: `fn` runs once, `ms` after the last call. */
export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

/** A small text chip (aliases, capabilities, devices). */
export function chip(text, kind = "") {
  return h("span", { class: kind ? `chip chip-${kind}` : "chip" }, text);
}

/** An empty state: a short sentence in a muted box. */
export function empty(text) {
  return h("p", { class: "empty" }, text);
}

/** Save `text` as a file the browser downloads. */
export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = h("a", { href: url, download: name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
