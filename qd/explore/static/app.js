// qd explore: the page's script (the project's own code, MIT; no libraries).
// It reads the JSON API of qd.explore.app and draws the heatmap on a canvas and the
// curves as inline SVG. It polls /api/version and refreshes what a live run changed.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = {
  runs: [], run: 0, island: 0, x: 0, y: 1, tab: "archive", versions: null,
  raster: null, selected: null, search: { offset: 0, limit: 50, total: 0 },
};

// ----- helpers -------------------------------------------------------------------------

async function api(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response.json();
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "onclick") node.addEventListener("click", v);
    else if (k === "html") node.innerHTML = v; // only Pygments' output, which escapes the text
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    if (v === 0) return "0"; // also -0
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : v.toFixed(digits).replace(/\.?0+$/, "");
  }
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function table(node, columns, rows, onclick) {
  node.replaceChildren(
    el("thead", {}, el("tr", {}, columns.map(([key, label, num]) => el("th", { class: num ? "num" : "" }, label || key)))),
    el("tbody", {}, rows.map((row) => el("tr", { class: onclick ? "clickable" : "", "data-id": row.id ?? null,
      onclick: onclick ? () => onclick(row) : null },
      columns.map(([key, , num, f]) => el("td", { class: num ? "num" : "" }, f ? f(row[key], row) : fmt(row[key])))))),
  );
}

function showError(where, error) {
  where.replaceChildren(el("p", { class: "error" }, String(error.message || error)));
}

