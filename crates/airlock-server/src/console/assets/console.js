// The Airlock console's one script (served by the server; the pages'
// Content-Security-Policy admits no other). It reads only the console's
// own data routes (/console/data/…, the /v1 handlers behind the session
// cookie) and writes text, never markup, into the page.
"use strict";

const TERMINAL = ["succeeded", "failed", "timed_out", "cancelled"];

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmtTime(ms) {
  if (ms === null || ms === undefined) return "";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
}

async function getJson(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { accept: "application/json" } });
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

function setStatus(node, status) {
  node.textContent = status;
  node.className = "status s-" + status;
}

// The runs list: read again from the runs API every second while a run
// shown is not over, else every two (a new run shows up).
function runsPage() {
  const tbody = document.querySelector("#runs tbody");
  const params = new URLSearchParams(location.search);
  for (const [k, v] of [...params]) if (!v) params.delete(k);
  const live = () => [...tbody.querySelectorAll(".status")].some((s) => !TERMINAL.includes(s.textContent));
  async function refresh() {
    const list = await getJson("/console/data/runs?" + params.toString());
    tbody.replaceChildren();
    const waiting = list.runs.reduce((n, r) => n + (r.pending_approvals || 0), 0);
    const banner = document.getElementById("waiting");
    banner.textContent = waiting + (waiting === 1 ? " held request waits" : " held requests wait") + " for an answer.";
    banner.hidden = waiting === 0;
    if (list.runs.length === 0) {
      const tr = el("tr", undefined, "empty");
      const td = el("td", "No runs yet.");
      td.colSpan = 8;
      tr.append(td);
      tbody.append(tr);
    }
    for (const r of list.runs) {
      const tr = el("tr");
      tr.dataset.run = r.id;
      const a = el("a", r.id);
      a.href = "/console/runs/" + encodeURIComponent(r.id);
      const id = el("td");
      id.append(a);
      const st = el("td");
      st.append(el("span", r.status, "status s-" + r.status));
      const wait = el("td", undefined, "waiting");
      if (r.pending_approvals) {
        const w = el("a", r.pending_approvals);
        w.href = "/console/runs/" + encodeURIComponent(r.id) + "#approvals";
        wait.append(w);
      }
      tr.append(id, el("td", r.agent), st, wait, el("td", fmtTime(r.created_at)), el("td", fmtTime(r.ended_at)),
        el("td", r.cost.tokens_in + " / " + r.cost.tokens_out), el("td", r.cost.cost_usd));
      tbody.append(tr);
    }
  }
  const tick = async () => {
    try { await refresh(); } catch (e) { /* shown again on the next tick */ }
    setTimeout(tick, live() ? 1000 : 2000);
  };
  setTimeout(tick, 1000);
}

// A run's page: its log live (SSE), its status as the run goes; once it
// ends, the page is rendered again with its egress, cost and result.
function runPage() {
  const id = document.body.dataset.run;
  const wasLive = document.body.dataset.terminal !== "true";
  const log = document.getElementById("log");
  const status = document.getElementById("run-status");
  const base = "/console/data/runs/" + encodeURIComponent(id);
  const src = new EventSource(base + "/logs");
  let asking = false;
  async function refreshStatus() {
    if (asking) return;
    asking = true;
    try { setStatus(status, (await getJson(base)).status); } catch (e) { /* next event */ }
    asking = false;
  }
  src.addEventListener("log", (m) => {
    const ev = JSON.parse(m.data);
    const p = ev.payload || {};
    const line = (p.stream === "stderr" ? "! " : "") + (p.line !== undefined ? p.line : JSON.stringify(p));
    log.append(document.createTextNode(fmtTime(ev.at) + "  " + line + "\n"));
    if (wasLive) refreshStatus();
  });
  src.addEventListener("shed", (m) => {
    const p = JSON.parse(m.data).payload || {};
    log.append(document.createTextNode("[" + (p.lines || 0) + " log lines not kept]\n"));
  });
  src.addEventListener("end", (m) => {
    src.close();
    setStatus(status, JSON.parse(m.data).status);
    if (wasLive) location.reload();
  });
  src.addEventListener("error", () => {
    // The stream ended (revoked key, replica shutting down) or broke: the
    // status is read again; a live run's page keeps following it.
    if (src.readyState === EventSource.CLOSED) refreshStatus();
  });
  // A request held for an answer (or one no longer pending): the page is
  // rendered again, with its answer buttons.
  const approvals = document.getElementById("approvals");
  async function refreshApprovals() {
    try {
      const list = await getJson(base + "/approvals");
      const pending = list.approvals.filter((a) => a.state === "pending").map((a) => a.id).join(" ");
      if (pending !== approvals.dataset.pending) location.reload();
    } catch (e) { /* next poll */ }
  }
  if (wasLive) {
    const poll = async () => {
      await refreshStatus();
      await refreshApprovals();
      if (!TERMINAL.includes(status.textContent)) setTimeout(poll, 1000);
    };
    setTimeout(poll, 500);
  }
}

