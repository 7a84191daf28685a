"""int64 held in 32 bits on the device (``lazyxla.xla.widths``): a TPU's default, and what
``XLA_USE_32BIT_LONG=1`` asks for on any platform (here: XLA:CPU, in a process of its own).

To PyTorch the tensors stay int64. Their programs hold no 64-bit integer. Values are eager's.
A value that does not fit is an error naming the op and the user's line, never a wrapped
number: an upload, a Python scalar, or a result that left the range (a value check).
"""
import os
import subprocess
import sys

import pytest

from lazyhelp import json_runs

CHILD = r'''
import json
import torch
import torch.nn as nn
import torch.nn.functional as F
import lazyxla
import lazyxla.debug.metrics as met
from lazyxla.compiler.cache import computation_cache
from lazyxla.xla import client, widths

out = {"bits": widths.long_bits(), "env": client.compile_environment()["XLA_USE_32BIT_LONG"]}
d = lazyxla.device()

# a small causal LM: token and position embeddings, labels with ignored positions, argmax
# accuracy; three SGD steps lazily and eagerly from the same weights
torch.manual_seed(0)
V, T, D = 50, 12, 16
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos, self.out = nn.Embedding(V, D), nn.Embedding(T, D), nn.Linear(D, V)
    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.out(torch.tanh(self.tok(ids) + self.pos(pos)))
ids = torch.randint(0, V, (4, T))
labels = ids.clone()
labels[:, :3] = -100
runs = {}
for where in ("cpu", d):
    torch.manual_seed(1)
    m = LM().to(where)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    x, y = ids.to(where), labels.to(where)
    losses, hits = [], []
    for _ in range(3):
        logits = m(x)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), y[:, 1:].reshape(-1), ignore_index=-100)
        loss.backward()
        opt.step()
        opt.zero_grad()
        hit = ((logits.argmax(-1) == y) & (y != -100)).sum()
        if where is d:
            lazyxla.sync()
        losses.append(loss.item())
        hits.append(hit.item())
    runs[str(where)] = (losses, hits, hit.dtype == torch.int64)
    if where is d:
        out["s64_in_step"] = " s64[" in computation_cache().values()[-1].executable.as_text()
out["runs"] = runs

edges = torch.tensor([-(2 ** 31), 2 ** 31 - 1, 0, -5])
back = edges.to(d).cpu()
out["round_trip"] = [str(back.dtype), back.tolist() == edges.tolist()]

def error(fn):
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"

big = torch.tensor([2 ** 30, 3]).to(d)
small = torch.tensor([7, -3]).to(d)
out["errors"] = {
    "upload": error(lambda: torch.tensor([2 ** 40]).to(d)),
    "scalar": error(lambda: (small + 2 ** 40).cpu()),
    "mul": error(lambda: (big * 4).cpu()),
    "add": error(lambda: (big + big + big).cpu()),
    "sum": error(lambda: torch.cat([big, big, big]).sum().cpu()),
    "cumsum": error(lambda: big.repeat(3).cumsum(0).cpu()),
    "pow": error(lambda: (small ** 12).cpu()),
    "lshift": error(lambda: (small << 30).cpu()),
    "long": error(lambda: torch.tensor([3e9, 1.5]).to(d).long().cpu()),
    "lcm": error(lambda: torch.lcm(torch.tensor([2 ** 31 - 1]).to(d), torch.tensor([2]).to(d)).cpu()),
    "mm": error(lambda: (big.view(2, 1) @ big.view(1, 2) * 1).cpu()),
}
# the same ops inside the range: eager's values, no error
s = torch.tensor([2 ** 20, -3])
sd = s.to(d)
fine = {
    "mul": (sd * 4, s * 4), "sum": (torch.cat([sd, sd]).sum(), torch.cat([s, s]).sum()),
    "cumsum": (sd.cumsum(0), s.cumsum(0)), "pow": (sd ** 1, s ** 1), "neg_pow": (sd ** torch.tensor([-1, -2]).to(d), s ** torch.tensor([-1, -2])),
    "lshift": (sd << 4, s << 4), "long": (torch.tensor([-2.7, 3e8]).to(d).long(), torch.tensor([-2.7, 3e8]).long()),
    "lcm": (torch.lcm(sd, torch.tensor([6, 4]).to(d)), torch.lcm(s, torch.tensor([6, 4]))),
    "mm": (sd.view(2, 1) @ (sd.view(1, 2) % 7), s.view(2, 1) @ (s.view(1, 2) % 7)),
}
out["fine"] = {k: [a.cpu().tolist() == b.tolist(), str(a.dtype)] for k, (a, b) in fine.items()}

# random numbers stay in the 32-bit trace (the key from the seed's 32 bits, randint's draws in
# the held int32): draws in [3, 11), no int64 in the program (XLA's generator keeps its own
# state as u64[2])
def wide():
    return met.counter_value("WideIntegerTrace") or 0
before = wide()
r, drop = torch.randint(3, 11, (4000,), device=d), F.dropout(torch.ones(64, device=d), 0.5)
text = lazyxla.dump_hlo([r, drop])
r, drop = r.cpu(), drop.cpu()
out["randint"] = [int(r.min()), int(r.max()), wide() - before, " s64[" in text,
                  sorted(set(drop.tolist()))]
out["randint_big"] = error(lambda: torch.randint(0, 2 ** 40, (3,), device=d).cpu())
# a lowering that holds a 64-bit integer itself (the polynomials' n beyond int64's range) is
# traced again at 64 bits, with eager's values
before = wide()
x, n = torch.tensor([0.3, -0.5, 0.9]), torch.tensor([3., 5., 40.])
p = torch.special.chebyshev_polynomial_t(x.to(d), n.to(d)).cpu()
out["poly"] = [torch.allclose(p, torch.special.chebyshev_polynomial_t(x, n), atol=1e-5), wide() - before]
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def narrow():
    return json_runs(CHILD, XLA_USE_32BIT_LONG="1", timeout=600)[0]


def test_a_step_holds_no_64_bit_integer_and_trains_as_eager(narrow):
    assert narrow["bits"] == 32 and narrow["env"] == "32"  # part of every program's key
    cpu, dev = narrow["runs"]["cpu"], narrow["runs"]["lazyxla:0"]
    assert dev[2], "an int64 result came back as another dtype"
    assert dev[1] == cpu[1]  # argmax hits, exactly
    for a, b in zip(dev[0], cpu[0]):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (dev[0], cpu[0])
    assert not narrow["s64_in_step"], "the step's program holds a 64-bit integer"
    assert narrow["round_trip"] == ["torch.int64", True]


def test_a_value_that_does_not_fit_is_an_error_naming_the_op_and_line(narrow):
    errs = narrow["errors"]
    # where the value came from, and the user's line (this child is ``python -c``: "<string>")
    assert errs["upload"].startswith("LazyXlaOverflowError: lazyxla: upload at <string>:"), errs["upload"]
    assert "1099511627776" in errs["upload"]
    assert "the int64 scalar 1099511627776" in errs["scalar"] and "add" in errs["scalar"]
    ops = {"mul": "aten::mul", "add": "aten::add", "sum": "aten::sum", "cumsum": "aten::cumsum",
           "pow": "aten::pow", "lshift": "lshift", "long": "aten::_to_copy", "lcm": "aten::lcm", "mm": "aten::mm"}
    for name, op in ops.items():
        e = errs[name]
        assert e is not None, f"{name}: a wrapped value, no error"
        assert e.startswith("ValueCheckError: lazyxla: ") and op in e and " at <string>:" in e, e
        assert "outside -2**31 .. 2**31-1" in e and "XLA_USE_32BIT_LONG=0" in e, e


def test_ops_inside_the_range_give_eagers_values(narrow):
    for name, (same, dtype) in narrow["fine"].items():
        assert same and dtype == "torch.int64", (name, same, dtype)


def test_random_numbers_stay_in_the_32_bit_trace(narrow):
    lo, hi, wide, holds64, dropped = narrow["randint"]
    assert (lo, hi) == (3, 10)
    assert wide == 0 and not holds64
    assert dropped == [0.0, 2.0]
    e = narrow["randint_big"]
    assert e is not None and "aten::randint" in e and " at <string>:" in e, e


def test_a_lowering_that_needs_int64_is_traced_at_64_bits(narrow):
    same, wide = narrow["poly"]
    assert same and wide >= 1


def test_the_width_is_the_platforms_unless_set():
    """XLA:CPU holds int64 in 64 bits; XLA_USE_32BIT_LONG=0 keeps them there too; a value that
    is neither is refused with what it takes."""
    # in each process too: an int32 made from int64 wraps, as PyTorch's does (only int64 is checked)
    code = ("import json, torch, lazyxla; from lazyxla.xla import widths; "
            "x = torch.tensor([2 ** 40]).to(lazyxla.device()); w = torch.tensor([2 ** 31 + 5, -3]); "
            "print(json.dumps([widths.long_bits(), (x * 4).item(), w.to(lazyxla.device()).int().cpu().tolist(), "
            "w.int().tolist()]))")
    for env in ({}, {"XLA_USE_32BIT_LONG": "0"}):
        assert json_runs(code, **env)[0] == [64, 2 ** 42, [-(2 ** 31) + 5, -3], [-(2 ** 31) + 5, -3]]
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, XLA_USE_32BIT_LONG="maybe"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "XLA_USE_32BIT_LONG='maybe': 1 holds int64 in 32 bits" in r.stderr


def test_where_float64_is_emulated_its_programs_keep_their_float64():
    """As on a TPU (``widths.FLOAT64_NATIVE``): a program that holds float64 only inside (PyTorch's
    pinv takes its tolerances as float64 tensors) is traced in JAX's 32-bit mode, one with a
    float64 argument or result at 64 bits; both give eager's values."""
    code = r'''
import json, torch, lazyxla
import lazyxla.debug.metrics as met
from lazyxla.xla import widths
widths.FLOAT64_NATIVE["cpu"] = False
d = lazyxla.device()
a = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
x = torch.randn(6, dtype=torch.float64)
got = [torch.linalg.pinv(a.to(d), rtol=0.3), (x.to(d) * 0.1).sum(), torch.arange(5, device=d) * 3]
want = [torch.linalg.pinv(a, rtol=0.3), (x * 0.1).sum(), torch.arange(5) * 3]
print(json.dumps({"same": [bool(torch.allclose(g.cpu(), w, rtol=1e-5, atol=1e-6)) for g, w in zip(got, want)],
                  "dtypes": [str(g.dtype) for g in got], "wide": met.counter_value("WideIntegerTrace") or 0}))
'''
    out = json_runs(code, XLA_USE_32BIT_LONG="1")[0]
    assert out["same"] == [True, True, True], out
    assert out["dtypes"] == ["torch.float32", "torch.float64", "torch.int64"]
    assert out["wide"] == 0  # none of them needed a second trace
