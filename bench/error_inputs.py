"""Bad input on the lazy device: every OpInfo's ``error_inputs`` run on ``lazyxla.device()``.

Each ``ErrorInput`` of ``torch.testing._internal.common_methods_invocations.op_db`` (made for
the CPU, as PyTorch's ``test_errors`` does) is a call eager PyTorch refuses. Here each one is
run on its own: eager on the CPU first (a case eager accepts in this PyTorch is counted apart,
``eager-accepts``), then with its tensors moved to the lazy device, keeping their aliasing (one
CPU tensor used twice is one lazy tensor; a view of another tensor of the sample, such as an
``expand``, stays that view on the lazy device), and the result forced: ``lazyxla.sync()``,
then every tensor of the result read back, so that an error lazyxla defers surfaces too.

A case ends as
- ``raise``: lazyxla raised, when the op was recorded (``at record``) or only at the sync or
  the read (``at sync``); ``matching`` counts those whose exception has eager's type and
  matches the ErrorInput's ``error_regex``;
- ``silent``: a result came back, no error: these are listed (op, variant, input, eager's
  expected error);
- ``crash``: the process running the case died (a hard crash of XLA or PyTorch);
- ``harness``: this script itself failed on the case (listed, as a crash is).

The cases run in a child process, which reports each one as it finishes; if it dies, the case
it was running is a crash and a new child goes on with the next (``--in-process``: no child).
tests/test_error_inputs.py runs the cases in its own process through ``cases`` and
``run_case``. Touches the lazy device (pending IR is synced after each case) and the CPU seed.
Usage: python bench/error_inputs.py [--ops NAME,...] [--json FILE] [--in-process] [--quiet]
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings

TIME_LIMIT = 60  # seconds per case


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def full_name(opinfo) -> str:
    return opinfo.name + ("." + opinfo.variant_test_name if opinfo.variant_test_name else "")


def cases(names=None):
    """``[(op index, error input index, full name), ...]`` in op_db's order."""
    out = []
    for i, o in enumerate(_op_db()):
        if o.error_inputs_func is None:
            continue
        n = full_name(o)
        if names is not None and o.name not in names and n not in names:
            continue
        try:
            k = len(list(_error_inputs(o)))
        except Exception:  # noqa: BLE001 - an OpInfo whose error inputs cannot be made here
            continue
        out += [(i, j, n) for j in range(k)]
    return out


def _error_inputs(o):
    """``o.error_inputs("cpu")`` without its tracking wrapper, which inspects the whole call
    stack for every input (slow under pytest)."""
    return o.error_inputs_func(o, "cpu")


def error_input(op_i, j):
    import torch
    o = _op_db()[op_i]
    torch.manual_seed(0)
    for k, ei in enumerate(_error_inputs(o)):
        if k == j:
            return o, ei
    raise IndexError(j)


# ---------------------------------------------------------------------------------------
# Moving a sample to the lazy device, aliasing kept.
class Mover:
    """CPU tensors -> lazy tensors: the same object once; a view of a base (``t._base``) as the
    same strided view of the moved base, so storage sharing (out= overlapping an input, an
    expanded out=) reaches lazyxla as it reached eager."""

    def __init__(self, dev):
        self.dev = dev
        self.memo = {}

    def __call__(self, x):
        import torch
        if isinstance(x, torch.Tensor):
            got = self.memo.get(id(x))
            if got is not None:
                return got[1]
            if x.layout != torch.strided:
                y = x.to(self.dev)
            elif x._base is not None:
                base = self(x._base)
                y = base.as_strided(x.size(), x.stride(), x.storage_offset())
            else:
                y = x.detach().to(self.dev)
                if x.requires_grad:
                    y.requires_grad_(True)
            self.memo[id(x)] = (x, y)  # the CPU tensor kept alive: its id is not reused
            return y
        if isinstance(x, list):
            return [self(v) for v in x]
        if isinstance(x, tuple):
            return tuple(self(v) for v in x)
        if isinstance(x, dict):
            return {k: self(v) for k, v in x.items()}
        if (isinstance(x, torch.device) and x.type == "cpu") or (isinstance(x, str) and x == "cpu"):
            return self.dev
        return x


