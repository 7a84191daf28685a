"""The fold page (R15.3): one self-contained HTML file that folds real cache keys term by term.

``render(data)`` turns ``lazyxla.debug.explain.export()`` into one HTML page with inline CSS,
vanilla JavaScript and the data embedded as JSON (no network needed to open it). The page lists every
key the run compiled (uses, compile cost, cause, the recompile record behind it); folds one key
in R3's order (force_ltc_data, environment and revisions, each tensor's root hash, parameter
sequence, donated indices, auto-sharding flag with ``XLA_AUTO_SPMD_MESH``), each ingredient with
the digest after it; and puts two keys side by side, stepping through both folds merge by merge
("Step", "Play", "Reset") and marking the first merge whose ingredient differs, after which every
digest diverges. A tensor merge opens into the IR diff of the two roots with the user's lines;
each recompile record's "compare" button picks (closest earlier key, new key) in one click.
``write(path, data)`` writes the page (atomically) and returns its path.

The ``lazyxla explain SCRIPT [ARGS...] -o fold.html`` command (``lazyxla.cli.explain``) runs a
script and writes its page with ``write``.

Stable hooks for tests: ``tr.key-row[data-hash]``, ``button.pick-a`` / ``button.pick-b``,
``li.record[data-index]`` with ``button.compare``, ``#btn-step`` / ``#btn-play`` / ``#btn-reset``,
``tr.cmp-row[data-row][data-site]`` with classes ``pending``/``shown``, ``same``/``diverged`` and
``first-divergence``, ``#compare-view[data-step][data-total][data-done]``, ``div.ir-diff``.
Touches nothing but the file it writes (and its temp file, ``lazyxla.files``).
"""
from __future__ import annotations

import html
import json
import os

from ..files import write_atomic

__all__ = ["render", "write"]


def _json_for_script(data) -> str:
    # "</" would end the <script> element; "<!--" could open a comment state: escape both.
    s = json.dumps(data, ensure_ascii=False, default=str)
    return s.replace("</", "<\\/").replace("<!--", "<\\u0021--").replace("\u2028", "\\u2028").replace(
        "\u2029", "\\u2029")


def render(data: dict) -> str:
    """One self-contained HTML page for ``lazyxla.debug.explain.export()`` data (optionally with a
    ``meta`` dict: ``script``, ``argv``, ``exit_code``)."""
    meta = data.get("meta") or {}
    title = "lazyxla fold page"
    if meta.get("script"):
        title += " \u2014 " + os.path.basename(str(meta["script"]))
    return (_HTML.replace("@@TITLE@@", html.escape(title))
            .replace("@@CSS@@", _CSS)
            .replace("@@JS@@", _JS)
            .replace("@@DATA@@", _json_for_script(data)))


def write(path, data: dict) -> str:
    """Render ``data`` and write it to ``path`` (atomically, mode 0644); return the path."""
    return write_html(path, render(data))


def write_html(path, page: str) -> str:
    """Write a rendered page to ``path`` (atomically, mode 0644); return the path."""
    path = os.fspath(path)
    write_atomic(path, page.encode("utf-8"), mode=0o644, fsync=False)
    return path


# ---------------------------------------------------------------------------------------
_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@@TITLE@@</title>
<style>@@CSS@@</style>
</head>
<body>
<header id="top">
  <h1>@@TITLE@@</h1>
  <p id="summary" class="sub"></p>
  <ol id="legend" class="legend"></ol>
</header>
<main>
  <section id="keys-section">
    <h2>Keys compiled <span class="hint">click a key to fold it; pick A and B to compare two</span></h2>
    <table id="keys" class="grid">
      <thead><tr><th>compare</th><th class="num">#</th><th>key</th><th class="num">uses</th>
      <th class="num">compile</th><th>cause</th><th>recompile record</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
  <section id="records-section">
    <h2>Why it recompiled <span class="hint">each uncached compile against the closest earlier key</span></h2>
    <ol id="records"></ol>
  </section>
  <section id="fold-view" hidden>
    <h2 id="fold-title"></h2>
    <table id="fold-table" class="grid fold">
      <thead><tr><th>#</th><th>site</th><th>summary</th><th>ingredient</th><th>digest after it</th></tr></thead>
      <tbody></tbody>
    </table>
  </section>
  <section id="compare-view" hidden>
    <h2>Two folds side by side</h2>
    <div id="cmp-heads" class="cmp-heads"></div>
    <div class="controls">
      <button id="btn-step" type="button">Step &#9654;</button>
      <button id="btn-play" type="button">Play</button>
      <button id="btn-reset" type="button">Reset</button>
      <span id="cmp-progress" class="progress"></span>
    </div>
    <table id="cmp-table" class="grid cmp">
      <thead><tr><th>#</th><th>site</th><th>key A</th><th>key B</th><th>fold</th></tr></thead>
      <tbody></tbody>
    </table>
    <p id="cmp-result" class="result" hidden></p>
  </section>
