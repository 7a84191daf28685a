"""The graph hash as a user sees it (R1.3-R1.5, R2, R3 in docs/design.md).

``lazyxla.graph_hash(tensors)`` is the hex of the cache key a sync of the tensors' pending IR
would look up. Besides comparing hashes, several tests check that the hash really is the
cache key: equal hashes must give a CachedCompile on the second sync (with the right numbers),
different hashes an UncachedCompile.
"""
from __future__ import annotations

import gc
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import lazyxla
from lazyhelp import cnt, json_here
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")
_sizes = itertools.count(1101)  # lengths used by no other test file: programs never compiled before


def fresh() -> int:
    return next(_sizes)


def gh(*tensors):
    return lazyxla.graph_hash(list(tensors))


def dev_data(*shape, dtype=torch.float32, seed=0):
    """Device data (uploaded, no IR) with deterministic contents."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        host = torch.randn(*shape, generator=g, dtype=dtype)
    else:
        host = torch.randint(-50, 50, shape, generator=g, dtype=dtype)
    return host, host.to(DEV)


# ---------------------------------------------------------------------------------------
# R2: 128-bit, process independent.
def test_graph_hash_is_128_bit_hex():
    x = torch.ones(3, 4, device=DEV)
    h = gh(x * 2 + 1)
    assert isinstance(h, str)
    assert re.fullmatch(r"[0-9a-f]{32}", h), h


def test_graph_hash_is_deterministic_within_a_process():
    x = torch.ones(3, 4, device=DEV)
    y = (x * 2 + 1).sum(0)
    assert gh(y) == gh(y)
    # Re-recording the same program gives the same hash.
    x2 = torch.ones(3, 4, device=DEV)
    y2 = (x2 * 2 + 1).sum(0)
    assert gh(y2) == gh(y)


_PROGRAM = textwrap.dedent("""
    import json, torch, lazyxla
    dev = lazyxla.device()
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(dev)   # device data (parameter)
    b = torch.ones(2, 3, device=dev)                                   # pending IR (factory)
    r = torch.randn(2, 3, device=dev)                                  # random op (seed parameter)
    y = ((a * 0.5 + b - 1) @ r.t()).sum(1)
    z = torch.arange(5, device=dev) * 3
    print(json.dumps({"y": lazyxla.graph_hash([y]), "yz": lazyxla.graph_hash([y, z])}))
""")


def _start(program, **env_changes):
    env = dict(os.environ)
    for k in ("XLA_HLO_DEBUG", "XLA_IR_DEBUG", "XLA_NO_SPECIAL_SCALARS", "XLA_AUTO_SPMD_MESH"):
        env.pop(k, None)
    env.update(env_changes)
    return subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc):
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


_NO_SPECIAL = textwrap.dedent("""
    import json, torch, lazyxla
    x = torch.arange(4, dtype=torch.float32).to(lazyxla.device())
    gh = lambda t: lazyxla.graph_hash([t])
    print(json.dumps({"same_1_2": gh(x + 1) == gh(x + 2), "same_0_m1": gh(x * 0) == gh(x * -1),
                      "values": [(x + 1).cpu().tolist(), (x * -1).cpu().tolist(), (x * 0).cpu().tolist()]}))
