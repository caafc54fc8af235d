// #/playground: talk to any model through the router. Chat streams (reasoning shown apart
// from the answer), completions stream a raw prompt's continuation, embeddings show the
// vector's size and first values. A model's words are only ever set as text.

import { getJson, send } from "./api.js";
import { debounce, empty, h, setText } from "./dom.js";
import { count, fixed, ms, stateLabel } from "./format.js";
import { icon } from "./icons.js";
import { on, state } from "./live.js";
import { readEvents } from "./sse.js";

const SETTINGS_STORAGE = "swaplab.playground";
const DEFAULTS = { model: "", system: "", temperature: 0.7, max_tokens: 512, top_p: 1 };

function loadSettings() {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(SETTINGS_STORAGE) || "{}") };
  } catch {
    return { ...DEFAULTS };
  }
}

/** POST `body` to `path` and hand each streamed JSON chunk to `onChunk`; an error event throws. */
async function stream(path, body, signal, onChunk) {
  const response = await send(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal });
  for await (const event of readEvents(response.body)) {
    if (event.data === "[DONE]") return;
    let chunk;
    try {
      chunk = JSON.parse(event.data);
    } catch {
      continue;
    }
    if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
    onChunk(chunk);
  }
}

/** What a finished answer cost: tokens, time to first token, speed (llama.cpp's timings when sent). */
function answerStats({ started, first, ended, usage, timings, pieces, finish }) {
  const tokens = (timings && timings.predicted_n) || (usage && usage.completion_tokens) || pieces;
  const decodeSeconds = first ? (ended - first) / 1000 : 0;
  const speed = (timings && timings.predicted_per_second) || (decodeSeconds > 0 && tokens > 1 ? (tokens - 1) / decodeSeconds : 0);
  const parts = [`${count(tokens)} tokens`];
  if (first) parts.push(`TTFT ${ms(first - started)}`);
  if (speed) parts.push(`${fixed(speed, 1)} tok/s`);
  parts.push(ms(ended - started));
  if (finish && finish !== "stop") parts.push(`finish: ${finish}`);
  return parts.join(" · ");
}

/** Whether a `/v1/models` record declares text in and text out (`capabilities: {in: [text], out: [text]}`). */
export function chatCapable(record) {
  const architecture = record.architecture || {};
  return (architecture.input_modalities || []).includes("text") && (architecture.output_modalities || []).includes("text");
}

/** Whether a record declares text in and nothing out (`capabilities: {in: [text]}`): an embedding model. */
export function embeddingCapable(record) {
  const architecture = record.architecture || {};
  return (architecture.input_modalities || []).includes("text") && !(architecture.output_modalities || []).length;
}

function field(label, control, hint = null) {
  return h("label", { class: "field" }, h("span", { class: "field-label" }, label, hint ? h("span", { class: "muted" }, hint) : null), control);
}