// Viridis, five stops, interpolated: light for high fitness, dark for low.
const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function colour(t) {
  const s = Math.min(Math.max(t, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(s), STOPS.length - 2);
  const f = s - i;
  return STOPS[i].map((c, k) => Math.round(c + f * (STOPS[i + 1][k] - c)));
}

// ----- the run -----------------------------------------------------------------------

function run() { return state.runs[state.run]; }

function renderSummary() {
  const r = run();
  const items = [
    ["run", r.name], ["archive", `${r.kind} · ${r.cells.toLocaleString("en-US")} cells · ${r.dim}-D`],
    ["islands", r.islands], ["evaluations", r.evaluations],
    ["elites", r.elites.reduce((a, b) => a + b, 0)], ["best", r.best ? fmt(r.best.fitness) : "–"],
    ["model calls", r.llm_calls], ["cost", fmt(r.cost)],
  ];
  if (r.pareto) items.splice(6, 0, ["hypervolume", r.hypervolume ? fmt(r.hypervolume.total) : "–"]);
  $("#summary").replaceChildren(...items.map(([k, v]) => el("div", {}, el("b", {}, k), fmt(v))));
}

function setupRun() {
  const r = run();
  state.island = Math.min(state.island, r.islands - 1);
  state.x = 0;
  state.y = r.dim > 1 ? 1 : null;
  $("#islands").replaceChildren(...Array.from({ length: r.islands }, (_, i) =>
    el("button", { "data-island": i, class: i === state.island ? "active" : "", onclick: () => pickIsland(i) },
      `island ${i}`)));
  const pick = $("#axis-pick");
  pick.hidden = r.dim <= 2;
  for (const [id, value] of [["#axis-x", state.x], ["#axis-y", state.y]]) {
    $(id).replaceChildren(...r.axes.map((name, a) => el("option", { value: a }, `${a}: ${name}`)));
    $(id).value = value;
  }
  $("#search-operator").replaceChildren(el("option", { value: "" }, "any operator"),
    ...r.operators.map((o) => el("option", { value: o }, o)));
  $("#search-island").replaceChildren(el("option", { value: "" }, "any island"),
    ...Array.from({ length: r.islands }, (_, i) => el("option", { value: i }, `island ${i}`)));
  renderSummary();
}

function pickIsland(i) {
  state.island = i;
  for (const b of document.querySelectorAll("#islands button")) b.classList.toggle("active", +b.dataset.island === i);
  drawHeatmap();
}

// ----- the heatmap ---------------------------------------------------------------------

async function drawHeatmap() {
  const r = run();
  const query = `island=${state.island}&x=${state.x}` + (state.y === null ? "" : `&y=${state.y}`);
  const response = await fetch(`/api/run/${state.run}/heatmap?${query}`, { cache: "no-store" });
  if (!response.ok) { $("#hover").textContent = (await response.json()).error; return; }
  const w = +response.headers.get("X-QD-Width"), h = +response.headers.get("X-QD-Height");
  const low = parseFloat(response.headers.get("X-QD-Min")), high = parseFloat(response.headers.get("X-QD-Max"));
  const buffer = await response.arrayBuffer();
  const values = new Float32Array(buffer, 0, w * h), cells = new Int32Array(buffer, 4 * w * h, w * h);
  state.raster = { w, h, values, cells };
  const image = new ImageData(w, h);
  const span = high > low ? high - low : 1;
  for (let p = 0; p < w * h; p++) {
    const v = values[p];
    const [cr, cg, cb] = Number.isNaN(v) ? [228, 230, 234] : colour((v - low) / span);
    image.data.set([cr, cg, cb, 255], 4 * p);
  }
  const source = el("canvas", { width: w, height: h });
  source.getContext("2d").putImageData(image, 0, 0);
  const canvas = $("#heatmap");
  const side = 512;
  canvas.width = w >= h ? side : Math.max(Math.round(side * w / h), 48);
  canvas.height = w >= h ? Math.max(Math.round(side * h / w), 48) : side;
  Object.assign(canvas.dataset, { run: state.run, island: state.island, width: w, height: h,
    x: state.x, y: state.y ?? "", filled: values.filter((v) => !Number.isNaN(v)).length });
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(source, 0, 0, canvas.width, canvas.height);
  $("#axis-label-x").textContent = `${r.axes[state.x]} (${fmt(r.lower[state.x])} … ${fmt(r.upper[state.x])})`;
  $("#axis-label-y").textContent = state.y === null ? "" : `${r.axes[state.y]} (${fmt(r.lower[state.y])} … ${fmt(r.upper[state.y])})`;
  const legend = $("#legend").getContext("2d");
  for (let i = 0; i < 200; i++) { legend.fillStyle = `rgb(${colour(i / 199)})`; legend.fillRect(i, 0, 1, 12); }
  $("#legend-min").textContent = fmt(Number.isNaN(low) ? null : low);
  $("#legend-max").textContent = fmt(Number.isNaN(high) ? null : high);
}

function pixelAt(event) {
  const canvas = $("#heatmap"), rect = canvas.getBoundingClientRect(), r = state.raster;
  if (!r) return -1;
  const col = Math.floor((event.clientX - rect.left - canvas.clientLeft) / canvas.clientWidth * r.w);
  const row = Math.floor((event.clientY - rect.top - canvas.clientTop) / canvas.clientHeight * r.h);
  return col >= 0 && col < r.w && row >= 0 && row < r.h ? row * r.w + col : -1;
}

$("#heatmap").addEventListener("mousemove", (event) => {
  const p = pixelAt(event);
  if (p < 0) return;
  const cell = state.raster.cells[p];
  $("#hover").textContent = cell < 0 ? "empty" : `cell ${cell} · fitness ${fmt(state.raster.values[p])}`;
});

$("#heatmap").addEventListener("click", (event) => {
  const p = pixelAt(event);
  if (p >= 0 && state.raster.cells[p] >= 0) {
    select({ run: state.run, island: state.island, cell: state.raster.cells[p] });
    if (run().pareto) drawFront(state.island, state.raster.cells[p]);
  }
});

// ----- a Pareto run's front ------------------------------------------------------------------

// The cell's front (GET /front) as points in its first two objectives, own units; a click shows that member.
async function drawFront(island, cell) {
  const box = $("#front");
  try {
    const f = await api(`/api/run/${state.run}/front?island=${island}&cell=${cell}`);
    box.replaceChildren(frontChart(f));
    Object.assign(box.dataset, { island, cell, members: f.members.length });
  } catch (error) {
    showError(box, error);
  }
}

function frontChart(f) {
  const W = 360, H = 220, L = 60, R = 14, T = 12, B = 30;
  const [svg, add] = svgOf(W, H);
  const x = f.members.map((m) => m.values[0]), y = f.members.map((m) => (m.values.length > 1 ? m.values[1] : 0));
  const range = (v) => { const lo = Math.min(...v), hi = Math.max(...v); return hi > lo ? [lo, hi] : [lo - 0.5, hi + 0.5]; };
  const [x0, x1] = range(x), [y0, y1] = range(y);
  const sx = (v) => L + 10 + (v - x0) / (x1 - x0) * (W - L - R - 20);
  const sy = (v) => T + 10 + (1 - (v - y0) / (y1 - y0)) * (H - T - B - 20);
  const [xName, yName] = [f.objectives[0], f.objectives[1] || ["", ""]].map(([n, d]) => (n ? `${n} (${d})` : ""));
  add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d8dce2" });
  add("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#d8dce2" });
  add("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle", "font-size": 11, fill: "#68707c" }, xName);
  add("text", { x: 12, y: (T + H - B) / 2, "font-size": 11, fill: "#68707c", transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle" }, yName);
  f.members.forEach((m, i) => {
    const dot = add("circle", { cx: sx(x[i]).toFixed(1), cy: sy(y[i]).toFixed(1), r: 6, fill: "#2456a6", class: "front-point", "data-id": m.id });
    dot.append(Object.assign(document.createElementNS("http://www.w3.org/2000/svg", "title"),
      { textContent: `#${m.id}: ` + m.values.map((v, k) => `${f.objectives[k][0]} ${fmt(v)}`).join(", ") }));
    dot.addEventListener("click", () => select({ run: state.run, id: m.id }));
  });
  return el("div", { class: "chart" },
    el("h4", {}, `front of island ${f.island} cell ${f.cell}: ${f.members.length} members, hypervolume ${fmt(f.hypervolume)}`),
    svg, el("div", { class: "muted" }, "click a point to see that member"));
}

for (const id of ["#axis-x", "#axis-y"]) {
  $(id).addEventListener("change", () => {
    state.x = +$("#axis-x").value;
    state.y = +$("#axis-y").value;
    drawHeatmap();
  });
}

// ----- the detail panel -------------------------------------------------------------------

// What the panel shows: {run, island, cell} (the cell's elite now) or {run, id}.
async function select(what) {
  state.selected = what;
  const panel = $("#detail");
  try {
    const c = what.cell !== undefined
      ? await api(`/api/run/${what.run}/cell?island=${what.island}&cell=${what.cell}`)
      : await api(`/api/run/${what.run}/candidate/${what.id}`);
    const lineage = await api(`/api/run/${what.run}/lineage/${c.id}`);
    if (state.selected !== what) return; // another click came first
    renderCandidate(panel, what.run, c, lineage);
  } catch (error) {
    showError(panel, error);
  }
}

function section(title, ...content) { return [el("h3", {}, title), ...content]; }

function renderCandidate(panel, runIndex, c, lineage) {
  const where = c.elite.length
    ? c.elite.map(([i, k]) => `island ${i} cell ${k}`).join(", ") : "not an elite now (evicted or never placed)";
  const facts = [
    ["fitness", fmt(c.fitness, 6)], ["valid", c.valid ? "yes" : "no"], ["elite at", where],
    ["descriptor", c.descriptor ? c.descriptor.map((v) => fmt(v)).join(", ") : "–"],
    ["born on island", c.island], ["operator", c.operator || "–"], ["model", c.model || "–"],
    ["parents", c.parent_ids.length ? c.parent_ids.map((p) => `#${p}`).join(", ") : "none (founder)"],
    ["tokens", `${c.tokens_in} in · ${c.tokens_out} out`], ["cost", fmt(c.cost)],
    ["evaluation", c.eval_seconds === null ? "–" : `${fmt(c.eval_seconds, 3)} s`],
  ];
  if (c.cell) facts.splice(3, 0, ["cell", `island ${c.cell.island} cell ${c.cell.cell} (archive fitness ${fmt(c.cell.fitness, 6)})`]);
  if (c.instruction !== null) facts.push(["instruction", `#${c.instruction}`]);
  const kv = (pairs) => el("dl", { class: "kv" }, pairs.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const body = [el("h2", { id: "detail-title" }, `#${c.id}`, el("span", { class: "tag" }, c.genome || c.kind)), kv(facts)];
  if (c.error) body.push(...section("error", el("div", { class: "error", id: "detail-error" }, c.error)));
  body.push(...section(c.kind === "text" ? "text" : "vector", c.kind === "text"
    ? el("pre", { class: "hl", id: "detail-text", html: c.html })
    : el("pre", { id: "detail-text" }, c.vector.map((v) => fmt(v, 6)).join(", "))));
  if (c.metrics && Object.keys(c.metrics).length) body.push(...section("metrics", kv(Object.entries(c.metrics).map(([k, v]) => [k, fmt(v, 6)]))));
  if (c.artifacts && Object.keys(c.artifacts).length) {
    body.push(...section("evaluator feedback", kv(Object.entries(c.artifacts).map(([k, v]) =>
      [k, el("pre", {}, typeof v === "string" ? v : JSON.stringify(v, null, 1))]))));
  }
  body.push(...section("diff against its parent", c.diff_html
    ? el("pre", { class: "hl", id: "detail-diff", html: c.diff_html })
    : el("p", { class: "muted", id: "detail-diff" }, c.parent_ids.length ? "no change or no text" : "a founder: no parent")));
  body.push(...section("lineage (oldest first)", el("ol", { class: "lineage", id: "detail-lineage" }, lineage.map((step) =>
    el("li", { class: step.id === c.id ? "current" : "" },
      step.missing ? `#${step.id} (not in the store)` : [
        el("a", { "data-id": step.id, onclick: () => select({ run: runIndex, id: step.id }) }, `#${step.id}`),
        ` ${step.operator || ""} · ${fmt(step.fitness)}`,
        step.elite ? el("span", { class: "tag elite" }, `elite i${step.elite[0]} c${step.elite[1]}`)
          : el("span", { class: "tag evicted" }, step.valid ? "evicted" : "invalid"),
      ])))));
  if (c.prompt) {
    const messages = Array.isArray(c.prompt) ? c.prompt : [{ role: "prompt", content: c.prompt }];
    body.push(el("details", { id: "detail-prompt" }, el("summary", {}, `prompt (${messages.length} messages)`),
      messages.map((m) => [el("div", { class: "muted" }, m.role), el("pre", {}, typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 1))])));
  }
  if (c.response) body.push(el("details", { id: "detail-response" }, el("summary", {}, "the model's answer"), el("pre", {}, c.response)));
  if (c.trace && c.trace.length) {
    body.push(el("details", { id: "detail-trace", open: "" }, el("summary", {}, `model calls made while evaluated (${c.trace.length})`),
      c.trace.map((call) => [el("div", { class: "muted" }, `call ${call.n ?? ""} · ${call.model || ""}${call.cached ? " · cached" : ""}`),
        el("pre", {}, (call.messages || []).map((m) => `[${m.role}] ${m.content}`).join("\n\n")),
        call.error ? el("div", { class: "error" }, call.error) : el("pre", {}, call.text ?? "")])));
  }
  panel.dataset.candidate = c.id;
  panel.replaceChildren(...body);
}

// ----- curves ---------------------------------------------------------------------------------

const CURVES = [["qd_score", "QD score"], ["coverage", "coverage"], ["max_fitness", "best fitness"]];
const LINE_COLOURS = ["#1d232b", "#2456a6", "#d9822b", "#2e9e5b", "#b3261e", "#7b4fc9", "#8c6d1f", "#d14f9b"];

// An SVG element W x H that scales to its column, and add(tag, attrs, text) appending a child (returned).
function svgOf(W, H) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", "100%"); svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.append(n);
    return n;
  };
  return [svg, add];
}

