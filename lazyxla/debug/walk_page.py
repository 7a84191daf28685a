"""The code-walk page: one self-contained HTML file that walks one sync through lazyxla's executor.

``render(data)`` turns ``debug.walk.Walker.export()`` data (with a ``meta`` dict: ``script``,
``argv``, ``exit_code``, ``error``) into one page with inline CSS and vanilla JavaScript and the
data embedded as JSON (it opens offline). The page lists the run's lookups (the walked one
marked), then one section per stage in the seed's order: what the stage does, its live values
(facts, tables, the program text collapsed) beside lazyxla's own source for it with the line that
does the work marked. Step, Back, Play and Reset move through the stages (and the keyboard: right
arrow, space or ``j`` steps, left arrow or ``k`` goes back, ``p`` plays, ``r`` resets).
``write(path, data)`` writes it atomically.

Stable hooks for tests: ``section.stage[data-stage][data-source][data-status]`` with classes
``pending`` / ``shown`` / ``current``, ``#walk[data-step][data-total][data-done]``,
``#btn-step`` / ``#btn-back`` / ``#btn-play`` / ``#btn-reset``, ``tr.lookup-row[data-n]`` (the
walked one also ``.walked``), ``.src-line.mark``, ``#walk-note``, ``#script-error``.
Touches nothing but the file it writes (and its temp file: ``fold_page.write_html``).
"""
from __future__ import annotations

import html
import os

from .fold_page import _json_for_script, write_html

__all__ = ["render", "write"]

_e = html.escape


def _facts(facts) -> str:
    if not facts:
        return ""
    items = "".join(f"<dt>{_e(str(k))}</dt><dd>{_e(str(v))}</dd>" for k, v in facts)
    return f'<dl class="facts">{items}</dl>'


def _table(t) -> str:
    if not t:
        return ""
    head = "".join(f"<th>{_e(str(c))}</th>" for c in t["columns"])
    body = "".join("<tr>" + "".join(f"<td>{_e(str(c))}</td>" for c in row) + "</tr>" for row in t["rows"])
    if not t["rows"]:
        body = f'<tr><td colspan="{len(t["columns"])}" class="empty">none</td></tr>'
    return (f'<table class="values {_e(t.get("kind", ""))}"><caption>{_e(t["caption"])}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _counterexample(c) -> str:
    if not c:
        return ""
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(', '.join(f'{x:.7g}' for x in v))}</td></tr>" for k, v in c.items())
    return f'<table class="values counterexample"><caption>A + 0.4, read twice (float32)</caption>{rows}</table>'


def _source(src) -> str:
    lines = []
    for i, text in enumerate(src["lines"]):
        n = src["start"] + i
        cls = "src-line mark" if n == src["mark"] else "src-line"
        lines.append(f'<span class="{cls}" data-line="{n}"><span class="ln">{n}</span>{_e(text) or " "}</span>')
    return (f'<div class="source"><div class="src-head"><code>{_e(src["function"])}</code> '
            f'<span class="file">{_e(src["file"])}:{src["start"]}</span> '
            f'<span class="marked">working line {src["mark"]}</span></div>'
            f'<pre class="code">{"".join(lines)}</pre></div>')


def _stage(i, st) -> str:
    parts = [_facts(st.get("facts"))]
    parts += [f"<p>{_e(t)}</p>" for t in st.get("text") or []]
    parts += [_table(t) for t in st.get("tables") or []]
    parts.append(_counterexample(st.get("counterexample")))
    code = st.get("code")
    if code:
        parts.append(f'<details class="program"><summary>{_e(code["caption"])}</summary>'
                     f'<pre class="code">{_e(code["text"])}</pre></details>')
    return (f'<section class="stage pending" id="stage-{_e(st["name"])}" data-stage="{_e(st["name"])}" '
            f'data-source="{_e(st["source"]["source"])}" data-status="{_e(st.get("status", "ok"))}">'
            f'<h2><span class="num">{i + 1}</span> {_e(st["title"])} <span class="status">{_e(st.get("status", ""))}'
            f'</span></h2><p class="what">{_e(st["what"])}</p>'
            f'<div class="cols"><div class="live">{"".join(parts)}</div>{_source(st["source"])}</div></section>')


