// pico's web UI: a chat page over /v1/chat/completions (streamed) and a cluster page
// over /cluster, /slots, /props and /metrics. Conversations and settings stay in the
// browser (localStorage); nothing is loaded from anywhere but this server.
"use strict";

const $ = (id) => document.getElementById(id);
const store = {
  get(key, fallback) {
    try {
      const v = localStorage.getItem("pico." + key);
      return v === null ? fallback : JSON.parse(v);
    } catch {
      return fallback;
    }
  },
  set(key, value) {
    localStorage.setItem("pico." + key, JSON.stringify(value));
  },
};

// ---- settings ----

const kSettings = ["system", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed",
                   "format", "schema", "tools", "tool_choice", "api_key"];
const kDefaults = { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1.0, max_tokens: 512,
                    format: "text", tool_choice: "auto" };
let settings = Object.assign({}, kDefaults, store.get("settings", {}));

function loadSettings() {
  for (const k of kSettings) {
    const el = $("set-" + k);
    if (el) el.value = settings[k] ?? "";
  }
  $("schema-box").hidden = settings.format !== "json_schema";
}

function saveSettings() {
  for (const k of kSettings) settings[k] = $("set-" + k).value;
  $("schema-box").hidden = settings.format !== "json_schema";
  store.set("settings", settings);
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (settings.api_key) h.Authorization = "Bearer " + settings.api_key;
  return h;
}

// The request body of a conversation: its messages and the sampling settings the API takes.
function requestBody(messages) {
  const body = { messages, stream: true, stream_options: { include_usage: true }, timings_per_token: false };
  const number = (k, integer) => {
    const v = settings[k];
    if (v === "" || v === undefined || v === null) return;
    const n = Number(v);
    if (Number.isFinite(n)) body[k] = integer ? Math.trunc(n) : n;
  };
  number("temperature"), number("top_p"), number("min_p"), number("repeat_penalty");
  number("top_k", true), number("max_tokens", true), number("seed", true);
  if (settings.format === "json_object") body.response_format = { type: "json_object" };
  if (settings.format === "json_schema") {
    body.response_format = { type: "json_schema", json_schema: { name: "reply", schema: JSON.parse(settings.schema || "{}") } };
  }
  if (settings.tools && settings.tools.trim()) {
    body.tools = JSON.parse(settings.tools);
    body.tool_choice = settings.tool_choice;
  }
  return body;
}

// ---- conversations ----

let conversations = store.get("conversations", []);
let current = store.get("current", null);

function conversation() {
  return conversations.find((c) => c.id === current);
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
  conversations.unshift(c);
  current = c.id;
  persist();
  render();
}

function persist() {
  store.set("conversations", conversations);
  store.set("current", current);
}

function renderList() {
  const list = $("conversation-list");
  list.replaceChildren();
  for (const c of conversations) {
    const li = document.createElement("li");
    li.className = c.id === current ? "selected" : "";
    const open = document.createElement("span");
    open.textContent = c.title;
    open.onclick = () => {
      current = c.id;
      persist();
      render();
    };
    const remove = document.createElement("button");
    remove.textContent = "×";
    remove.title = "Delete";
    remove.onclick = () => {
      conversations = conversations.filter((x) => x.id !== c.id);
      if (current === c.id) current = conversations[0]?.id ?? null;
      persist();
      render();
    };
    li.append(open, remove);
    list.append(li);
  }
}

function messageElement(m) {
  const div = document.createElement("div");
  div.className = "message " + m.role;
  if (m.reasoning) {
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    const body = document.createElement("div");
    body.className = "reasoning";
    body.textContent = m.reasoning;
    details.append(summary, body);
    div.append(details);
  }
  const content = document.createElement("div");
  content.className = "content";
  content.innerHTML = renderMarkdown(m.content || "");
  div.append(content);
  for (const call of m.tool_calls || []) {
    const pre = document.createElement("pre");
    pre.className = "tool-call";
    pre.textContent = call.function.name + "(" + call.function.arguments + ")";
    div.append(pre);
  }
  if (m.stats) {
    const stats = document.createElement("div");
    stats.className = "stats muted";
    stats.textContent = m.stats;
    div.append(stats);
  }
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren(...(conversation()?.messages ?? []).map(messageElement));
  box.scrollTop = box.scrollHeight;
}