// An inline SVG chart of series [{label, xs, ys}] (ys may hold nulls: gaps).
function chart(title, series) {
  const W = 560, H = 180, L = 60, R = 10, T = 8, B = 24;
  const xs = series.flatMap((s) => s.xs), ys = series.flatMap((s) => s.ys.filter((v) => v !== null));
  const [svg, add] = svgOf(W, H);
  if (!xs.length || !ys.length) {
    add("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#68707c" }, "no points yet");
  } else {
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = (x) => L + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - L - R);
    const sy = (y) => T + (y1 > y0 ? 1 - (y - y0) / (y1 - y0) : 0.5) * (H - T - B);
    add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d8dce2" });
    add("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#d8dce2" });
    for (const [v, y] of [[y1, T + 10], [y0, H - B]]) add("text", { x: L - 4, y, "text-anchor": "end", "font-size": 11, fill: "#68707c" }, fmt(+v.toPrecision(4)));
    add("text", { x: L, y: H - 6, "font-size": 11, fill: "#68707c" }, fmt(x0));
    add("text", { x: W - R, y: H - 6, "text-anchor": "end", "font-size": 11, fill: "#68707c" }, `${fmt(x1)} evaluations`);
    series.forEach((s, k) => {
      let d = "", pen = "M";
      s.xs.forEach((x, i) => {
        if (s.ys[i] === null) { pen = "M"; return; }
        d += `${pen}${sx(x).toFixed(1)},${sy(s.ys[i]).toFixed(1)} `;
        pen = "L";
      });
      add("path", { d, fill: "none", stroke: LINE_COLOURS[k % LINE_COLOURS.length], "stroke-width": k ? 1.2 : 2 });
    });
  }
  return el("div", { class: "chart" }, el("h4", {}, title), svg,
    el("div", { class: "keys" }, series.map((s, k) => el("span", { style: `color:${LINE_COLOURS[k % LINE_COLOURS.length]}` }, `— ${s.label}`))));
}