</main>
<script type="application/json" id="fold-data">@@DATA@@</script>
<script>@@JS@@</script>
</body>
</html>
"""

_CSS = r"""
:root { --bg:#f7f8fa; --card:#fff; --ink:#1d2330; --mute:#667085; --line:#e3e6ec; --acc:#2f6fde;
  --same:#e9f7ef; --same-ink:#1f7a45; --div:#fff1e6; --div-ink:#b45309; --first:#fde2e2; --first-ink:#b42318;
  --mono: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink); font:14px/1.45 system-ui, -apple-system, "Segoe UI",
  "DejaVu Sans", sans-serif; }
header { background:#1d2330; color:#f3f5f9; padding:14px 24px 10px; }
header h1 { margin:0; font-size:20px; font-weight:600; }
header .sub { margin:4px 0 8px; color:#c5cbd6; }
.legend { margin:0; padding:0; list-style:none; display:flex; flex-wrap:wrap; gap:6px 14px; font-size:12px;
  color:#c5cbd6; counter-reset:site; }
.legend li { counter-increment:site; }
.legend li.lead { counter-increment:none; }
.legend li.lead::before { content:none; }
.legend li::before { content: counter(site) ". "; color:#8a93a5; }
.legend b { color:#fff; font-weight:600; }
main { padding:12px 24px 40px; max-width:1500px; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 16px 14px;
  margin:14px 0; }
h2 { font-size:16px; margin:4px 0 10px; font-weight:600; }
.hint { font-size:12px; color:var(--mute); font-weight:400; margin-left:8px; }
table.grid { border-collapse:collapse; width:100%; }
table.grid th { text-align:left; font-size:12px; color:var(--mute); font-weight:600; border-bottom:1px solid var(--line);
  padding:4px 8px; }
table.grid th.num { text-align:right; }
table.grid td { border-bottom:1px solid var(--line); padding:5px 8px; vertical-align:top; }
.num { text-align:right; font-variant-numeric: tabular-nums; white-space:nowrap; }
.mono, .hex { font-family:var(--mono); font-size:12.5px; }
.hex { white-space:nowrap; letter-spacing:0.2px; }
tr.key-row { cursor:pointer; }
tr.key-row:hover td { background:#f2f6ff; }
tr.key-row.selected td { background:#e7efff; }
tr.key-row.is-a td:nth-child(3)::after { content:" A"; color:var(--acc); font-weight:700; font-family:var(--mono); }
tr.key-row.is-b td:nth-child(3)::after { content:" B"; color:#8e44ad; font-weight:700; font-family:var(--mono); }
button { font:inherit; font-size:13px; border:1px solid #c9cfda; background:#fff; border-radius:5px;
  padding:2px 9px; cursor:pointer; color:var(--ink); }
button:hover:not(:disabled) { border-color:var(--acc); color:var(--acc); }
button:disabled { opacity:0.45; cursor:default; }
button.pick { padding:0 7px; margin-right:3px; font-family:var(--mono); font-size:12px; }
button.pick.on.pick-a { background:var(--acc); color:#fff; border-color:var(--acc); }
button.pick.on.pick-b { background:#8e44ad; color:#fff; border-color:#8e44ad; }
.bar { display:inline-block; height:8px; background:#9db8ee; border-radius:2px; vertical-align:middle;
  margin-right:6px; }
.chip { display:inline-block; font-size:12px; padding:0 7px; border-radius:10px; background:#eef1f6;
  color:#344054; white-space:nowrap; font-family:var(--mono); }
.chip.s-force_ltc_data { background:#e8e2fb; } .chip.s-environment { background:#e0f0fb; }
.chip.s-tensors { background:#fbeedd; } .chip.s-parameters { background:#e2f6ec; }
.chip.s-donation { background:#fde4ef; } .chip.s-sharding { background:#eceff3; }
a.rec-link { color:var(--acc); text-decoration:none; margin-right:8px; white-space:nowrap; }
a.rec-link:hover { text-decoration:underline; }
#records { margin:0; padding:0; list-style:none; }
li.record { border-top:1px solid var(--line); padding:8px 0; display:grid; grid-template-columns: 1fr auto;
  gap:2px 14px; }
li.record:first-child { border-top:0; }
li.record.target { background:#fffbe8; }
.rec-head { font-size:13px; }
.rec-head .idx { font-weight:700; margin-right:6px; }
.rec-text { grid-column:1; color:#344054; }
.rec-where { grid-column:1; font-size:12px; color:var(--mute); font-family:var(--mono); }
li.record .compare { grid-column:2; grid-row:1 / span 3; align-self:center; }
.sw { display:inline-block; width:11px; height:11px; border-radius:3px; margin-right:6px; vertical-align:-1px;
  border:1px solid rgba(0,0,0,0.15); }
table.fold td.sum { max-width:520px; }
tr.tensor-row { cursor:pointer; }
tr.tensor-row td.site::after { content:" \25B8 IR"; color:var(--acc); font-size:11px; }
tr.tensor-row.open td.site::after { content:" \25BE IR"; }
.cmp-heads { display:grid; grid-template-columns:1fr 1fr; gap:12px; margin-bottom:8px; }
.cmp-head { border:1px solid var(--line); border-radius:6px; padding:6px 10px; font-size:13px; }
.cmp-head .tag { font-weight:700; font-family:var(--mono); margin-right:6px; }
.cmp-head.a .tag { color:var(--acc); } .cmp-head.b .tag { color:#8e44ad; }
.cmp-note { grid-column: 1 / span 2; font-size:13px; color:#344054; background:#f6f7fb; border-radius:6px;
  padding:6px 10px; }
.controls { display:flex; gap:8px; align-items:center; margin:6px 0 10px; }
.controls button { padding:4px 14px; }
.progress { color:var(--mute); font-size:13px; margin-left:6px; }
table.cmp td { transition: background-color 0.25s; }
table.cmp td.side { width:40%; }
.side .s-sum { display:block; margin-bottom:2px; }
.side .hx { display:block; font-family:var(--mono); font-size:12px; color:#475467; white-space:nowrap; }
.side .hx .lbl { display:inline-block; width:64px; color:var(--mute); font-family:system-ui, sans-serif; font-size:11px; }
.side .missing { color:var(--mute); font-style:italic; }
.hex-diff { color:var(--first-ink); font-weight:700; }
tr.cmp-row.pending td { background:repeating-linear-gradient(90deg,#f4f5f8 0 10px,#fafbfc 10px 20px); }
tr.cmp-row.pending td.num, tr.cmp-row.pending td.site { opacity:0.45; }
tr.cmp-row.pending td.side * { visibility:hidden; }
tr.cmp-row.pending td.site::after { content:none; }
tr.cmp-row.shown.same td { background:var(--same); }
tr.cmp-row.shown.diverged td { background:var(--div); }
tr.cmp-row.shown.first-divergence td { background:var(--first); }
tr.cmp-row.shown.first-divergence td:first-child { box-shadow: inset 4px 0 0 var(--first-ink); }
tr.cmp-row.current td { box-shadow: inset 0 2px 0 var(--acc), inset 0 -2px 0 var(--acc); }
tr.cmp-row.current td:first-child { box-shadow: inset 2px 0 0 var(--acc), inset 0 2px 0 var(--acc),
  inset 0 -2px 0 var(--acc); }
tr.cmp-row.current td:last-child { box-shadow: inset -2px 0 0 var(--acc), inset 0 2px 0 var(--acc),
  inset 0 -2px 0 var(--acc); }
tr.cmp-row.shown.first-divergence.current td:first-child { box-shadow: inset 4px 0 0 var(--first-ink),
  inset 0 2px 0 var(--acc), inset 0 -2px 0 var(--acc); }
td.status { font-size:12.5px; width:17%; }
tr.same td.status { color:var(--same-ink); }
tr.diverged td.status { color:var(--div-ink); }
tr.first-divergence td.status { color:var(--first-ink); font-weight:600; }
.result { font-size:14px; padding:8px 12px; border-radius:6px; background:var(--first); color:#7a271a; margin:10px 0 0; }
.result.ok { background:var(--same); color:var(--same-ink); }
tr.ir-row > td { background:#fbfcfe !important; padding:8px 10px 12px; }
.ir-diff .ir-head { font-size:13px; margin-bottom:6px; }
.ir-diff .ir-lines { font-size:12.5px; margin:0 0 6px; }
.ir-diff .ir-lines code { background:#fde2e2; border-radius:3px; padding:0 4px; margin-right:6px; }
.ir-scroll { max-height:440px; overflow:auto; border:1px solid var(--line); border-radius:6px; background:#fff; }
table.ir { border-collapse:collapse; width:100%; font-family:var(--mono); font-size:12px; }
table.ir th { position:sticky; top:0; background:#f3f5f9; text-align:left; padding:3px 6px; font-weight:600;
  color:#475467; font-family:system-ui, sans-serif; font-size:11.5px; }
table.ir td { padding:1px 6px; border-bottom:1px solid #f0f2f5; vertical-align:top; }
table.ir td.gap { border-left:2px solid var(--line); }
table.ir tr.node-diff td { background:#fdecec; }
table.ir tr.node-diff td.fd { color:var(--first-ink); font-weight:700; }
table.ir td.where { color:#7a5af8; white-space:nowrap; }
table.ir tr.node-diff td.where { color:#7a271a; font-weight:700; }
table.ir tr.skip td { color:var(--mute); font-style:italic; text-align:center; background:#f8f9fb; }
table.ir td.outs { white-space:nowrap; }
table.ir td.nid { color:var(--mute); white-space:nowrap; }
"""

_JS = r"""
"use strict";
(function () {
const DATA = JSON.parse(document.getElementById("fold-data").textContent);
const SITES = DATA.sites && DATA.sites.length ? DATA.sites :
  ["force_ltc_data", "environment", "tensors", "parameters", "donation", "sharding"];
const SITE_INFO = {
  force_ltc_data: "the seed: true on a sync, false on a value read",
  environment: "compile environment with PyTorch, lazyxla and jaxlib revisions",
  tensors: "each pending tensor's root IR hash, in arena order",
  parameters: "the parameter sequence of the post-order",
  donation: "sorted donated parameter indices, only when any",
  sharding: "auto-sharding flag with XLA_AUTO_SPMD_MESH",
};
const KEYS = DATA.keys || [];
const RECORDS = DATA.records || [];
const META = DATA.meta || {};
const BY_HASH = new Map();
KEYS.forEach((k, i) => BY_HASH.set(k.hash, Object.assign({ n: i + 1 }, k)));
const state = { a: null, b: null, rows: [], first: -1, step: 0, timer: null };

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of kids.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}
const $ = (s) => document.querySelector(s);
const short = (h) => (h ? h.slice(0, 12) : "\u2014");
const groups = (h) => (h ? h.match(/.{1,8}/g).join(" ") : "");
const fmtMs = (ms) => (ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : (ms || 0).toFixed(1) + " ms");
const chip = (site) => el("span", { class: "chip s-" + site }, site);
function swatch(h) {
  return el("span", { class: "sw", style: "background:#" + (h || "cccccc").slice(0, 6), title: h || "" });
}
function whereText(w) {
  if (!w) return null;
  if (Array.isArray(w)) {
    const f = String(w[0] || "").split(/[\\/]/).pop();
    return f + ":" + w[1] + (w[2] ? " in " + w[2] : "");
  }
  return String(w);
}
function keyLabel(h) {
  const k = BY_HASH.get(h);
  return k ? "#" + k.n + " " + short(h) : short(h);
}

// ---- header --------------------------------------------------------------------------
function renderHeader() {
  const total = KEYS.reduce((s, k) => s + (k.compile_ms || 0), 0);
  const uses = KEYS.reduce((s, k) => s + (k.uses || 0), 0);
  const recs = RECORDS.filter((r) => r.closest).length;
  let txt = KEYS.length + " key" + (KEYS.length === 1 ? "" : "s") + " compiled, used " + uses +
    " time" + (uses === 1 ? "" : "s") + ", " + fmtMs(total) + " compiling; " + recs + " recompile" +
    (recs === 1 ? "" : "s") + " explained.";
  if (META.script) {
    txt = "Script " + META.script + (META.argv && META.argv.length ? " " + META.argv.join(" ") : "") +
      (META.exit_code !== undefined ? " (exit code " + META.exit_code + ")" : "") + ". " + txt;
  }
  $("#summary").textContent = txt;
  const lg = $("#legend");
  lg.append(el("li", { class: "lead" }, "The key folds, in R3's order:"));
  SITES.forEach((s) => lg.append(el("li", {}, el("b", {}, s), " \u2014 " + (SITE_INFO[s] || ""))));
}

// ---- keys ----------------------------------------------------------------------------
function renderKeys() {
  const tb = $("#keys tbody");
  const maxMs = Math.max(1, ...KEYS.map((k) => k.compile_ms || 0));
  KEYS.forEach((k, i) => {
    const own = RECORDS.filter((r) => r.hash === k.hash);
    const tr = el("tr", { class: "key-row", id: "key-" + k.hash, "data-hash": k.hash,
                          onclick: () => showSingle(k.hash) },
      el("td", {},
        el("button", { class: "pick pick-a", type: "button", "data-hash": k.hash, title: "compare as key A",
                       onclick: (e) => { e.stopPropagation(); pick("a", k.hash); } }, "A"),
        el("button", { class: "pick pick-b", type: "button", "data-hash": k.hash, title: "compare as key B",
                       onclick: (e) => { e.stopPropagation(); pick("b", k.hash); } }, "B")),
      el("td", { class: "num" }, String(i + 1)),
      el("td", { class: "hex", title: k.hash }, swatch(k.hash), short(k.hash)),
      el("td", { class: "num" }, String(k.uses)),
      el("td", { class: "num" },
        el("span", { class: "bar", style: "width:" + Math.max(2, Math.round(60 * (k.compile_ms || 0) / maxMs)) + "px" }),
        fmtMs(k.compile_ms)),
      el("td", {}, k.cause || ""),
      el("td", {}, own.map((r) => el("a", { class: "rec-link", href: "#rec-" + r.index,
        onclick: (e) => { e.stopPropagation(); flashRecord(r.index); } },
        "#" + r.index + " " + (r.site || "first compile")))));
    tb.append(tr);
  });
  if (!KEYS.length) tb.append(el("tr", {}, el("td", { colspan: 7 }, "No key was compiled.")));
}

function flashRecord(index) {
  document.querySelectorAll("li.record.target").forEach((x) => x.classList.remove("target"));
  const li = document.getElementById("rec-" + index);
  if (li) { li.classList.add("target"); li.scrollIntoView({ block: "center" }); }
}

// ---- records -------------------------------------------------------------------------
function renderRecords() {
  const ol = $("#records");
  RECORDS.forEach((r) => {
    const can = !!(r.closest && BY_HASH.has(r.closest) && BY_HASH.has(r.hash));
    const where = whereText(r.where);
    ol.append(el("li", { class: "record", id: "rec-" + r.index, "data-index": r.index, "data-site": r.site || "",
                         "data-hash": r.hash, "data-closest": r.closest || "" },
      el("div", { class: "rec-head" }, el("span", { class: "idx" }, "#" + r.index),
        r.site ? chip(r.site) : el("span", { class: "chip" }, "first compile"),
        " key ", el("span", { class: "hex" }, keyLabel(r.hash)),
        r.closest ? [" vs closest ", el("span", { class: "hex" }, keyLabel(r.closest))] : null,
        " \u00b7 " + fmtMs(r.compile_ms)),
      el("div", { class: "rec-text" }, r.text),
      where ? el("div", { class: "rec-where" }, "at " + where) : null,
      el("button", { class: "compare", type: "button", disabled: !can, "data-index": r.index,
                     title: can ? "fold the closest earlier key (A) and this key (B) side by side" : "no earlier key",
                     onclick: () => compare(r.closest, r.hash, r) }, "compare \u21c4")));
  });
  if (!RECORDS.length) ol.append(el("li", { class: "record" }, "Nothing was compiled."));
}

// ---- one key -------------------------------------------------------------------------
function showSingle(hash) {
  stop();
  const k = BY_HASH.get(hash);
  if (!k) return;
  document.querySelectorAll("tr.key-row").forEach((tr) => tr.classList.toggle("selected", tr.dataset.hash === hash));
  $("#compare-view").hidden = true;
  const v = $("#fold-view");
  v.hidden = false;
  v.dataset.hash = hash;
  $("#fold-title").textContent = "Key #" + k.n + " " + hash + " folded term by term (" + k.steps.length +
    " merges, " + k.uses + " use" + (k.uses === 1 ? "" : "s") + ", " + fmtMs(k.compile_ms) + ")";
  const tb = $("#fold-table tbody");
  tb.textContent = "";
  k.steps.forEach((s, i) => {
    const tr = el("tr", { class: "fold-row" + (s.ir ? " tensor-row" : ""), "data-row": i, "data-site": s.site },
      el("td", { class: "num" }, String(i + 1)),
      el("td", { class: "site" }, chip(s.site)),
      el("td", { class: "sum" }, s.summary),
      el("td", { class: "hex", title: s.ingredient }, groups(s.ingredient)),
      el("td", { class: "hex", title: s.digest }, swatch(s.digest), groups(s.digest)));
    if (s.ir) tr.addEventListener("click", () => toggleIR(tr, s.ir, null, 5, "IR below " + s.summary));
    tb.append(tr);
  });
  v.scrollIntoView({ block: "start" });
}

// ---- two keys ------------------------------------------------------------------------
function pick(slot, hash) {
  state[slot] = hash;
  const other = slot === "a" ? "b" : "a";
  if (state[other] === hash) state[other] = null;
  updatePicks();
  if (state.a && state.b) compare(state.a, state.b, null);
}
function updatePicks() {
  document.querySelectorAll("button.pick-a").forEach((b) => b.classList.toggle("on", b.dataset.hash === state.a));
  document.querySelectorAll("button.pick-b").forEach((b) => b.classList.toggle("on", b.dataset.hash === state.b));
  document.querySelectorAll("tr.key-row").forEach((tr) => {
    tr.classList.toggle("is-a", tr.dataset.hash === state.a);
    tr.classList.toggle("is-b", tr.dataset.hash === state.b);
  });
}

function align(ka, kb) {
  const rows = [];
  const sites = SITES.slice();
  for (const s of ka.steps.concat(kb.steps)) if (!sites.includes(s.site)) sites.push(s.site);
  for (const site of sites) {
    const sa = ka.steps.filter((s) => s.site === site), sb = kb.steps.filter((s) => s.site === site);
    for (let i = 0; i < Math.max(sa.length, sb.length); i++) rows.push({ site, i, a: sa[i] || null, b: sb[i] || null });
  }
  let first = -1;
  rows.forEach((r, j) => {
    r.differs = !r.a || !r.b || r.a.ingredient !== r.b.ingredient;
    if (r.differs && first < 0) first = j;
  });
  return { rows, first };
}

function hexLine(label, h, other) {
  return el("span", { class: "hx", title: h }, el("span", { class: "lbl" }, label),
    label === "digest" ? swatch(h) : null,
    el("span", { class: other !== undefined && other !== h ? "hex-diff" : "" }, groups(h)));
}
function sideCell(s, o) {
  if (!s) return el("td", { class: "side" }, el("span", { class: "missing" }, "no such merge"));
  return el("td", { class: "side" }, el("span", { class: "s-sum" }, s.summary),
    hexLine("ingredient", s.ingredient, o ? o.ingredient : null),
    hexLine("digest", s.digest, o ? o.digest : null));
}

function compare(a, b, rec) {
  stop();
  const ka = BY_HASH.get(a), kb = BY_HASH.get(b);
  if (!ka || !kb) return;
  state.a = a; state.b = b;
  updatePicks();
  document.querySelectorAll("tr.key-row").forEach((tr) => tr.classList.remove("selected"));
  if (!rec) rec = RECORDS.find((r) => (r.hash === b && r.closest === a) || (r.hash === a && r.closest === b)) || null;
  $("#fold-view").hidden = true;
  const v = $("#compare-view");
  v.hidden = false;
  v.dataset.a = a; v.dataset.b = b;
  const heads = $("#cmp-heads");
  heads.textContent = "";
  const head = (cls, tag, k) => el("div", { class: "cmp-head " + cls }, el("span", { class: "tag" }, tag),
    el("span", { class: "hex" }, "#" + k.n + " " + k.hash), el("br"),
    k.steps.length + " merges \u00b7 " + k.uses + " use" + (k.uses === 1 ? "" : "s") + " \u00b7 " +
    fmtMs(k.compile_ms) + " \u00b7 " + (k.cause || ""));
  heads.append(head("a", "A", ka), head("b", "B", kb));
  if (rec) heads.append(el("div", { class: "cmp-note", id: "cmp-record", "data-index": rec.index },
    "Recompile #" + rec.index + ": " + rec.text));
  const { rows, first } = align(ka, kb);
  state.rows = rows; state.first = first;
  const tb = $("#cmp-table tbody");
  tb.textContent = "";
  rows.forEach((r, j) => {
    const tr = el("tr", { class: "cmp-row pending" + (r.site === "tensors" ? " tensor-row" : ""), "data-row": j,
                          "data-site": r.site },
      el("td", { class: "num" }, String(j + 1)),
      el("td", { class: "site" }, chip(r.site)),
      sideCell(r.a, r.b), sideCell(r.b, r.a),
      el("td", { class: "status" }, ""));
    if (r.site === "tensors") {
      tr.addEventListener("click", () => {
        if (tr.classList.contains("pending")) return;
        toggleIR(tr, r.a && r.a.ir, r.b && r.b.ir, 5, "pending tensor #" + (r.i + 1));
      });
    }
    r.tr = tr;
    tb.append(tr);
  });
  reset();
  v.scrollIntoView({ block: "start" });
}

function statusText(r, j) {
  const f = state.first;
  if (f < 0 || j < f) return "same ingredient \u2192 same digest";
  if (j === f) {
    if (!r.a || !r.b) return "\u2691 first divergence: only key " + (r.a ? "A" : "B") +
      " has this merge; every later digest differs";
    return "\u2691 first divergence: this ingredient differs, so this digest and every later one differ";
  }
  if (!r.a || !r.b) return "only key " + (r.a ? "A" : "B") + " has this merge";
  return r.differs ? "ingredient differs too; digest diverged" : "same ingredient, but the digest already diverged";
}

function showRow(j) {
  const r = state.rows[j];
  const tr = r.tr;
  tr.classList.remove("pending");
  tr.classList.add("shown");
  const f = state.first;
  const diverged = f >= 0 && j >= f;
  tr.classList.toggle("diverged", diverged);
  tr.classList.toggle("same", !diverged);
  tr.classList.toggle("first-divergence", j === f);
  tr.classList.toggle("ingredient-differs", r.differs);
  tr.querySelector("td.status").textContent = statusText(r, j);
  document.querySelectorAll("tr.cmp-row.current").forEach((x) => x.classList.remove("current"));
  tr.classList.add("current");
  if (j === f && r.site === "tensors" && r.a && r.b && r.a.ir && r.b.ir && !tr.classList.contains("open")) {
    toggleIR(tr, r.a.ir, r.b.ir, 5, "pending tensor #" + (r.i + 1));
  }
}

function progress() {
  const v = $("#compare-view");
  const n = state.rows.length;
  v.dataset.step = state.step;
  v.dataset.total = n;
  v.dataset.done = state.step >= n ? "true" : "false";
  $("#cmp-progress").textContent = "merge " + state.step + " of " + n +
    (state.step >= n && state.first >= 0 ? " \u2014 first divergence at merge " + (state.first + 1) +
      " (" + state.rows[state.first].site + ")" : "");
  $("#btn-step").disabled = state.step >= n;
  $("#btn-play").disabled = state.step >= n && !state.timer;
  $("#btn-play").textContent = state.timer ? "Pause" : "Play";
  const res = $("#cmp-result");
  if (state.step >= n && n) {
    res.hidden = false;
    if (state.first < 0) {
      res.className = "result ok";
      res.textContent = "Every ingredient is the same: the two folds give the same key.";
    } else {
      const r = state.rows[state.first];
      res.className = "result";
      res.textContent = (state.first === 0 ? "The folds differ from the very first merge" :
        "The folds agree for " + state.first + " merge" + (state.first === 1 ? "" : "s")) +
        "; merge " + (state.first + 1) + " (" + r.site + ") takes a different ingredient, and from there on " +
        "every digest differs, down to the two keys (A " + short(state.a) + "\u2026, B " + short(state.b) + "\u2026).";
    }
  } else {
    res.hidden = true;
  }
}
function step() {
  if (state.step < state.rows.length) { showRow(state.step); state.step += 1; }
  if (state.step >= state.rows.length) stop();
  progress();
}
function stop() {
  if (state.timer) { clearInterval(state.timer); state.timer = null; }
  if (state.rows.length) progress();
}
function play() {
  if (state.timer) { stop(); return; }
  if (state.step >= state.rows.length) reset();
  state.timer = setInterval(step, 650);
  step();
}
function reset() {
  if (state.timer) { clearInterval(state.timer); state.timer = null; }
  state.step = 0;
  for (const r of state.rows) {
    r.tr.className = "cmp-row pending" + (r.site === "tensors" ? " tensor-row" : "");
    r.tr.querySelector("td.status").textContent = "";
    const nx = r.tr.nextSibling;
    if (nx && nx.classList && nx.classList.contains("ir-row")) nx.remove();
  }
  progress();
}

// ---- IR ------------------------------------------------------------------------------
function alignIR(A, B) {
  const a = A ? A.nodes : [], b = B ? B.nodes : [];
  const n = a.length, m = b.length, pairs = [];
  if (n && m && n * m <= 6e6) {
    const W = m + 1, dp = new Uint32Array((n + 1) * W);
    for (let i = n - 1; i >= 0; i--)
      for (let j = m - 1; j >= 0; j--)
        dp[i * W + j] = a[i].hash === b[j].hash ? dp[(i + 1) * W + j + 1] + 1 :
          Math.max(dp[(i + 1) * W + j], dp[i * W + j + 1]);
    let i = 0, j = 0, ra = [], rb = [];
    const flush = () => {
      for (let k = 0; k < Math.max(ra.length, rb.length); k++) pairs.push([ra[k] || null, rb[k] || null, true]);
      ra = []; rb = [];
    };
    while (i < n && j < m) {
      if (a[i].hash === b[j].hash) { flush(); pairs.push([a[i], b[j], false]); i++; j++; }
      else if (dp[(i + 1) * W + j] >= dp[i * W + j + 1]) ra.push(a[i++]);
      else rb.push(b[j++]);
    }
    while (i < n) ra.push(a[i++]);
    while (j < m) rb.push(b[j++]);
    flush();
  } else {
    for (let k = 0; k < Math.max(n, m); k++) {
      const x = a[k] || null, y = b[k] || null;
      pairs.push([x, y, !x || !y || x.hash !== y.hash]);
    }
  }
  return pairs;
}
function opText(nd) {
  let p = nd.params || "";
  p = p.replace(/%(\d+)/g, (_, k) => "%" + (nd.operands[+k] !== undefined ? nd.operands[+k] : k));
  return nd.op + p;
}
function nodeCells(nd, other, diff) {
  if (!nd) return [el("td", { class: "nid gap" }, ""), el("td", {}, "\u2014"), el("td", {}, ""), el("td", {}, "")];
  const fd = (x, y) => (diff && other && x !== y ? "fd" : (diff && !other ? "fd" : ""));
  const outs = nd.outs.join(", ");
  return [el("td", { class: "nid gap" }, "%" + nd.id + (nd.id === nd._root ? " \u2605" : "")),
          el("td", { class: fd(opText(nd), other && opText(other)) }, opText(nd)),
          el("td", { class: "outs " + fd(outs, other && other.outs.join(", ")) }, outs),
          el("td", { class: "where" }, nd.where || "")];
}

function renderIR(A, B, context) {
  const single = !B;
  if (A) A.nodes.forEach((nd) => (nd._root = A.root));
  if (B) B.nodes.forEach((nd) => (nd._root = B.root));
  const pairs = single ? A.nodes.map((x) => [x, null, false]) : alignIR(A, B);
  const nd = pairs.filter((p) => p[2]).length;
  const wrap = el("div", { class: "ir-diff", "data-differing": nd });
  if (!single) {
    const lines = [];
    for (const [x, y, d] of pairs) {
      if (!d) continue;
      for (const z of [y, x]) if (z && z.where && !lines.includes(z.where)) lines.push(z.where);
    }
    wrap.append(el("div", { class: "ir-head" }, "IR diff: A has " + A.nodes.length + " nodes, B has " +
      B.nodes.length + "; " + nd + " aligned row" + (nd === 1 ? "" : "s") + " differ (highlighted). " +
      "\u2605 marks each root."));
    if (lines.length) wrap.append(el("div", { class: "ir-lines" }, "Your lines behind the differing nodes: ",
      lines.map((w) => el("code", { class: "user-line" }, w))));
  } else {
    wrap.append(el("div", { class: "ir-head" }, A.nodes.length + " nodes, operands first; \u2605 marks the root."));
  }
  const table = el("table", { class: "ir" });
  const head = single ? el("tr", {}, el("th", {}, "node"), el("th", {}, "op"), el("th", {}, "output"), el("th", {}, "your line"))
    : el("tr", {}, el("th", {}, "A"), el("th", {}, "op"), el("th", {}, "output"), el("th", {}, "your line"),
         el("th", {}, "B"), el("th", {}, "op"), el("th", {}, "output"), el("th", {}, "your line"));
  table.append(el("thead", {}, head));
  const tbody = el("tbody");
  table.append(tbody);
  const draw = (all) => {
    tbody.textContent = "";
    const keep = pairs.map(() => all || single || pairs.length <= 60);
    if (!keep[0]) pairs.forEach((p, i) => {
      if (p[2]) for (let k = Math.max(0, i - context); k <= Math.min(pairs.length - 1, i + context); k++) keep[k] = true;
    });
    let skipped = 0;
    const flushSkip = () => {
      if (!skipped) return;
      const n = skipped;
      tbody.append(el("tr", { class: "skip" }, el("td", { colspan: single ? 4 : 8 },
        "\u2026 " + n + " identical node" + (n === 1 ? "" : "s") + " \u2026 (click to show all)")));
      tbody.lastChild.addEventListener("click", (e) => { e.stopPropagation(); draw(true); });
      skipped = 0;
    };
    pairs.forEach(([x, y, d], i) => {
      if (!keep[i]) { skipped++; return; }
      flushSkip();
      const cells = single ? nodeCells(x, null, false) : nodeCells(x, y, d).concat(nodeCells(y, x, d));
      tbody.append(el("tr", { class: d ? "node-diff" : "node-same" }, cells));
    });
    flushSkip();
  };
  draw(false);
  wrap.append(el("div", { class: "ir-scroll" }, table));
  wrap.addEventListener("click", (e) => e.stopPropagation());
  return wrap;
}

function toggleIR(tr, A, B, context, label) {
  const nx = tr.nextSibling;
  if (nx && nx.classList && nx.classList.contains("ir-row")) {
    nx.remove();
    tr.classList.remove("open");
    return;
  }
  if (!A && !B) return;
  let body;
  if (A && B) body = renderIR(A, B, context);
  else body = renderIR(A || B, null, context);
  body.dataset.row = tr.dataset.row;
  tr.classList.add("open");
  tr.after(el("tr", { class: "ir-row" }, el("td", { colspan: tr.children.length }, body)));
}

// ---- wire up -------------------------------------------------------------------------
$("#btn-step").addEventListener("click", () => { if (state.timer) stop(); step(); });
$("#btn-play").addEventListener("click", play);
$("#btn-reset").addEventListener("click", reset);
document.addEventListener("keydown", (e) => {
  if ($("#compare-view").hidden || e.target.tagName === "INPUT") return;
  if (e.key === "ArrowRight") { if (state.timer) stop(); step(); }
  else if (e.key === " ") { e.preventDefault(); play(); }
});
renderHeader();
renderKeys();
renderRecords();
const firstRec = RECORDS.find((r) => r.closest && BY_HASH.has(r.closest) && BY_HASH.has(r.hash));
if (firstRec) compare(firstRec.closest, firstRec.hash, firstRec);
else if (KEYS.length) showSingle(KEYS[KEYS.length - 1].hash);
window.scrollTo(0, 0);
document.body.dataset.ready = "true";
})();
"""