def _lookups(data) -> str:
    rows = data.get("lookups") or []
    walked = data.get("walked")
    if not rows:
        return '<p class="empty">No lookups in this run.</p>'
    shown = rows if len(rows) <= 300 else rows[:150] + rows[-150:]
    out = []
    for r in shown:
        cls = "lookup-row walked" if r["n"] == walked else "lookup-row"
        out.append(f'<tr class="{cls}" data-n="{r["n"]}"><td>{r["n"]}</td><td>{_e(r["cause"])}</td>'
                   f'<td><code>{_e(r["hash"][:16])}</code></td><td>{_e(r["outcome"])}</td><td>{r["ops"]}</td>'
                   f'<td>{_e(r["where"] or "")}</td></tr>')
    more = f"<p>{len(rows)} lookups; the first and last 150 are listed.</p>" if len(rows) > 300 else ""
    return ('<table class="lookups"><caption>every lookup of the run (the walked one marked; '
            "<code>--sync N</code> or <code>--sync HASH</code> walks another)</caption><thead><tr><th>#</th>"
            "<th>cause</th><th>graph hash</th><th>outcome</th><th>ops</th><th>asked at</th></tr></thead>"
            f"<tbody>{''.join(out)}</tbody></table>{more}")


def render(data: dict) -> str:
    meta = data.get("meta") or {}
    script = os.path.basename(str(meta.get("script") or ""))
    title = "lazyxla code walk" + (f" \u2014 {script}" if script else "")
    head = [f"<h1>{_e(title)}</h1>"]
    if meta.get("script"):
        argv = " ".join(str(a) for a in meta.get("argv") or [])
        head.append(f'<p class="meta"><code>lazyxla explain --walk {_e(str(meta["script"]))} {_e(argv)}</code>: '
                    f'exit code {_e(str(meta.get("exit_code")))}, {len(data.get("lookups") or [])} lookups, '
                    f'{data.get("steps", 0)} steps ended.</p>')
    if meta.get("error"):
        head.append(f'<p id="script-error" class="error">The script raised: {_e(meta["error"])}</p>')
    walked = data.get("walked")
    if walked is not None:
        row = next((r for r in data["lookups"] if r["n"] == walked), None)
        if row:
            what = "sync" if row["cause"] == "sync" else "value read"
            head.append(f'<p id="walk-note" class="note">Walking lookup {walked} of {len(data["lookups"])}: a {what} '
                        f'at {_e(row["where"] or "an unknown line")}, graph <code>{_e(row["hash"])}</code>, '
                        f'{_e(row["outcome"])}.</p>')
    else:
        head.append(f'<p id="walk-note" class="note">{_e(data.get("note") or "Nothing to walk.")}</p>')
    stages = data.get("stages") or []
    body = "".join(_stage(i, st) for i, st in enumerate(stages))
    controls = ('<div id="controls"><button id="btn-step" title="step (right arrow, space, j)">Step</button>'
                '<button id="btn-back" title="back (left arrow, k)">Back</button>'
                '<button id="btn-play" title="play (p)">Play</button>'
                '<button id="btn-reset" title="reset (r)">Reset</button>'
                f'<span id="walk" data-step="0" data-total="{len(stages)}" data-done="false">'
                f'stage 0 of {len(stages)}</span></div>')
    return (_HTML.replace("@@TITLE@@", _e(title))
            .replace("@@CSS@@", _CSS).replace("@@JS@@", _JS)
            .replace("@@HEAD@@", "".join(head)).replace("@@LOOKUPS@@", _lookups(data))
            .replace("@@CONTROLS@@", controls).replace("@@STAGES@@", body)
            .replace("@@DATA@@", _json_for_script(data)))


