"""Reading a profile: a trace's device time per step, by op kind, by the user's line, top ops.

``read(log_dir)`` takes what ``debug.profiler.stop_trace`` (or ``jax.profiler`` with
``create_perfetto_trace=True`` and ``profiler.write_programs``) left in ``log_dir``: the
Perfetto trace and the compiled programs' text. Each device op the trace timed is found in its
program by name, and its ``op_name`` metadata says which ATen op and which user line it was
lowered from (``aten.mm at train.py:42``, ``lowering.program.scope_name``); a fused op is its
root's. Two trace layouts are read:

- a TPU's (or a GPU's): a ``/device:...`` process whose ``XLA Modules`` thread has one event per
  program run and whose ``XLA Ops`` thread has one event per op run, an op's program being the
  run it falls in;
- XLA:CPU's: host threads' events that name their program (``hlo_module``) and op (``hlo_op``).

``report(profile, top)`` is what ``lazyxla profile`` prints. Touches nothing: reads files.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re

from .profiler import PROGRAMS_DIR

_LINE = re.compile(r"([\w.\-]+) at ([^/\"]+:\d+)")
_INSTR = re.compile(r"\s+(?:ROOT )?%?([\w.\-]+) = (.*)")


class OpRun:
    __slots__ = ("program", "name", "us", "category")

    def __init__(self, program, name, us, category=""):
        self.program, self.name, self.us, self.category = program, name, us, category


class Profile:
    """Device time of one trace: ``programs`` (module name -> runs' microseconds), ``ops`` (each
    op run), ``origin`` ((module, op) -> (ATen op, user line) or None), ``steps``."""

    def __init__(self, programs, ops, origin, device):
        self.programs, self.ops, self.origin, self.device = programs, ops, origin, device
        self.steps = max((len(v) for v in programs.values()), default=0) or 1

    def where(self, run):
        return self.origin.get((run.program, run.name))

    def per_step(self, key):
        """(key, device us per step), largest first, for ``key(op run)``."""
        total = collections.Counter()
        for r in self.ops:
            total[key(r)] += r.us
        return [(k, v / self.steps) for k, v in total.most_common()]


def trace_file(log_dir: str) -> str:
    found = sorted(glob.glob(os.path.join(log_dir, "**", "*perfetto_trace.json.gz"), recursive=True)
                   + glob.glob(os.path.join(log_dir, "**", "*perfetto_trace.json"), recursive=True),
                   key=os.path.getmtime)
    if not found:
        raise FileNotFoundError(f"no Perfetto trace under {log_dir} (jax.profiler.start_trace(..., "
                                f"create_perfetto_trace=True), or lazyxla.debug.profiler.start_trace)")
    return found[-1]


def origins(program_text: str) -> dict:
    """op name -> (ATen op, user line) for each instruction of a program's text whose
    ``op_name`` metadata carries a lowering's scope."""
    out = {}
    for name, text in _instructions(program_text):
        op_name = re.search(r'op_name="([^"]*)"', text)
        found = _LINE.findall(op_name.group(1)) if op_name else None
        if found:
            out[name] = found[-1]
    return out


def _instructions(program_text: str):
    """(name, text) of each instruction; an instruction's text may span lines (a Pallas
    kernel's custom call carries its kernel's metadata as text with line breaks)."""
    name, parts = None, []
    for line in program_text.splitlines():
        m = _INSTR.match(line)
        if m or not line.startswith((" ", '"', "}}")):
            if name is not None:
                yield name, "\n".join(parts)
            name, parts = (m.group(1), [m.group(2)]) if m else (None, [])
        elif name is not None:
            parts.append(line)
    if name is not None:
        yield name, "\n".join(parts)


def _program_texts(log_dir):
    texts = {}
    for path in glob.glob(os.path.join(log_dir, PROGRAMS_DIR, "*.hlo.txt")):
        texts[os.path.basename(path)[:-len(".hlo.txt")]] = open(path).read()
    return texts


def _events(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def parse(events, texts=None) -> Profile:
    """A Profile from a trace's events and the programs' texts (module name -> text)."""
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    device = next((p for p, n in sorted(procs.items()) if n.startswith("/device:")), None)
    programs = collections.defaultdict(list)
    ops = []
    if device is not None:
        tid = {n: t for (p, t), n in threads.items() if p == device}
        runs = sorted((e for e in events if e.get("pid") == device and e.get("tid") == tid.get("XLA Modules")
                       and e.get("ph") == "X"), key=lambda e: e["ts"])
        for e in runs:
            programs[e["name"].split("(")[0]].append(e["dur"])
        spans = [(e["ts"], e["ts"] + e["dur"], e["name"].split("(")[0]) for e in runs]
        k = 0
        for e in sorted((e for e in events if e.get("pid") == device and e.get("tid") == tid.get("XLA Ops")
                         and e.get("ph") == "X"), key=lambda e: e["ts"]):
            while k < len(spans) and spans[k][1] < e["ts"]:
                k += 1
            prog = spans[k][2] if k < len(spans) and spans[k][0] <= e["ts"] else "?"
            ops.append(OpRun(prog, e["name"], e["dur"], e.get("args", {}).get("hlo_category", "")))
        where = procs[device]
    else:  # XLA:CPU: the host threads that ran the programs name them, and each run's id
        by_run = collections.defaultdict(list)
        for e in events:
            a = e.get("args") or {}
            if e.get("ph") != "X" or "hlo_op" not in a or e.get("name", "").startswith("end: "):
                continue
            by_run[(a.get("hlo_module", "?"), a.get("run_id"))].append(OpRun(a.get("hlo_module", "?"), a["hlo_op"],
                                                                              e["dur"]))
        whole = collections.Counter()
        for (prog, _), runs in by_run.items():
            whole[prog] = max(whole[prog], len(runs))
        for (prog, _), runs in by_run.items():
            if len(runs) == whole[prog]:  # a run the trace saw whole (not one cut by its start or end)
                ops.extend(runs)
                programs[prog].append(sum(r.us for r in runs))
        where = "XLA:CPU"
    origin = {}
    for prog, text in (texts or {}).items():
        for op, o in origins(text).items():
            origin[(prog, op)] = o
    return Profile(dict(programs), ops, origin, where)


def read(log_dir: str) -> Profile:
    return parse(_events(trace_file(log_dir)), _program_texts(log_dir))


def _kind(name):
    return re.sub(r"[.\d]+$", "", name)


def report(p: Profile, top: int = 15) -> str:
    ms = lambda us: f"{us / 1e3:8.2f} ms"  # noqa: E731
    lines = [f"{p.device}: {p.steps} step(s) traced; device time per step:"]
    for prog, durs in sorted(p.programs.items()):
        if any(durs):
            lines.append(f"  program {prog}: {len(durs)} run(s), {ms(sum(durs) / p.steps)}")
    lines.append(f"  ops: {ms(sum(r.us for r in p.ops) / p.steps)}")
    lines.append("by the user's line (the ATen op that recorded it):")
    named = p.per_step(lambda r: p.where(r) or ("(no line)", ""))
    for (op, line), us in named[:top]:
        lines.append(f"  {ms(us)}  {line or '-':<32} {op}")
    lines.append("by op kind:")
    for kind, us in p.per_step(lambda r: _kind(r.name))[:top]:
        lines.append(f"  {ms(us)}  {kind}")
    lines.append("top ops:")
    for (prog, name), us in p.per_step(lambda r: (r.program, r.name))[:top]:
        o = p.origin.get((prog, name))
        lines.append(f"  {ms(us)}  {name:<34} {(o[1] + '  ' + o[0]) if o else ''}")
    return "\n".join(lines)