function curveSeries(c, stat, label = "") {
  const series = [{ label: `${label}all islands`, xs: c.evaluations, ys: c.global[stat] }];
  if (!label) c.islands.forEach((isl, i) => series.push({ label: `island ${i}`, xs: c.evaluations, ys: isl[stat] }));
  return series;
}

async function renderCurves() {
  const c = await api(`/api/run/${state.run}/curves`);
  $("#curves").replaceChildren(...CURVES.map(([stat, title]) => chart(title, curveSeries(c, stat))));
}

// ----- statistics, cost, search, compare ---------------------------------------------------------

const pct = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)}%`);

async function renderStats() {
  const by = [...document.querySelectorAll("input[name=by]:checked")].map((b) => b.value);
  const rows = await api(`/api/run/${state.run}/stats?by=${by.join(",") || "operator"}`);
  table($("#stats"), [...(by.length ? by : ["operator"]).map((b) => [b]),
    ["candidates", "candidates", true], ["valid_rate", "valid", true, pct], ["entered_rate", "entered archive", true, pct],
    ["mean_improvement", "mean improvement", true], ["tokens", "tokens", true], ["cost", "cost", true]], rows);
}
for (const box of document.querySelectorAll("input[name=by]")) box.addEventListener("change", renderStats);

async function renderLedger() {
  const l = await api(`/api/run/${state.run}/ledger`);
  const cols = [["role"], ["model"], ["calls", "calls", true], ["cached", "cached", true], ["failed", "failed", true],
    ["retries", "retries", true], ["tokens_in", "tokens in", true], ["tokens_out", "tokens out", true], ["cost", "cost", true]];
  const rows = [...l.rows, { role: "total", model: "", ...l.total },
    ...Object.entries(l.per_model).map(([m, t]) => ({ role: "all roles", model: m, ...t }))];
  table($("#ledger"), cols, rows);
}

async function renderSearch() {
  const s = state.search;
  const params = new URLSearchParams({ sort: $("#search-sort").value, limit: s.limit, offset: s.offset });
  for (const [key, id] of [["q", "#search-q"], ["operator", "#search-operator"], ["valid", "#search-valid"],
    ["error", "#search-error"], ["island", "#search-island"]]) {
    if ($(id).value !== "") params.set(key, $(id).value);
  }
  const result = await api(`/api/run/${state.run}/search?${params}`);
  s.total = result.total;
  $("#search-total").textContent = result.total
    ? `${result.total.toLocaleString("en-US")} candidates; ${s.offset + 1}–${s.offset + result.rows.length} shown` : "no candidate matches";
  table($("#search-results"), [["id", "id", true, (v) => `#${v}`], ["island", "island", true], ["operator"], ["model"],
    ["fitness", "fitness", true], ["valid", "valid", false, (v) => (v ? "yes" : "no")],
    ["snippet", "text", false, (v, row) => (row.error ? el("span", { class: "error" }, row.error.slice(0, 120)) : el("code", {}, v))]],
  result.rows, (row) => select({ run: state.run, id: row.id }));
  $("#search-prev").disabled = s.offset === 0;
  $("#search-next").disabled = s.offset + s.limit >= s.total;
}
$("#search-form").addEventListener("submit", (event) => { event.preventDefault(); state.search.offset = 0; renderSearch(); });
$("#search-prev").addEventListener("click", () => { state.search.offset = Math.max(0, state.search.offset - state.search.limit); renderSearch(); });
$("#search-next").addEventListener("click", () => { state.search.offset += state.search.limit; renderSearch(); });

