"""Writes the manual's two diagrams, docs/img/dataflow.svg and docs/img/fold.svg.

    python docs/figures.py

Plain SVG (boxes, arrows, text), no dependency beyond Python; the files are checked in, and
tests/test_docs_site.py checks that they are what this script writes, so edit the pictures here.
"""
from __future__ import annotations

import os
import sys
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
FONT = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""
INK, MUTED, EDGE = "#1f2430", "#5a6275", "#3f51b5"
FILLS = {"record": "#e8eaf6", "sync": "#fff3e0", "key": "#e0f2f1", "miss": "#fce4ec", "run": "#e8f5e9"}


def _svg(width, height, body, title):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">\n'
            f'<title>{escape(title)}</title>\n'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE}"/></marker></defs>\n'
            f'<rect width="{width}" height="{height}" fill="#ffffff"/>\n'
            + "".join(body) + "</svg>\n")


def _box(x, y, w, h, lines, fill, sub=None):
    out = [f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" stroke="{EDGE}" stroke-width="1.5"/>\n']
    n = len(lines) + (1 if sub else 0)
    top = y + h / 2 - (n - 1) * 9
    for i, line in enumerate(lines):
        out.append(f'<text x="{x + w / 2}" y="{top + i * 18 + 5}" text-anchor="middle" font-size="14" '
                   f'font-weight="bold" fill="{INK}" {FONT}>{escape(line)}</text>\n')
    if sub:
        out.append(f'<text x="{x + w / 2}" y="{top + len(lines) * 18 + 5}" text-anchor="middle" font-size="11.5" '
                   f'fill="{MUTED}" {FONT}>{escape(sub)}</text>\n')
    return out


def _arrow(x1, y1, x2, y2, label=None, dashed=False, lx=None, ly=None):
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    out = [f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{EDGE}" stroke-width="1.8"{dash} marker-end="url(#arrow)"/>\n']
    if label:
        lx = (x1 + x2) / 2 if lx is None else lx
        ly = (y1 + y2) / 2 - 6 if ly is None else ly
        out.append(f'<text x="{lx}" y="{ly}" text-anchor="middle" font-size="11.5" fill="{MUTED}" {FONT}>{escape(label)}</text>\n')
    return out


def _path(d, label=None, lx=0, ly=0, dashed=False):
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    out = [f'<path d="{d}" fill="none" stroke="{EDGE}" stroke-width="1.8"{dash} marker-end="url(#arrow)"/>\n']
    if label:
        out.append(f'<text x="{lx}" y="{ly}" text-anchor="middle" font-size="11.5" fill="{MUTED}" {FONT}>{escape(label)}</text>\n')
    return out


def dataflow() -> str:
    """torch op -> IR node -> sync/read -> collect -> graph hash -> cache -> (miss: lower ->
    compile) -> execute -> device buffers -> tensors, one row per phase, each box its package."""
    w, h, bw, bh = 960, 430, 150, 62
    xs = [30, 215, 400, 585, 770]
    b = []
    # row 1: recording, nothing runs
    row1 = [("torch op", "your PyTorch code"), ("frontend", "LazyTensor dispatch"), ("IR node", "ir/: op, shape, hash"),
            ("pending IR", "the tensor's value"), ("sync / read", "engine/")]
    fills1 = ["record", "record", "record", "record", "sync"]
    y1 = 40
    for x, (t, s), f in zip(xs, row1, fills1):
        b += _box(x, y1, bw, bh, [t], FILLS[f], s)
    for a, c in zip(xs, xs[1:]):
        b += _arrow(a + bw, y1 + bh / 2, c - 4, y1 + bh / 2)
    b.append(f'<text x="30" y="25" font-size="12.5" fill="{MUTED}" {FONT}>recorded, not run: every op adds a node</text>\n')
    # row 2: the key and the lookup, right to left
    y2 = 185
    row2 = [(770, ["collect"], "keys/: post-order"), (585, ["graph hash"], "keys/: six merges"),
            (400, ["cache"], "compiler/: LRU, on disk")]
    for x, t, s in row2:
        b += _box(x, y2, bw, bh, t, FILLS["key"], s)
    b += _arrow(770 + bw / 2, y1 + bh, 770 + bw / 2, y2 - 4)
    b += _arrow(770, y2 + bh / 2, 585 + bw + 4, y2 + bh / 2)
    b += _arrow(585, y2 + bh / 2, 400 + bw + 4, y2 + bh / 2)
    # the miss branch
    b += _box(215, y2 - 60, bw, bh - 8, ["lower"], FILLS["miss"], "lowering/ (pad, roll)")
    b += _box(30, y2 - 60, bw, bh - 8, ["compile"], FILLS["miss"], "XLA through JAX")
    b += _path(f"M {400} {y2 + 14} L {215 + bw / 2} {y2 + 14} L {215 + bw / 2} {y2 - 60 + bh - 8 + 4}")
    b.append(f'<text x="{(400 + 215 + bw / 2) / 2 + 20}" y="{y2 + 8}" text-anchor="middle" font-size="11.5" fill="{MUTED}" {FONT}>miss</text>\n')
    b += _arrow(215, y2 - 60 + (bh - 8) / 2, 30 + bw + 4, y2 - 60 + (bh - 8) / 2)
    # row 3: running
    y3 = 320
    row3 = [(30, ["execute"], "run/: asynchronous"), (215, ["device buffers"], "jax.Array outputs"),
            (400, ["tensors"], "values replace the IR")]
    for x, t, s in row3:
        b += _box(x, y3, bw, bh, t, FILLS["run"], s)
    b += _arrow(30 + bw / 2, y2 - 60 + bh - 8, 30 + bw / 2, y3 - 4, "program", lx=30 + bw / 2 + 34, ly=(y2 + y3) / 2 - 20)
    b += _path(f"M {400 + bw / 2} {y2 + bh} L {400 + bw / 2} {y2 + bh + 30} L {30 + bw * 0.8} {y2 + bh + 30} "
               f"L {30 + bw * 0.8} {y3 - 4}", "hit: the cached program", (400 + 30 + bw) / 2 + 40, y2 + bh + 24)
    b += _arrow(30 + bw, y3 + bh / 2, 215 - 4, y3 + bh / 2)
    b += _arrow(215 + bw, y3 + bh / 2, 400 - 4, y3 + bh / 2)
    b.append(f'<text x="585" y="{y3 + 22}" font-size="12.5" fill="{MUTED}" {FONT}>A sync computes every tensor with pending IR;</text>\n')
    b.append(f'<text x="585" y="{y3 + 40}" font-size="12.5" fill="{MUTED}" {FONT}>a value read only the tensors it reads,</text>\n')
    b.append(f'<text x="585" y="{y3 + 58}" font-size="12.5" fill="{MUTED}" {FONT}>and keeps their IR pending.</text>\n')
    return _svg(w, h, b, "lazyxla's data flow: a torch op becomes an IR node; a sync or a value read "
                "collects the pending IR and hashes it; the hash finds a program in the cache or the "
                "graph is lowered and compiled; the program runs and its device buffers become the tensors' values")


MERGES = [("force_ltc_data", "sync or read"), ("environment", "platform, flags"),
          ("tensors", "root IR hashes"), ("parameters", "the input order"),
          ("donation", "donated indices"), ("sharding", "auto-SPMD mesh")]


def fold() -> str:
    """The six merges of R3 as one chain, from force_ltc_data to the key."""
    w, h = 1040, 250
    b = []
    bw, bh, gap = 132, 58, 22
    x0, y = 40, 120
    prev = None
    for i, (site, what) in enumerate(MERGES):
        x = x0 + i * (bw + gap)
        if prev is not None:
            b += _arrow(prev, y + bh / 2, x - 4, y + bh / 2)
        b += _box(x, y, bw, bh, [f"{i + 1}. merge"], FILLS["key"], "digest after it")
        # the ingredient, above, flowing in
        b += _box(x + 4, 18, bw - 8, 54, [site], FILLS["record"], what)
        b += _arrow(x + bw / 2, 72, x + bw / 2, y - 4)
        prev = x + bw
    kx = x0 + 6 * (bw + gap)
    b += _arrow(prev, y + bh / 2, kx - 4, y + bh / 2)
    b += _box(kx, y, w - 14 - kx, bh, ["key"], FILLS["sync"], "128 bits")
    b.append(f'<text x="{w / 2}" y="{y + bh + 40}" text-anchor="middle" font-size="12.5" fill="{MUTED}" {FONT}>'
             'Each merge folds one ingredient into the digest (16-byte BLAKE2b): a change at one merge '
             'changes every digest after it.</text>\n')
    b.append(f'<text x="{w / 2}" y="{y + bh + 60}" text-anchor="middle" font-size="12.5" fill="{MUTED}" {FONT}>'
             'The donation merge is made only when some parameter is donated. lazyxla.debug.last_fold() '
             'returns every step.</text>\n')
    return _svg(w, h, b, "The graph hash: the digest takes six merges in order (force_ltc_data, the "
                "compilation environment, each pending tensor's root hash, the parameter sequence, the "
                "donated indices, the sharding flag); the last digest is the cache key")


FIGURES = {"img/dataflow.svg": dataflow, "img/fold.svg": fold}


def main(argv=None) -> int:
    for rel, make in FIGURES.items():
        path = os.path.join(HERE, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(make())
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
