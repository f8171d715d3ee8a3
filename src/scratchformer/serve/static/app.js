// scratchformer serve: one tab per loaded model; every request goes to the server's own v1/ API
// (the "copy as curl" box shows it), nothing is fetched from anywhere else. Every path is relative
// to the page, so that the page works behind a proxy that serves it under a prefix (--root-path).
"use strict";

const state = { key: localStorage.getItem("scratchformer-api-key") || "" };
const $ = (root, selector) => root.querySelector(selector);

// ------------------------------------------------------------------------------------ requests

// quiet: the page's own follow-up requests (attention) leave the curl box showing the user's request.
async function api(path, body, form, quiet = false) {
  const init = { method: body || form ? "POST" : "GET", headers: {} };
  if (state.key) init.headers.Authorization = "Bearer " + state.key;
  if (body) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  if (form) init.body = form;
  if ((body || form) && !quiet) showCurl(path, body, form);
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) {
    const error = new Error(`${response.status}: ${data.error || response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

function showCurl(path, body, form) {
  const quote = (s) => "'" + String(s).replace(/'/g, "'\\''") + "'";
  let command = `curl -s ${new URL(path, document.baseURI)}`;
  if (state.key) command += ` -H "Authorization: Bearer $SCRATCHFORMER_API_KEY"`;
  if (body) command += ` -H 'Content-Type: application/json' -d ${quote(JSON.stringify(body))}`;
  if (form) {
    for (const [name, value] of form.entries()) {
      command += value instanceof File ? ` -F ${quote(name + "=@" + value.name)}` : ` -F ${quote(name + "=" + value)}`;
    }
  }
  document.getElementById("curl").textContent = command;
}

function debounce(fn, ms) {
  let timer = null;
  return (...args) => { clearTimeout(timer); timer = setTimeout(() => fn(...args), ms); };
}

function showError(element, error) {
  element.textContent = error.message;
  element.classList.add("error");
}

// ------------------------------------------------------------------------------------ drawing

// A heat map of a (rows x cols) matrix on a canvas; with labels when cell >= 12 px.
function matrix(weights, rowLabels, colLabels, cell, title) {
  const labelled = cell >= 12;
  const left = labelled ? 90 : 0, top = labelled ? 70 : 0;
  const canvas = document.createElement("canvas");
  canvas.width = left + cell * colLabels.length + (labelled ? 40 : 0);  // room for the last slanted label
  canvas.height = top + cell * rowLabels.length;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, canvas.width, canvas.height);
  weights.forEach((row, i) => row.forEach((w, j) => {
    g.fillStyle = `rgba(33, 82, 170, ${Math.min(1, w)})`;
    g.fillRect(left + j * cell, top + i * cell, cell - 1, cell - 1);
  }));
  if (labelled) {
    g.fillStyle = "#222";
    g.font = "11px sans-serif";
    g.textAlign = "right";
    rowLabels.forEach((t, i) => g.fillText(t, left - 4, top + i * cell + cell * 0.7));
    colLabels.forEach((t, j) => {
      g.save();
      g.translate(left + j * cell + cell * 0.7, top - 4);
      g.rotate(-Math.PI / 3);
      g.textAlign = "left";
      g.fillText(t, 0, 0);
      g.restore();
    });
  }
  const box = document.createElement("div");
  box.className = "cell";
  box.append(canvas, Object.assign(document.createElement("div"), { textContent: title }));
  return box;
}

// bertviz's head view: queries on the left, keys on the right, a line per pair, as opaque as its
// weight, coloured by head; hovering a query shows its lines alone.
function headView(weights, queries, keys) {
  const ns = "http://www.w3.org/2000/svg", rowH = 20, width = 480;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", rowH * Math.max(queries.length, keys.length) + 10);
  const colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
  const lines = [];
  weights.forEach((head, h) => head.forEach((row, i) => row.forEach((w, j) => {
    if (w < 0.02) return;
    const line = document.createElementNS(ns, "line");
    Object.entries({ x1: 130, y1: i * rowH + 14, x2: width - 130, y2: j * rowH + 14 })
      .forEach(([k, v]) => line.setAttribute(k, v));
    line.setAttribute("stroke", colours[h % colours.length]);
    line.setAttribute("stroke-opacity", Math.min(1, w));
    line.setAttribute("stroke-width", 2);
    line.dataset.query = i;
    lines.push(line);
    svg.append(line);
  })));
  const text = (label, x, y, anchor, query) => {
    const t = document.createElementNS(ns, "text");
    Object.entries({ x, y, "text-anchor": anchor }).forEach(([k, v]) => t.setAttribute(k, v));
    t.textContent = label;
    if (query !== undefined) {
      t.addEventListener("mouseenter", () => lines.forEach((l) => { l.style.display = l.dataset.query == query ? "" : "none"; }));
      t.addEventListener("mouseleave", () => lines.forEach((l) => { l.style.display = ""; }));
    }
    svg.append(t);
  };
  queries.forEach((q, i) => text(q, 124, i * rowH + 18, "end", i));
  keys.forEach((k, j) => text(k, width - 124, j * rowH + 18, "start"));
  return svg;
}

// ------------------------------------------------------------------------------------ translation

const LABELS = {  // (rows, columns) of each kind of attention
  "encoder.self_attn": (d) => [d.source, d.source],
  "decoder.self_attn": (d) => [d.predicted, d.prefix],
  "decoder.cross_attn": (d) => [d.predicted, d.source],
};

function translationPanel(panel, model) {
  const source = $(panel, ".source"), output = $(panel, ".translation"), beam = $(panel, ".beam");
  const attention = $(panel, ".attention"), figure = $(panel, ".figure");
  const kind = $(panel, ".kind"), view = $(panel, ".view"), layer = $(panel, ".layer"), head = $(panel, ".head");
  let current = null;  // the sentence shown: its attention, fetched one layer at a time

  async function fetchLayer(l) {
    const asked = current;
    if (!asked.layers[l]) {
      const body = { inputs: asked.text, parameters: asked.parameters, model: model.id, layer: l };
      asked.layers[l] = api("v1/attention", body, null, true);
    }
    return asked.layers[l];
  }

  async function draw() {
    const shown = current;
    figure.replaceChildren();
    const first = await fetchLayer(0);
    panel.querySelectorAll(".heads-only").forEach((box) => { box.hidden = view.value !== "heads"; });
    if (view.value === "heads") {
      const found = await fetchLayer(+layer.value);
      const w = found.weights[kind.value][layer.value];
      const [rows, cols] = LABELS[kind.value](found);
      const heads = head.value === "all" ? w : w && [w[+head.value]];
      if (w && shown === current) figure.append(headView(heads, rows, cols));
      return;
    }
    const table = document.createElement("table"), detail = document.createElement("div");
    table.className = "grid-table";
    detail.className = "detail";
    figure.append(table, detail);
    const [rows, cols] = LABELS[kind.value](first);
    for (let l = 0; l < first.layers; l++) {
      const found = await fetchLayer(l);
      if (shown !== current) return;
      const tr = table.insertRow();
      tr.insertCell().textContent = `layer ${l}`;
      const w = found.weights[kind.value][String(l)];
      (w || []).forEach((weights, h) => {
        const small = matrix(weights, rows, cols, 8, `head ${h}`);
        small.title = "click: this head, labelled";
        small.addEventListener("click", () => detail.replaceChildren(matrix(weights, rows, cols, 16, `layer ${l}, head ${h}`)));
        tr.insertCell().append(small);
      });
    }
    const big = (first.weights[kind.value]["0"] || [])[0];
    if (big && !detail.firstChild) detail.append(matrix(big, rows, cols, 16, "layer 0, head 0 (click any head)"));
  }

  const run = debounce(async () => {
    const text = source.value.trim();
    if (!text) return;
    const parameters = { num_beams: Math.max(1, +beam.value || 1) };
    try {
      const [answer] = await api("v1/translate", { inputs: text, parameters, model: model.id });
      output.textContent = answer.translation_text;
      output.classList.remove("error");
      current = { text, parameters, layers: {} };
      const first = await fetchLayer(0);
      layer.replaceChildren(...Array.from({ length: first.layers }, (_, l) => new Option(`${l}`, `${l}`)));
      head.replaceChildren(new Option("all", "all"), ...Array.from({ length: first.heads }, (_, h) => new Option(`${h}`, `${h}`)));
      attention.hidden = false;
      await draw();
    } catch (error) { showError(output, error); }
  }, 400);
  source.addEventListener("input", run);
  beam.addEventListener("change", run);
  [kind, view, layer, head].forEach((s) => s.addEventListener("change", () => current && draw().catch((e) => showError(output, e))));
}

// ------------------------------------------------------------------------------------ the other kinds

function classifierPanel(panel, model) {
  const source = $(panel, ".source"), bars = $(panel, ".bars");
  source.addEventListener("input", debounce(async () => {
    if (!source.value.trim()) return;
    try {
      const [answer] = await api("v1/classify", { inputs: source.value, model: model.id });
      bars.classList.remove("error");
      bars.replaceChildren(...Object.entries(answer.scores).sort((a, b) => b[1] - a[1]).map(([label, p]) => {
        const bar = document.createElement("div");
        bar.className = "bar";
        bar.innerHTML = `<span class="label"></span><span class="fill"></span><span class="p"></span>`;
        bar.children[0].textContent = label;
        bar.children[1].style.width = `${Math.round(300 * p)}px`;
        bar.children[2].textContent = p.toFixed(3);
        return bar;
      }));
    } catch (error) { showError(bars, error); }
  }, 300));
}

function captionPanel(panel, model) {
  const drop = $(panel, ".drop"), file = $(panel, ".file"), output = $(panel, ".caption");
  const canvas = $(panel, ".photo"), words = $(panel, ".words");
  async function caption(photo) {
    const form = new FormData();
    form.append("image", photo);
    form.append("model", model.id);
    try {
      const found = await api("v1/caption/attention", null, form);
      output.textContent = found.generated_text;
      output.classList.remove("error");
      const image = new Image();
      image.onload = () => {
        const paint = (i) => {
          const g = canvas.getContext("2d");
          g.drawImage(image, 0, 0, canvas.width, canvas.height);
          if (i === null) return;
          const w = found.attention[i], most = Math.max(...w), side = canvas.width / found.grid;
          w.forEach((v, k) => {
            g.fillStyle = `rgba(0, 0, 0, ${0.75 * (1 - v / most)})`;
            g.fillRect((k % found.grid) * side, Math.floor(k / found.grid) * side, side, side);
          });
        };
        words.replaceChildren(...found.words.map((word, i) => {
          const span = document.createElement("span");
          span.textContent = word;
          span.addEventListener("mouseenter", () => { paint(i); span.classList.add("on"); });
          span.addEventListener("mouseleave", () => { paint(null); span.classList.remove("on"); });
          return span;
        }));
        paint(null);
      };
      image.src = found.image;
    } catch (error) { showError(output, error); }
  }
  file.addEventListener("change", () => file.files[0] && caption(file.files[0]));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files[0]) caption(e.dataTransfer.files[0]);
  });
}

function embeddingPanel(panel, model) {
  const source = $(panel, ".source"), figure = $(panel, ".figure");
  $(panel, ".go").addEventListener("click", async () => {
    const lines = source.value.split("\n").map((s) => s.trim()).filter(Boolean);
    if (!lines.length) return;
    try {
      const answers = await api("v1/embed", { inputs: lines, model: model.id });
      const unit = answers.map((a) => {
        const norm = Math.hypot(...a.embedding) || 1;
        return a.embedding.map((x) => x / norm);
      });
      const cosine = unit.map((u) => unit.map((v) => u.reduce((s, x, k) => s + x * v[k], 0)));
      const short = lines.map((s) => (s.length > 14 ? s.slice(0, 13) + "…" : s));
      figure.classList.remove("error");
      figure.replaceChildren(matrix(cosine.map((r) => r.map((c) => Math.max(0, c))), short, short, 40, "cosine similarity"));
      const table = document.createElement("table");
      cosine.forEach((r) => { const tr = table.insertRow(); r.forEach((c) => { tr.insertCell().textContent = c.toFixed(3); }); });
      figure.append(table);
    } catch (error) { showError(figure, error); }
  });
}

const PANELS = { translation: translationPanel, text_classifier: classifierPanel, captioning: captionPanel, embedding: embeddingPanel };

// ------------------------------------------------------------------------------------ tabs

async function start() {
  const status = document.getElementById("status");
  let models;
  try {
    for (;;) {  // the models load after the server starts: wait for /ready
      const ready = await fetch("ready"), body = await ready.json();
      if (ready.ok) break;
      if (body.error) throw new Error(body.error);
      status.textContent = `${body.status}…`;
      await new Promise((r) => setTimeout(r, 500));
    }
    models = (await api("v1/models")).data;
  } catch (error) {
    status.textContent = error.message;
    if (error.status === 401) document.getElementById("key-box").hidden = false;
    return;
  }
  status.textContent = `${models.length} model${models.length === 1 ? "" : "s"}`;
  const tabs = document.getElementById("tabs"), panels = document.getElementById("panels");
  tabs.replaceChildren();
  panels.replaceChildren();
  models.forEach((model, i) => {
    const template = document.getElementById(`${model.kind}-panel`);
    if (!template) return;
    const panel = template.content.firstElementChild.cloneNode(true);
    panel.id = `panel-${model.id}`;
    panel.hidden = i > 0;
    PANELS[model.kind](panel, model);
    panels.append(panel);
    const tab = Object.assign(document.createElement("button"), { textContent: `${model.id} (${model.kind})` });
    tab.setAttribute("role", "tab");
    tab.setAttribute("aria-selected", String(i === 0));
    tab.addEventListener("click", () => {
      tabs.querySelectorAll("button").forEach((b) => b.setAttribute("aria-selected", String(b === tab)));
      panels.querySelectorAll(".panel").forEach((p) => { p.hidden = p !== panel; });
    });
    tabs.append(tab);
  });
}

document.getElementById("api-key").addEventListener("change", (e) => {
  state.key = e.target.value;
  localStorage.setItem("scratchformer-api-key", state.key);
  document.getElementById("key-box").hidden = true;
  start();
});
document.getElementById("copy-curl").addEventListener("click", () => {
  navigator.clipboard?.writeText(document.getElementById("curl").textContent);
});
start();