export function createPlaygroundView() {
  const settings = loadSettings();
  const save = () => localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(settings));

  // -- settings ---------------------------------------------------------------------
  const modelSelect = h("select", { class: "select", id: "playground-model" });
  const system = h("textarea", { class: "input textarea", rows: 4, id: "system-prompt", placeholder: "You are a helpful assistant." });
  system.value = settings.system;
  const number = (id, value, step, min, max) => h("input", { class: "input", type: "number", id, value, step, min, max });
  const temperature = number("temperature", settings.temperature, 0.1, 0, 2);
  const maxTokens = number("max-tokens", settings.max_tokens, 1, 1, 131072);
  const topP = number("top-p", settings.top_p, 0.05, 0, 1);
  const systemField = field("System prompt", system, "chat only");
  // On a phone the parameters fold away under the model, so the conversation comes first.
  const more = h(
    "details",
    { class: "settings-more", open: !matchMedia("(max-width: 860px)").matches },
    h("summary", {}, "Parameters"),
    systemField,
    h("div", { class: "field-row" }, field("Temperature", temperature), field("Top P", topP)),
    field("Max tokens", maxTokens),
  );
  const aside = h("aside", { class: "playground-settings panel panel-padded" }, field("Model", modelSelect), more);
  for (const [control, key, parse] of [
    [system, "system", String],
    [temperature, "temperature", Number],
    [maxTokens, "max_tokens", Number],
    [topP, "top_p", Number],
  ]) {
    control.addEventListener("change", () => {
      settings[key] = parse(control.value);
      save();
    });
  }
  modelSelect.addEventListener("change", () => {
    settings.model = modelSelect.value;
    save();
  });

  const parameters = () => {
    const values = { model: modelSelect.value };
    if (temperature.value !== "") values.temperature = Number(temperature.value);
    if (maxTokens.value !== "") values.max_tokens = Number(maxTokens.value);
    if (topP.value !== "") values.top_p = Number(topP.value);
    return values;
  };

  let modelRecords = [];

  async function loadModels() {
    try {
      modelRecords = (await getJson("/v1/models")).data || [];
    } catch {
      return;
    }
    renderModels();
  }

  function renderModels() {
    const live = new Map(state.models.map((model) => [model.id, model.state]));
    const groups = new Map([
      ["model", []],
      ["selector", []],
      ["peer", []],
      ["other", []],
    ]);
    for (const record of modelRecords) {
      const type = (record.meta && record.meta.llamaswap && record.meta.llamaswap.type) || "model";
      const current = live.get(record.id) || (record.status && record.status.state) || "";
      const option = h("option", { value: record.id }, current && type === "model" ? `${record.id} · ${stateLabel(current)}` : record.id);
      (groups.get(type) || groups.get("other")).push(option);
    }
    const labels = { model: "Models", selector: "Selectors", peer: "Peers", other: "Other" };
    // Rebuilt only when an option changes: a rebuild would close the list under the pointer.
    const signature = [...groups].map(([type, options]) => `${type}:${options.map((option) => `${option.value}=${option.textContent}`).join(",")}`).join(";");
    if (signature === modelSelect.dataset.signature) return;
    modelSelect.dataset.signature = signature;
    const wanted = settings.model || modelSelect.value;
    modelSelect.replaceChildren(...[...groups].filter(([, options]) => options.length).map(([type, options]) => h("optgroup", { label: labels[type] }, options)));
    const ids = modelRecords.map((record) => record.id);
    // The tab opens on Chat: a model that says it takes and gives text (a base model
    // answers a chat with template garbage), a ready one first; any model when none says.
    const chatty = modelRecords.filter(chatCapable);
    const pool = chatty.length ? chatty : modelRecords;
    const first = pool.find((record) => live.get(record.id) === "ready") || pool[0];
    modelSelect.value = ids.includes(wanted) ? wanted : first ? first.id : "";
  }

  /** On a tab the chosen model cannot serve (Embeddings on a chat model, Chat on an embedding
   * model), the first model that says it can, a ready one first; the user's own pick is kept. */
  function pickFor(fits, cannot) {
    const current = modelRecords.find((record) => record.id === modelSelect.value);
    if (!current || !cannot(current)) return;
    const live = new Map(state.models.map((model) => [model.id, model.state]));
    const pool = modelRecords.filter(fits);
    const pick = pool.find((record) => live.get(record.id) === "ready") || pool[0];
    if (pick) modelSelect.value = pick.id;
  }

  on("models", debounce(renderModels, 100));

  // -- chat -------------------------------------------------------------------------
  const transcript = h("div", { class: "transcript", id: "transcript" });
  const chatEmpty = empty("Send a message to start a conversation.");
  const chatInput = h("textarea", { class: "input textarea composer-input", id: "chat-input", rows: 3, placeholder: "Message the model (Enter sends, Shift+Enter for a new line)", "aria-label": "Message" });
  const chatSend = h("button", { type: "button", class: "button button-primary", id: "chat-send" }, icon("send"), h("span", {}, "Send"));
  const chatStop = h("button", { type: "button", class: "button", id: "chat-stop", hidden: true }, icon("stop"), h("span", {}, "Stop"));
  const chatClear = h("button", { type: "button", class: "button button-ghost" }, "New chat");
  const chatPanel = h(
    "div",
    { class: "playground-panel chat" },
    h("div", { class: "transcript-box" }, chatEmpty, transcript),
    h("div", { class: "composer" }, chatInput, h("div", { class: "composer-actions" }, chatClear, h("span", { class: "toolbar-gap" }), chatStop, chatSend)),
  );
  let conversation = [];
  let chatAbort = null;

  function messageNode(role, label) {
    const content = h("div", { class: "message-content" });
    const meta = h("span", { class: "message-meta muted" });
    const node = h("article", { class: "message", dataset: { role } }, h("header", { class: "message-head" }, h("span", { class: "message-role" }, label), meta), content);
    node.parts = { content, meta };
    return node;
  }

  function assistantNode(model) {
    const node = messageNode("assistant", model);
    const reasoningText = h("div", { class: "reasoning-text" });
    const summary = h("summary", {}, "Thinking…");
    const reasoning = h("details", { class: "reasoning", open: true, hidden: true }, summary, reasoningText);
    node.insertBefore(reasoning, node.parts.content);
    Object.assign(node.parts, { reasoning, reasoningText, summary });
    return node;
  }

  function scrollToEnd() {
    transcript.parentElement.scrollTop = transcript.parentElement.scrollHeight;
  }

  function setBusy(busy, sendButton, stopButton) {
    sendButton.disabled = busy;
    stopButton.hidden = !busy;
  }

  async function sendChat() {
    const text = chatInput.value.trim();
    if (!text || chatAbort || !modelSelect.value) return;
    chatInput.value = "";
    chatEmpty.hidden = true;
    const user = messageNode("user", "You");
    user.parts.content.textContent = text;
    conversation.push({ role: "user", content: text });
    const model = modelSelect.value;
    const answer = assistantNode(model);
    answer.dataset.status = "streaming";
    transcript.append(user, answer);
    scrollToEnd();

    const body = { ...parameters(), stream: true, messages: [...(system.value.trim() ? [{ role: "system", content: system.value }] : []), ...conversation] };
    chatAbort = new AbortController();
    setBusy(true, chatSend, chatStop);
    const run = { started: performance.now(), first: 0, ended: 0, usage: null, timings: null, pieces: 0, finish: "" };
    let content = "";
    let reasoning = "";
    const { parts } = answer;
    try {
      await stream("/v1/chat/completions", body, chatAbort.signal, (chunk) => {
        const choice = (chunk.choices && chunk.choices[0]) || {};
        const delta = choice.delta || {};
        const thought = delta.reasoning_content ?? delta.reasoning;
        if (thought) {
          run.first ||= performance.now();
          reasoning += thought;
          parts.reasoning.hidden = false;
          parts.reasoningText.textContent = reasoning;
        }
        if (delta.content) {
          if (!content && reasoning) {
            parts.reasoning.open = false; // the answer begins: fold the thinking away
            setText(parts.summary, `Thought for ${ms(performance.now() - run.started)}`);
          }
          run.first ||= performance.now();
          run.pieces += 1;
          content += delta.content;
          parts.content.textContent = content;
        }
        if (choice.finish_reason) run.finish = choice.finish_reason;
        if (chunk.usage) run.usage = chunk.usage;
        if (chunk.timings) run.timings = chunk.timings;
        scrollToEnd();
      });
      run.ended = performance.now();
      answer.dataset.status = "done";
      setText(parts.meta, answerStats(run));
    } catch (error) {
      run.ended = performance.now();
      if (chatAbort.signal.aborted) {
        answer.dataset.status = "stopped";
        setText(parts.meta, `stopped · ${ms(run.ended - run.started)}`);
      } else {
        answer.dataset.status = "error";
        answer.append(h("p", { class: "error-text" }, error.message));
      }
    } finally {
      if (reasoning && parts.summary.textContent === "Thinking…") setText(parts.summary, "Thinking");
      if (!content && !reasoning && answer.dataset.status !== "error") parts.content.append(h("span", { class: "muted" }, "(no answer)"));
      if (content) conversation.push({ role: "assistant", content });
      chatAbort = null;
      setBusy(false, chatSend, chatStop);
      scrollToEnd();
    }
  }

  chatSend.addEventListener("click", sendChat);
  chatStop.addEventListener("click", () => chatAbort && chatAbort.abort());
  chatInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendChat();
    }
  });
  chatClear.addEventListener("click", () => {
    if (chatAbort) chatAbort.abort();
    conversation = [];
    transcript.replaceChildren();
    chatEmpty.hidden = false;
  });

  // -- completion -------------------------------------------------------------------
  const promptInput = h("textarea", { class: "input textarea", id: "completion-prompt", rows: 6, placeholder: "Once upon a time", "aria-label": "Prompt" });
  const completionSend = h("button", { type: "button", class: "button button-primary", id: "completion-send" }, icon("send"), h("span", {}, "Complete"));
  const completionStop = h("button", { type: "button", class: "button", hidden: true }, icon("stop"), h("span", {}, "Stop"));
  const completionPrompt = h("span", { class: "completion-prompt" });
  const completionText = h("span", { class: "completion-text" });
  const completionMeta = h("p", { class: "message-meta muted" });
  const completionOutput = h("div", { class: "completion-output", id: "completion-output", hidden: true }, completionPrompt, completionText);
  const completionPanel = h(
    "div",
    { class: "playground-panel", hidden: true },
    h("div", { class: "composer" }, promptInput, h("div", { class: "composer-actions" }, h("span", { class: "muted small" }, "Ctrl+Enter to complete"), h("span", { class: "toolbar-gap" }), completionStop, completionSend)),
    completionOutput,
    completionMeta,
  );
  let completionAbort = null;

  async function sendCompletion() {
    const prompt = promptInput.value;
    if (!prompt || completionAbort || !modelSelect.value) return;
    completionOutput.hidden = false;
    completionOutput.dataset.status = "streaming";
    completionPrompt.textContent = prompt;
    completionText.textContent = "";
    setText(completionMeta, "");
    completionAbort = new AbortController();
    setBusy(true, completionSend, completionStop);
    const run = { started: performance.now(), first: 0, ended: 0, usage: null, timings: null, pieces: 0, finish: "" };
    try {
      await stream("/v1/completions", { ...parameters(), prompt, stream: true }, completionAbort.signal, (chunk) => {
        const choice = (chunk.choices && chunk.choices[0]) || {};
        if (choice.text) {
          run.first ||= performance.now();
          run.pieces += 1;
          completionText.textContent += choice.text;
        }
        if (choice.finish_reason) run.finish = choice.finish_reason;
        if (chunk.usage) run.usage = chunk.usage;
        if (chunk.timings) run.timings = chunk.timings;
      });
      run.ended = performance.now();
      completionOutput.dataset.status = "done";
      setText(completionMeta, answerStats(run));
    } catch (error) {
      completionOutput.dataset.status = completionAbort.signal.aborted ? "stopped" : "error";
      setText(completionMeta, completionAbort.signal.aborted ? "stopped" : error.message);
    } finally {
      completionAbort = null;
      setBusy(false, completionSend, completionStop);
    }
  }

  completionSend.addEventListener("click", sendCompletion);
  completionStop.addEventListener("click", () => completionAbort && completionAbort.abort());
  promptInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      sendCompletion();
    }
  });

  // -- embeddings -------------------------------------------------------------------
  const embedInput = h("textarea", { class: "input textarea", id: "embedding-input", rows: 4, placeholder: "Text to embed", "aria-label": "Text to embed" });
  const embedSend = h("button", { type: "button", class: "button button-primary", id: "embedding-send" }, "Embed");
  const embedResult = h("div", { class: "embedding-result", id: "embedding-result" });
  const embeddingPanel = h(
    "div",
    { class: "playground-panel", hidden: true },
    h("div", { class: "composer" }, embedInput, h("div", { class: "composer-actions" }, h("span", { class: "toolbar-gap" }), embedSend)),
    embedResult,
  );

  async function sendEmbedding() {
    const input = embedInput.value;
    if (!input || !modelSelect.value) return;
    embedSend.disabled = true;
    const started = performance.now();
    try {
      const response = await send("/v1/embeddings", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ model: modelSelect.value, input }) });
      const answer = await response.json();
      const vector = (answer.data && answer.data[0] && answer.data[0].embedding) || [];
      const norm = Math.sqrt(vector.reduce((sum, value) => sum + value * value, 0));
      embedResult.replaceChildren(
        h(
          "dl",
          { class: "facts" },
          h("dt", {}, "Dimensions"),
          h("dd", { class: "embedding-dimensions" }, String(vector.length)),
          h("dt", {}, "Norm"),
          h("dd", {}, fixed(norm, 4)),
          h("dt", {}, "Prompt tokens"),
          h("dd", {}, count(answer.usage && answer.usage.prompt_tokens)),
          h("dt", {}, "Time"),
          h("dd", {}, ms(performance.now() - started)),
        ),
        h("p", { class: "muted small" }, `First ${Math.min(16, vector.length)} values`),
        h("div", { class: "vector" }, vector.slice(0, 16).map((value) => h("span", { class: "vector-value" }, value.toFixed(5)))),
      );
    } catch (error) {
      embedResult.replaceChildren(h("p", { class: "error-text" }, error.message));
    } finally {
      embedSend.disabled = false;
    }
  }
  embedSend.addEventListener("click", sendEmbedding);

  // -- tabs -------------------------------------------------------------------------
  const panels = [
    ["chat", "Chat", chatPanel],
    ["completion", "Completion", completionPanel],
    ["embeddings", "Embeddings", embeddingPanel],
  ];
  const tabList = h("div", { class: "tabs", role: "tablist" });
  for (const [key, label, panel] of panels) {
    const tab = h("button", { type: "button", class: "tab", role: "tab", "aria-selected": String(key === "chat"), dataset: { tab: key } }, label);
    tab.addEventListener("click", () => {
      for (const other of tabList.children) other.setAttribute("aria-selected", String(other === tab));
      for (const [, , other] of panels) other.hidden = other !== panel;
      systemField.hidden = key !== "chat";
      if (key === "embeddings") pickFor(embeddingCapable, chatCapable);
      else pickFor(chatCapable, embeddingCapable);
    });
    tabList.append(tab);
  }

  const root = h(
    "section",
    { class: "view view-playground" },
    h("header", { class: "view-head" }, h("div", {}, h("h1", { class: "view-title" }, "Playground"), h("p", { class: "view-subtitle" }, "Requests go through the router like any client's: they start models and show in Activity.")), tabList),
    h("div", { class: "playground" }, h("div", { class: "playground-main" }, chatPanel, completionPanel, embeddingPanel), aside),
  );

  return {
    root,
    title: "Playground",
    show() {
      loadModels();
    },
    hide() {},
  };
}