function render() {
  renderList();
  renderMessages();
}

// ---- streaming a reply ----

let controller = null;

function setBusy(busy) {
  $("send").disabled = busy;
  $("regenerate").disabled = busy;
  $("stop").disabled = !busy;
}

// Reads an SSE body, calling onEvent with each data payload parsed as JSON.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data && data !== "[DONE]") onEvent(JSON.parse(data));
      }
    }
  }
}

async function generate() {
  const c = conversation();
  if (!c) return;
  let body;
  try {
    const history = c.messages.map((m) => {
      const out = { role: m.role, content: m.content || "" };
      if (m.tool_calls) out.tool_calls = m.tool_calls;
      return out;
    });
    if (settings.system && settings.system.trim()) history.unshift({ role: "system", content: settings.system });
    body = requestBody(history);
    $("settings-error").textContent = "";
  } catch (e) {
    $("settings-error").textContent = "Settings: " + e.message;
    return;
  }
  const reply = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
  c.messages.push(reply);
  const box = $("messages");
  const element = messageElement(reply);
  element.classList.add("streaming");
  box.append(element);
  setBusy(true);
  $("status").textContent = "generating";
  controller = new AbortController();
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const fresh = messageElement(reply);
      fresh.classList.add("streaming");
      element.replaceChildren(...fresh.childNodes);
      box.scrollTop = box.scrollHeight;
    });
  };
  const started = performance.now();
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error(error?.error?.message || response.statusText);
    }
    await readEvents(response, (chunk) => {
      const delta = chunk.choices?.[0]?.delta;
      if (delta?.content) reply.content += delta.content;
      if (delta?.reasoning_content) reply.reasoning += delta.reasoning_content;
      for (const t of delta?.tool_calls ?? []) {
        const call = (reply.tool_calls[t.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
        if (t.id) call.id = t.id;
        if (t.function?.name) call.function.name += t.function.name;
        if (t.function?.arguments) call.function.arguments += t.function.arguments;
      }
      if (chunk.timings) {
        const t = chunk.timings;
        reply.stats = `${t.predicted_n} tokens, ${t.predicted_per_second.toFixed(1)} tok/s; prompt ${t.prompt_n} tokens, ` +
                      `${t.prompt_per_second.toFixed(1)} tok/s`;
      }
      redraw();
    });
    $("status").textContent = "done";
  } catch (e) {
    $("status").textContent = e.name === "AbortError" ? "stopped" : "error: " + e.message;
    if (e.name !== "AbortError") reply.stats = "error: " + e.message;
  } finally {
    controller = null;
    if (!reply.tool_calls.length) delete reply.tool_calls;
    if (!reply.reasoning) delete reply.reasoning;
    if (!reply.stats) reply.stats = `${((performance.now() - started) / 1000).toFixed(1)} s`;
    persist();
    setBusy(false);
    renderMessages();
  }
}

function send(event) {
  event?.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  if (!conversation()) newConversation();
  const c = conversation();
  if (!c.messages.length) c.title = text.slice(0, 40);
  c.messages.push({ role: "user", content: text });
  $("input").value = "";
  persist();
  render();
  generate();
}