def describe(sample) -> str:
    """The call's arguments, short: ``f32[3, 4]``, strides when not contiguous, ``=arg0`` for
    a tensor that is one given before."""
    import torch
    seen = {}

    def d(x, path):
        if isinstance(x, torch.Tensor):
            if id(x) in seen:
                return f"={seen[id(x)]}"
            seen[id(x)] = path
            dt = str(x.dtype).replace("torch.", "")
            s = f"{dt}{list(x.shape)}"
            if x.layout == torch.strided and not x.is_contiguous():
                s += f"(stride={list(x.stride())})"
            if x._base is not None:
                s += "(view)"
            return s
        if isinstance(x, (list, tuple)):
            inner = ", ".join(d(v, f"{path}[{i}]") for i, v in enumerate(x))
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={d(v, k)}" for k, v in x.items()) + "}"
        r = repr(x)
        return r if len(r) <= 40 else r[:37] + "..."

    parts = [d(sample.input, "input")] + [d(a, f"arg{i}") for i, a in enumerate(sample.args)]
    parts += [f"{k}={d(v, k)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


def _first_line(e) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line[:300]}"


def _matches(e, ei) -> bool:
    return isinstance(e, ei.error_type) and re.search(ei.error_regex, str(e)) is not None


class _TimeLimit(BaseException):
    pass


def _alarm(signum, frame):
    raise _TimeLimit()