// Usage: runs and cost per day, from the runs API, drawn as SVG.
async function usagePage() {
  const runs = [];
  let cursor = null;
  for (let page = 0; page < 10; page++) {
    const q = "limit=100" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const list = await getJson("/console/data/runs?" + q);
    runs.push(...list.runs);
    cursor = list.next_cursor;
    if (!cursor) break;
  }
  const days = new Map();
  for (const r of runs) {
    const day = fmtTime(r.created_at).slice(0, 10);
    const d = days.get(day) || { runs: 0, ok: 0, failed: 0, tin: 0, tout: 0, usd: 0 };
    d.runs += 1;
    if (r.status === "succeeded") d.ok += 1;
    else if (TERMINAL.includes(r.status)) d.failed += 1;
    d.tin += r.cost.tokens_in;
    d.tout += r.cost.tokens_out;
    d.usd += r.cost.cost_usd;
    days.set(day, d);
  }
  const rows = [...days.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1));
  const tbody = document.querySelector("#usage tbody");
  for (const [day, d] of rows) {
    const tr = el("tr");
    tr.append(el("td", day), el("td", d.runs), el("td", d.ok), el("td", d.failed), el("td", d.tin), el("td", d.tout), el("td", d.usd.toFixed(6)));
    tbody.append(tr);
  }
  drawChart(document.getElementById("chart"), rows);
}

function drawChart(box, rows) {
  const NS = "http://www.w3.org/2000/svg";
  const W = 720, H = 240, pad = 40;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 " + W + " " + H);
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.id = "usage-chart";
  const maxRuns = Math.max(1, ...rows.map(([, d]) => d.runs));
  const maxUsd = Math.max(1e-9, ...rows.map(([, d]) => d.usd));
  const n = Math.max(1, rows.length);
  const slot = (W - 2 * pad) / n;
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
    return e;
  };
  add("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#888" });
  add("text", { x: pad, y: 16, fill: "#2b6cb0", "font-size": 12 }, "runs per day (max " + maxRuns + ")");
  add("text", { x: W - pad, y: 16, fill: "#c05621", "font-size": 12, "text-anchor": "end" }, "cost per day (max " + maxUsd.toFixed(6) + " USD)");
  const points = [];
  rows.forEach(([day, d], i) => {
    const h = ((H - 2 * pad) * d.runs) / maxRuns;
    const x = pad + i * slot + slot * 0.2;
    add("rect", { x, y: H - pad - h, width: slot * 0.6, height: h, fill: "#2b6cb0", class: "bar" }).append(
      Object.assign(document.createElementNS(NS, "title"), { textContent: day + ": " + d.runs + " runs" }));
    add("text", { x: x + slot * 0.3, y: H - pad + 14, "font-size": 10, "text-anchor": "middle", fill: "#444" }, day.slice(5));
    points.push([pad + i * slot + slot / 2, H - pad - ((H - 2 * pad) * d.usd) / maxUsd]);
  });
  if (points.length > 0) {
    add("polyline", { points: points.map((p) => p.join(",")).join(" "), fill: "none", stroke: "#c05621", "stroke-width": 2 });
    for (const [x, y] of points) add("circle", { cx: x, cy: y, r: 3, fill: "#c05621" });
  } else {
    add("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#666" }, "no runs yet");
  }
  box.replaceChildren(svg);
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "runs") runsPage();
  else if (page === "run") runPage();
  else if (page === "usage") usagePage().catch((e) => {
    document.getElementById("chart").textContent = "the usage could not be read: " + e.message;
  });
});