async function renderCompare() {
  const [a, b] = await Promise.all(state.runs.map((_, k) => api(`/api/run/${k}/summary`)));
  const [ca, cb] = await Promise.all(state.runs.map((_, k) => api(`/api/run/${k}/curves`)));
  const facts = (s) => el("dl", { class: "kv" }, [["run", s.name], ["path", s.path], ["archive", `${s.kind}, ${s.cells} cells, ${s.dim}-D`],
    ["islands", s.islands], ["evaluations", s.evaluations], ["elites", s.elites.reduce((x, y) => x + y, 0)],
    ["best", s.best ? `${fmt(s.best.fitness)} (#${s.best.id})` : "–"], ["model calls", s.llm_calls], ["cost", fmt(s.cost)]]
    .map(([k, v]) => [el("dt", {}, k), el("dd", {}, fmt(v))]));
  // Each run's curves in its own column, on its own scale: two tasks' fitness seldom share one.
  $("#compare").replaceChildren(el("div", { class: "compare" },
    [[a, ca], [b, cb]].map(([s, c]) => el("div", {}, facts(s), CURVES.map(([stat, title]) => chart(`${s.name}: ${title}`, curveSeries(c, stat)))))));
}

// ----- tabs, runs, live refresh ---------------------------------------------------------------------