def write(path, data: dict) -> str:
    """Render ``data`` and write it to ``path`` (atomically, mode 0644); return the path."""
    return write_html(path, render(data))


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>@@TITLE@@</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>@@CSS@@</style></head>
<body data-ready="false">
<header>@@HEAD@@</header>
<main>@@LOOKUPS@@@@CONTROLS@@@@STAGES@@</main>
<script type="application/json" id="walk-data">@@DATA@@</script>
<script>@@JS@@</script>
</body></html>
"""

_CSS = r"""
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1500px; padding: 0 18px 60px; color: #1d1d1f; }
h1 { font-size: 22px; margin: 18px 0 4px; }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
.meta { color: #555; margin: 2px 0; }
.note { background: #eef4ff; border-left: 4px solid #3a6fd8; padding: 6px 10px; }
.error { background: #fdecec; border-left: 4px solid #c62828; padding: 6px 10px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 12.5px; }
caption { text-align: left; font-weight: 600; color: #444; padding: 2px 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
td { word-break: break-word; max-width: 520px; }
table.values:not(.fold) td:not(:last-child) { white-space: nowrap; }
table.lookups tr.walked { background: #fff4c2; font-weight: 600; }
.empty { color: #888; }
#controls { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid #ddd; z-index: 2; }
#controls button { font-size: 14px; margin-right: 6px; padding: 4px 14px; }
#walk { margin-left: 10px; color: #555; }
section.stage { border: 1px solid #ddd; border-radius: 6px; margin: 14px 0; padding: 4px 14px 10px; }
section.stage h2 { font-size: 17px; margin: 8px 0 2px; }
section.stage .num { display: inline-block; min-width: 22px; color: #3a6fd8; }
section.stage .status { font-size: 12px; color: #888; font-weight: normal; margin-left: 8px; }
section.stage[data-status="failed"] .status { color: #c62828; font-weight: 600; }
section.stage .what { color: #444; margin: 2px 0 8px; }
section.stage.pending { opacity: .45; }
section.stage.pending .cols { display: none; }
section.stage.current { border-color: #3a6fd8; box-shadow: 0 0 0 2px #3a6fd833; opacity: 1; }
.cols { display: grid; grid-template-columns: minmax(0, 1.1fr) minmax(0, 1fr); gap: 16px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 4px 0 8px; }
dl.facts dt { color: #555; } dl.facts dd { margin: 0; font-family: ui-monospace, monospace; font-size: 12.5px; word-break: break-all; }
.source { border: 1px solid #e3e3e3; border-radius: 4px; background: #fafafa; overflow: hidden; }
.src-head { padding: 4px 8px; border-bottom: 1px solid #e3e3e3; background: #f2f2f2; font-size: 12px; }
.src-head .file, .src-head .marked { color: #666; margin-left: 6px; }
pre.code { margin: 0; padding: 6px 0; overflow: auto; max-height: 460px; }
.src-line { display: block; white-space: pre; padding: 0 8px; }
.src-line .ln { display: inline-block; width: 42px; color: #aaa; user-select: none; }
.src-line.mark { background: #fff1a8; font-weight: 600; }
details.program pre { max-height: 380px; background: #fafafa; border: 1px solid #e3e3e3; padding: 6px; }
table.fold td:nth-child(4), table.fold td:nth-child(5) { font-family: ui-monospace, monospace; font-size: 11.5px; }
"""

_JS = r"""
(() => {
  const sections = [...document.querySelectorAll('section.stage')];
  const state = document.getElementById('walk');
  const total = sections.length;
  let step = 0, timer = null;
  const btnStep = document.getElementById('btn-step'), btnBack = document.getElementById('btn-back');
  const btnPlay = document.getElementById('btn-play');
  function show() {
    sections.forEach((s, i) => {
      s.classList.toggle('pending', i >= step);
      s.classList.toggle('shown', i < step);
      s.classList.toggle('current', i === step - 1);
    });
    state.dataset.step = String(step);
    state.dataset.done = String(step >= total);
    const cur = sections[step - 1];
    state.textContent = 'stage ' + step + ' of ' + total + (cur ? ': ' + cur.dataset.stage : '');
    btnStep.disabled = step >= total;
    btnBack.disabled = step <= 0;
    if (cur) {
      const pre = cur.querySelector('.source pre'), mark = cur.querySelector('.src-line.mark');
      if (pre && mark) pre.scrollTop = Math.max(0, mark.offsetTop - pre.offsetTop - 80);
      if (cur.scrollIntoView) cur.scrollIntoView({block: 'nearest'});
    }
  }
  function stepOn() { if (step < total) { step += 1; show(); } if (step >= total) stop(); }
  function back() { if (step > 0) { step -= 1; show(); } }
  function stop() { if (timer) { clearInterval(timer); timer = null; btnPlay.textContent = 'Play'; } }
  function play() {
    if (timer) { stop(); return; }
    if (step >= total) { step = 0; show(); }
    btnPlay.textContent = 'Pause';
    timer = setInterval(stepOn, 700);
  }
  function reset() { stop(); step = 0; show(); }
  btnStep.addEventListener('click', () => { stop(); stepOn(); });
  btnBack.addEventListener('click', () => { stop(); back(); });
  btnPlay.addEventListener('click', play);
  document.getElementById('btn-reset').addEventListener('click', reset);
  document.addEventListener('keydown', (ev) => {
    if (ev.target && /INPUT|TEXTAREA|SELECT/.test(ev.target.tagName)) return;
    if (ev.key === 'ArrowRight' || ev.key === ' ' || ev.key === 'j') { stop(); stepOn(); ev.preventDefault(); }
    else if (ev.key === 'ArrowLeft' || ev.key === 'k') { stop(); back(); ev.preventDefault(); }
    else if (ev.key === 'p') { play(); }
    else if (ev.key === 'r') { reset(); }
  });
  show();
  document.body.dataset.ready = 'true';
})();
"""