def run_case(op_i, j) -> dict:
    """One error input: eager on the CPU, then on the lazy device; the outcome as a dict."""
    import torch
    from torch.utils._pytree import tree_flatten
    import lazyxla
    o, ei = error_input(op_i, j)
    s = ei.sample_input
    rec = {"op": o.name, "variant": o.variant_test_name, "input": describe(s),
           "expected": f"{ei.error_type.__name__}: {ei.error_regex}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:  # eager, on fresh copies of the same error input (the op may write its arguments)
            o2, ei2 = error_input(op_i, j)
            s2 = ei2.sample_input
            o2(s2.input, *s2.args, **s2.kwargs)
            rec["outcome"] = "eager-accepts"
            return rec
        except Exception as e:  # noqa: BLE001 - what eager says
            rec["eager"] = _first_line(e)
        mv = Mover(lazyxla.device())
        t0 = time.perf_counter()
        try:
            a, args, kw = mv(s.input), mv(tuple(s.args)), mv(dict(s.kwargs))
        except Exception as e:  # noqa: BLE001 - the move itself refused
            rec.update(outcome="raise", when="move", error=_first_line(e), matching=_matches(e, ei))
            return rec
        when = "record"
        try:
            r = o(a, *args, **kw)
            when = "sync"
            lazyxla.sync()
            for t in tree_flatten(r)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                    t.cpu()
            lazyxla.wait_device_ops()
            rec["outcome"] = "silent"
            rec["result"] = ", ".join(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
                                      if isinstance(t, torch.Tensor) else repr(t)[:40]
                                      for t in tree_flatten(r)[0])
        except _TimeLimit:
            raise
        except Exception as e:  # noqa: BLE001 - lazyxla refused: that is what is wanted
            rec.update(outcome="raise", when=when, error=_first_line(e), matching=_matches(e, ei))
        rec["ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    return rec


def _settle():
    """Leave nothing pending from one case to the next."""
    import lazyxla
    gc.collect(1)  # the case's own cycles: young objects (a full collection costs 0.1 s under pytest)
    for f in (lazyxla.sync, lazyxla.wait_device_ops):
        try:
            f()
        except Exception:  # noqa: BLE001 - a failed program of the last case: reported once
            pass


def child(ids):
    """Run the cases ``ids`` (``op:j``), one JSON line each on stdout as it finishes."""
    import lazyxla  # noqa: F401
    signal.signal(signal.SIGALRM, _alarm)
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever an op prints stays out of the protocol
    for cid in ids:
        op_i, j = map(int, cid.split(":"))
        signal.alarm(TIME_LIMIT)
        try:
            rec = run_case(op_i, j)
        except _TimeLimit:
            rec = {"outcome": "raise", "when": "timeout", "error": f"over {TIME_LIMIT} s", "matching": False}
        except Exception as e:  # noqa: BLE001 - the harness itself failed on this case
            rec = {"outcome": "harness", "error": _first_line(e)}
        finally:
            signal.alarm(0)
        _settle()
        rec["id"] = cid
        out.write(json.dumps(rec) + "\n")
        out.flush()


def run_all(todo, in_process=False, progress=None):
    """Every case's record, in order; a child that dies marks its current case a crash."""
    results = {}
    names = {f"{i}:{j}": n for i, j, n in todo}
    ids = list(names)
    if in_process:
        import lazyxla  # noqa: F401
        for cid in ids:
            op_i, j = map(int, cid.split(":"))
            rec = run_case(op_i, j)
            _settle()
            rec["id"] = cid
            results[cid] = rec
            if progress:
                progress(rec)
        return [results[c] for c in ids]
    pending = ids
    while pending:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", ",".join(pending)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        for line in p.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            results[rec["id"]] = rec
            if progress:
                progress(rec)
        rc = p.wait()
        left = [c for c in pending if c not in results]
        if left and rc != 0:
            op_i, j = map(int, left[0].split(":"))
            rec = {"id": left[0], "op": names[left[0]], "variant": "", "outcome": "crash",
                   "error": f"the process died (exit status {rc})"}
            try:
                o, ei = error_input(op_i, j)
                rec.update(op=o.name, variant=o.variant_test_name, input=describe(ei.sample_input),
                           expected=f"{ei.error_type.__name__}: {ei.error_regex}")
            except Exception:  # noqa: BLE001
                pass
            results[left[0]] = rec
            if progress:
                progress(rec)
            left = left[1:]
        elif left:  # the child ended well without reporting them: the harness failed on them
            for cid in left:
                results[cid] = {"id": cid, "op": names[cid], "variant": "", "outcome": "harness",
                                "error": "not reported by the child process"}
            left = []
        pending = left
    return [results[c] for c in ids]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", help="OpInfo names, comma-separated (a name takes every variant)")
    ap.add_argument("--json", help="write every case's record to this file")
    ap.add_argument("--in-process", action="store_true", help="run the cases in this process")
    ap.add_argument("--quiet", action="store_true", help="no per-case progress")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        child([c for c in a.child.split(",") if c])
        return 0
    todo = cases(set(a.ops.split(",")) if a.ops else None)
    t0 = time.perf_counter()
    done = [0]

    def progress(rec):
        done[0] += 1
        if not a.quiet and rec["outcome"] in ("silent", "crash", "harness"):
            print(f"[{done[0]}/{len(todo)}] {rec['outcome']}: {rec.get('op')}", file=sys.stderr, flush=True)

    recs = run_all(todo, a.in_process, progress)
    n = collections.Counter(r["outcome"] for r in recs)
    raised = [r for r in recs if r["outcome"] == "raise"]
    when = collections.Counter(r.get("when") for r in raised)
    print(f"{len(recs)} error inputs of {len({r['op'] + '.' + (r.get('variant') or '') for r in recs})} OpInfos "
          f"in {time.perf_counter() - t0:.0f} s")
    print(f"raise {n['raise']} (at record {when['record'] + when['move']}, at sync or read {when['sync']}, "
          f"timeout {when['timeout']}; eager's exception type and message: "
          f"{sum(bool(r.get('matching')) for r in raised)})")
    print(f"silent {n['silent']}")
    print(f"crash {n['crash']}")
    if n["eager-accepts"] or n["harness"]:
        print(f"(eager accepts {n['eager-accepts']}; harness failures {n['harness']})")
    silent = [r for r in recs if r["outcome"] in ("silent", "crash", "harness")]
    if silent:
        print("\nsilent (and crashed) cases:")
        for r in silent:
            v = f".{r['variant']}" if r.get("variant") else ""
            print(f"  [{r['outcome']}] {r['op']}{v}({r.get('input', '')})\n      eager: {r.get('expected')}"
                  + (f"\n      {r['error']}" if r.get("error") else ""))
    late = [r for r in raised if r.get("when") == "sync"]
    if late:
        print("\nraised only at the sync or the read:")
        for r in late:
            v = f".{r['variant']}" if r.get("variant") else ""
            print(f"  {r['op']}{v}({r.get('input', '')}): {r.get('error')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