const RENDER = { archive: drawHeatmap, curves: renderCurves, operators: renderStats, cost: renderLedger,
  search: renderSearch, compare: renderCompare };

async function renderTab() {
  try {
    await RENDER[state.tab]();
  } catch (error) {
    showError($(`#tab-${state.tab}`), error);
  }
}

for (const button of document.querySelectorAll("#tabs button")) {
  button.addEventListener("click", () => {
    state.tab = button.dataset.tab;
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b === button);
    for (const t of document.querySelectorAll(".tab")) t.hidden = t.id !== `tab-${state.tab}`;
    renderTab();
  });
}

$("#run-select").addEventListener("change", () => {
  state.run = +$("#run-select").value;
  state.search.offset = 0;
  setupRun();
  renderTab();
});

async function poll() {
  try {
    const { versions } = await api("/api/version");
    const changed = state.versions !== null && versions.some((v, k) => v !== state.versions[k]);
    state.versions = versions;
    if (changed) {
      state.runs = await api("/api/runs");
      renderSummary();
      await renderTab();
      if (state.selected && state.selected.cell !== undefined) await select(state.selected);
      $("#live").textContent = `updated ${new Date().toLocaleTimeString()} · ${run().evaluations.toLocaleString("en-US")} evaluations`;
    }
  } catch (error) {
    $("#live").textContent = `server unreachable (${error.message})`;
  }
}

async function start() {
  state.runs = await api("/api/runs");
  if (state.runs.length > 1) {
    $("#run-picker").hidden = false;
    $("#run-select").replaceChildren(...state.runs.map((r, k) => el("option", { value: k }, `${k}: ${r.name}`)));
    document.querySelector("#tabs button[data-tab=compare]").hidden = false;
  }
  setupRun();
  await poll();
  await renderTab();
  document.body.dataset.ready = "1";
  setInterval(poll, 2000);
}

start().catch((error) => showError($("#view"), error));