""")


def test_graph_hash_identical_across_processes(tmp_path):
    flags = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={tmp_path}").strip()
    # This process is the first side where its environment is the children's (no debug
    # variable) and its str-hash seed not the second's; otherwise a child is.
    here = not any(os.environ.get(k) for k in ("XLA_HLO_DEBUG", "XLA_IR_DEBUG")) and \
        os.environ.get("PYTHONHASHSEED") != "2"
    procs = {
        # Two interpreters with different str-hash randomisation (R2: no Python hash()).
        **({} if here else {"first": _start(_PROGRAM, PYTHONHASHSEED="1")}),
        "second": _start(_PROGRAM, PYTHONHASHSEED="2"),
        # R3 step 2: XLA_HLO_DEBUG is part of the compilation environment ...
        "hlo_debug": _start(_PROGRAM, PYTHONHASHSEED="3", XLA_HLO_DEBUG="1"),
        # ... a dump flag does not change compiled code, so it is not.
        "dump": _start(_PROGRAM, PYTHONHASHSEED="4", XLA_FLAGS=flags),
        # R1.5: XLA_NO_SPECIAL_SCALARS=1 makes every scalar device data.
        "no_special": _start(_NO_SPECIAL, XLA_NO_SPECIAL_SCALARS="1"),
    }
    res = {k: _result(p) for k, p in procs.items()}
    first = json_here(_PROGRAM) if here else res["first"]
    assert first == res["second"]
    assert re.fullmatch(r"[0-9a-f]{32}", first["y"])
    assert first["y"] != first["yz"]
    assert res["hlo_debug"]["y"] != first["y"]
    assert res["dump"] == first
    assert res["no_special"]["same_1_2"] is True
    assert res["no_special"]["same_0_m1"] is True
    assert res["no_special"]["values"] == [[1.0, 2.0, 3.0, 4.0], [-0.0, -1.0, -2.0, -3.0], [0.0, 0.0, 0.0, 0.0]]


# ---------------------------------------------------------------------------------------
# R1.3 / R3.3: what changes a tensor's IR hash changes the graph hash.
def test_hash_changes_with_shape():
    a = torch.ones(3, 4, device=DEV)
    b = torch.ones(4, 3, device=DEV)
    c = torch.ones(3, 5, device=DEV)
    hs = {gh(a * 2), gh(b * 2), gh(c * 2)}
    assert len(hs) == 3


def test_hash_changes_with_dtype():
    a = torch.ones(3, 4, device=DEV, dtype=torch.float32)
    b = torch.ones(3, 4, device=DEV, dtype=torch.float64)
    c = torch.ones(3, 4, device=DEV, dtype=torch.int64)
    assert len({gh(a * 2), gh(b * 2), gh(c * 2)}) == 3


def test_hash_changes_with_dtype_of_device_data():
    # Device-data leaves hash their shape and dtype (R1.4).
    _, a32 = dev_data(5, dtype=torch.float32)
    _, a64 = dev_data(5, dtype=torch.float64)
    assert gh(a32.exp()) != gh(a64.exp())


def test_hash_changes_with_op():
    _, x = dev_data(4, 4, seed=1)
    _, y = dev_data(4, 4, seed=2)
    hs = [gh(x + y), gh(x - y), gh(x * y), gh(x / y), gh(torch.maximum(x, y)), gh(x @ y)]
    assert len(set(hs)) == len(hs)
    assert gh(x.exp()) != gh(x.log())
    assert gh(x.sum()) != gh(x.mean())


def test_hash_changes_with_special_constant_op_param():
    _, x = dev_data(4, 4, seed=3)
    assert gh(x + 1) != gh(x - 1)
    # Square input: both reductions have output shape [4]; only the dim differs.
    assert gh(x.sum(0)) != gh(x.sum(1))
    assert gh(x.sum(0)) != gh(x.sum(0, keepdim=True))
    assert gh(x.transpose(0, 1) + 0.5) != gh(x + 0.5)
    assert gh(torch.cumsum(x, 0)) != gh(torch.cumsum(x, 1))


def test_hash_covers_the_whole_dag():
    _, x = dev_data(4, seed=4)
    base = x.exp() + 2
    assert gh(base.sin()) != gh((x.log() + 2).sin())   # differs deep below the root
    assert gh(base.sin()) == gh((x.exp() + 2).sin())


# ---------------------------------------------------------------------------------------
# R1.5: special scalars (0, 1, -1) are hashed by value; other scalars are device data.
def test_non_special_scalar_does_not_change_hash():
    _, x = dev_data(6, seed=5)
    assert gh(x * 0.5) == gh(x * 0.25)
    assert gh(x + 2) == gh(x + 3)
    assert gh(x - 7.5) == gh(x - 1e-3)


def test_special_scalars_change_hash():
    _, x = dev_data(6, seed=6)
    assert gh(x + 1) != gh(x + 0)
    assert gh(x * 1) != gh(x * -1)
    assert gh(x + 1) != gh(x + -1)
    # A special scalar and an ordinary one are different programs too.
    assert gh(x + 1) != gh(x + 2)
    assert gh(x * 0) != gh(x * 0.5)


def test_changing_a_scalar_reuses_the_compiled_program_with_new_value():
    n = fresh()
    host, x = dev_data(n, seed=7)
    y = x * 0.5
    h1 = gh(y)
    u0, c0 = cnt("UncachedCompile"), cnt("CachedCompile")
    lazyxla.sync()
    assert cnt("UncachedCompile") - u0 == 1
    torch.testing.assert_close(y.cpu(), host * 0.5)
    del y
    z = x * 0.25
    assert gh(z) == h1
    u1, c1 = cnt("UncachedCompile"), cnt("CachedCompile")
    lazyxla.sync()
    assert cnt("UncachedCompile") - u1 == 0
    assert cnt("CachedCompile") - c1 == 1
    # The cached program must use the new scalar, not a baked-in 0.5.
    torch.testing.assert_close(z.cpu(), host * 0.25)


def test_two_scalars_that_happen_to_be_equal_do_not_change_the_program():
    """Scalars are cached by value for their role (op and operand): equal values in two roles are
    two parameters, as unequal ones are, so the same program serves both."""
    n = fresh()
    host, x = dev_data(n, seed=8)
    y = x * 0.375 - x.exp() / 0.375
    h1 = gh(y)
    u0 = cnt("UncachedCompile")
    lazyxla.sync()
    torch.testing.assert_close(y.cpu(), host * 0.375 - host.exp() / 0.375)
    z = x * 0.375 - x.exp() / 0.625
    assert gh(z) == h1
    lazyxla.sync()
    assert cnt("UncachedCompile") - u0 == 1
    torch.testing.assert_close(z.cpu(), host * 0.375 - host.exp() / 0.625)


def test_different_hash_means_a_new_compile():
    n = fresh()
    host, x = dev_data(n, seed=8)
    y = x + 1
    lazyxla.sync()
    torch.testing.assert_close(y.cpu(), host + 1)
    del y
    z = x - 1
    u0 = cnt("UncachedCompile")
    lazyxla.sync()
    assert cnt("UncachedCompile") - u0 == 1
    torch.testing.assert_close(z.cpu(), host - 1)


# ---------------------------------------------------------------------------------------
# R1.4 / R3.4: buffers are not hashed; the parameter sequence is.
def test_same_ops_over_different_buffers_same_order_same_hash():
    _, a = dev_data(5, seed=10)
    _, b = dev_data(5, seed=11)
    _, c = dev_data(5, seed=12)
    _, d = dev_data(5, seed=13)
    assert gh(a + b * 3) == gh(c + d * 3)
    assert gh(a * b, a - b) == gh(c * d, c - d)


def test_aliased_inputs_change_the_parameter_sequence():
    # x + x and x + y have the same tensor IR hash (both leaves are f32[5] device data),
    # but the parameter sequence differs ([0, 0] vs [0, 1]), so the keys differ (R3 step 4).
    _, x = dev_data(5, seed=14)
    _, y = dev_data(5, seed=15)
    assert gh(x + x) != gh(x + y)


def test_which_buffer_feeds_which_operand_is_part_of_the_key():
    # (x - y) + x and (x - y) + y: same ops, same leaf shapes, but different programs
    # (2x - y vs x). Their keys must differ and each must give its own numbers (R1.4, R3.4).
    n = fresh()
    hx, x = dev_data(n, seed=24)
    hy, y = dev_data(n, seed=25)
    p = (x - y) + x
    q = (x - y) + y
    assert gh(p) != gh(q)
    lazyxla.sync()
    torch.testing.assert_close(p.cpu(), (hx - hy) + hx)
    torch.testing.assert_close(q.cpu(), (hx - hy) + hy)


def test_which_buffer_feeds_which_operand_separate_syncs():
    # The same pair, each synced alone: the second must not reuse the first one's program.
    n = fresh()
    hx, x = dev_data(n, seed=26)
    hy, y = dev_data(n, seed=27)
    p = (x - y) + x
    lazyxla.sync()
    torch.testing.assert_close(p.cpu(), (hx - hy) + hx)
    del p
    q = (x - y) + y
    lazyxla.sync()
    torch.testing.assert_close(q.cpu(), (hx - hy) + hy)


def test_swapped_inputs_give_correct_numbers():
    # a - b and b - a over two buffers of one shape. Whatever their keys, if the second sync
    # reuses a compiled program it must bind the buffers in the right order.
    n = fresh()
    ha, a = dev_data(n, seed=16)
    hb, b = dev_data(n, seed=17)
    d1 = a - b
    lazyxla.sync()
    torch.testing.assert_close(d1.cpu(), ha - hb)
    d2 = b - a
    lazyxla.sync()
    torch.testing.assert_close(d2.cpu(), hb - ha)
    d3 = torch.div(b, a)
    lazyxla.sync()
    d4 = torch.div(a, b)
    lazyxla.sync()
    torch.testing.assert_close(d3.cpu(), hb / ha)
    torch.testing.assert_close(d4.cpu(), ha / hb)


def test_same_program_over_new_buffers_is_a_cache_hit():
    n = fresh()
    ha, a = dev_data(n, seed=18)
    hb, b = dev_data(n, seed=19)
    y = a * b + a
    lazyxla.sync()
    torch.testing.assert_close(y.cpu(), ha * hb + ha)
    del y
    hc, c = dev_data(n, seed=20)
    hd, d = dev_data(n, seed=21)
    z = c * d + c
    u0, c0 = cnt("UncachedCompile"), cnt("CachedCompile")
    lazyxla.sync()
    assert cnt("UncachedCompile") - u0 == 0
    assert cnt("CachedCompile") - c0 == 1
    torch.testing.assert_close(z.cpu(), hc * hd + hc)


def test_hash_changes_with_number_of_synced_tensors():
    _, x = dev_data(5, seed=22)
    y = x * 3
    z = x + 3
    assert gh(y) != gh(y, z)
    assert gh(y, y) == gh(y)  # duplicates are skipped (R3 step 3)


def test_graph_hash_does_not_compile_or_execute():
    n = fresh()
    _, x = dev_data(n, seed=23)
    y = x.exp() * 2
    before = {k: cnt(k) for k in ("UncachedCompile", "CachedCompile", "ExecuteComputation", "MarkStep")}
    h = gh(y)
    assert {k: cnt(k) for k in before} == before
    # The tensor is still pending: its hash is unchanged and the sync compiles it.
    assert gh(y) == h
    u0 = cnt("UncachedCompile")
    lazyxla.sync()
    assert cnt("UncachedCompile") - u0 == 1