function regenerate() {
  const c = conversation();
  if (!c || controller) return;
  while (c.messages.length && c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
  if (!c.messages.length) return;
  persist();
  renderMessages();
  generate();
}

// ---- cluster page ----

let clusterTimer = null;
let lastTokens = null;
let lastStages = new Map();  // stage -> its totals at the last read, for per-second figures

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

const ms = (v) => (v === null || v === undefined ? "–" : v.toFixed(2) + " ms");
const bytes = (v) => (!v ? "–" : v >= 2 ** 33 ? (v / 2 ** 30).toFixed(1) + " GiB" : (v / (1 << 20)).toFixed(1) + " MiB");

function metricValue(text, name) {
  const m = text.match(new RegExp("^" + name.replace(/[:]/g, "\\$&") + " ([0-9.eE+-]+)$", "m"));
  return m ? Number(m[1]) : null;
}

// A stage's compute / queue / transfer ms per batch and tokens per second since the last
// read (its totals' differences); null until two reads saw batches.
function stageRates(st, at) {
  const before = lastStages.get(st.stage);
  const now = { at, compute: st.compute_seconds, queue: st.queue_seconds, transfer: st.transfer_seconds,
                batches: st.batches, tokens: st.tokens };
  lastStages.set(st.stage, now);
  const out = { compute: null, queue: null, transfer: null, rate: "–" };
  if (!before || now.batches < before.batches) return out;
  const batches = now.batches - before.batches;
  out.rate = ((now.tokens - before.tokens) / Math.max((at - before.at) / 1000, 1e-3)).toFixed(1);
  if (batches > 0) {
    for (const k of ["compute", "queue", "transfer"]) out[k] = ((now[k] - before[k]) / batches) * 1000;
  }
  return out;
}

async function refreshCluster() {
  try {
    const get = (path) => fetch(path, { headers: headers() });
    const [cluster, slots, metrics] = await Promise.all([get("/cluster"), get("/slots"), get("/metrics")]);
    const rows = [];
    if (cluster.status === 404) {
      const tr = document.createElement("tr");
      tr.dataset.stage = "0";
      tr.append(cell("0"), cell("all"), cell("in-process"), cell("up"), cell("this process"), cell(""), cell(""),
                ...Array.from({ length: 10 }, () => cell("")));
      rows.push(tr);
    } else {
      const view = await cluster.json();
      const at = performance.now();
      for (const st of view.stages) {
        const live = stageRates(st, at);
        for (const w of st.workers) {
          const tr = document.createElement("tr");
          tr.dataset.stage = String(st.stage);
          tr.className = (w.up ? "up" : "down") + (w.active ? " active" : " replica");
          const mine = (text) => cell(w.active ? text : "");
          const memory = st.memory
            ? `${bytes(st.memory.used_bytes)} (KV ${bytes(st.memory.kv_bytes)}) / ${bytes(st.memory.free_bytes)}`
            : "–";
          tr.append(cell(String(st.stage)), cell(st.layers), cell(w.address + (w.active ? "" : " (replica)")),
                    cell(w.up ? "up" : "down"), cell([w.backend, w.isa].filter(Boolean).join(" / ")), cell(w.device || ""),
                    cell(String(w.threads)), cell(bytes(w.memory_bytes)), mine(memory), mine(ms(live.compute)),
                    mine(ms(live.queue)), mine(ms(live.transfer)), mine(live.rate), cell(ms(w.round_trip_ms)),
                    cell(ms(w.decode_ms)), cell(ms(w.batch_ms_per_token)));
          rows.push(tr);
        }
      }
      $("cluster-summary").dataset.failovers = view.failovers;
    }
    $("stages").tBodies[0].replaceChildren(...rows);
    const slotRows = [];
    for (const s of slots.ok ? await slots.json() : []) {
      if (!s.is_processing) continue;
      const tr = document.createElement("tr");
      tr.append(cell(String(s.id)), cell(s.state), cell(String(s.n_prompt_tokens ?? "")), cell(String(s.n_decoded ?? "")));
      slotRows.push(tr);
    }
    $("slots").tBodies[0].replaceChildren(...slotRows);
    const text = metrics.ok ? await metrics.text() : "";
    const predicted = metricValue(text, "llamacpp:tokens_predicted_total");
    const now = performance.now();
    let rate = "";
    if (predicted !== null && lastTokens) {
      rate = ((predicted - lastTokens.value) / ((now - lastTokens.at) / 1000)).toFixed(1) + " tok/s now";
    }
    if (predicted !== null) lastTokens = { value: predicted, at: now };
    $("cluster-summary").textContent =
      `${rows.length} worker(s) in ${new Set(rows.map((r) => r.dataset.stage)).size} stage(s); ` +
      `${slotRows.length} request(s) in flight; ${predicted ?? 0} tokens generated` + (rate ? "; " + rate : "");
    $("cluster-error").textContent = "";
  } catch (e) {
    $("cluster-error").textContent = "cannot read the cluster: " + e.message;
  }
}

// ---- activation heatmap ----

const kHeatmapColumns = 240;
let heatmap = { controller: null, columns: [], total: 0 };

// Dark blue (low) to yellow (high).
function heatColor(t) {
  const stops = [[13, 8, 135], [126, 3, 168], [204, 71, 120], [248, 149, 64], [240, 249, 33]];
  const x = Math.min(0.9999, Math.max(0, t)) * (stops.length - 1);
  const i = Math.floor(x), f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function drawHeatmap() {
  const canvas = $("heatmap");
  const g = canvas.getContext("2d");
  g.fillStyle = "#111";
  g.fillRect(0, 0, canvas.width, canvas.height);
  const columns = heatmap.columns;
  if (!columns.length) return;
  const layers = columns[0].rms.length;
  let lo = Infinity, hi = -Infinity;
  for (const c of columns) {
    for (const v of c.rms) {
      if (v === null || !(v > 0)) continue;
      lo = Math.min(lo, Math.log(v));
      hi = Math.max(hi, Math.log(v));
    }
  }
  const w = canvas.width / kHeatmapColumns, h = canvas.height / layers;
  const x0 = canvas.width - columns.length * w;
  columns.forEach((c, x) => {
    c.rms.forEach((v, layer) => {
      if (v === null || !(v > 0)) return;
      g.fillStyle = heatColor(hi > lo ? (Math.log(v) - lo) / (hi - lo) : 0.5);
      g.fillRect(x0 + x * w, layer * h, Math.ceil(w), Math.ceil(h));
    });
  });
  canvas.dataset.tokens = String(heatmap.total);
  $("heatmap-info").textContent = `${heatmap.total} tokens traced; ${layers} layers; RMS ${Math.exp(lo).toFixed(3)} to ` +
                                  `${Math.exp(hi).toFixed(3)}`;
}

async function startHeatmap() {
  stopHeatmap();
  const controller = new AbortController();
  heatmap.controller = controller;
  try {
    const response = await fetch("/layer-trace", { headers: headers(), signal: controller.signal });
    if (!response.ok) throw new Error(response.statusText);
    await readEvents(response, (event) => {
      for (const t of event.tokens) heatmap.columns.push(t);
      heatmap.total += event.tokens.length;
      if (heatmap.columns.length > kHeatmapColumns) heatmap.columns.splice(0, heatmap.columns.length - kHeatmapColumns);
      requestAnimationFrame(drawHeatmap);
    });
  } catch (e) {
    if (e.name !== "AbortError") $("heatmap-info").textContent = "no activation stream: " + e.message;
  }
}

function stopHeatmap() {
  heatmap.controller?.abort();
  heatmap.controller = null;
}

// ---- views ----

function showView() {
  const cluster = location.hash === "#cluster";
  $("view-chat").hidden = cluster;
  $("view-cluster").hidden = !cluster;
  $("nav-chat").classList.toggle("selected", !cluster);
  $("nav-cluster").classList.toggle("selected", cluster);
  clearInterval(clusterTimer);
  clusterTimer = null;
  stopHeatmap();  // the engine traces tokens only while someone watches
  if (cluster) {
    refreshCluster();
    clusterTimer = setInterval(refreshCluster, 1000);
    drawHeatmap();
    startHeatmap();
  }
}

async function start() {
  loadSettings();
  for (const k of kSettings) $("set-" + k).addEventListener("change", saveSettings);
  $("composer").addEventListener("submit", send);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) send(e);
  });
  $("stop").onclick = () => controller?.abort();
  $("regenerate").onclick = regenerate;
  $("new-chat").onclick = newConversation;
  window.addEventListener("hashchange", showView);
  if (!conversation()) current = conversations[0]?.id ?? null;
  render();
  showView();
  setBusy(false);
  try {
    const props = await (await fetch("/props", { headers: headers() })).json();
    $("model-name").textContent = (props.model_alias || props.model_path || "") + (props.chat_template ? " · " + props.chat_template : "");
  } catch {
    // the page works without it
  }
}

start();
